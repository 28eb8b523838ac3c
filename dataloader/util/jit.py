"""numba's `njit`, or a no-op decorator where numba does not import.

numba is a dependency; the fallback only keeps a broken install usable (slower, the numpy
paths), and the test suite fails without numba (tests/robustness/test_suite_can_fail.py).
The compiled kernels of the loader and of preprocessing both take `njit` from here.
"""

from __future__ import annotations

try:
    from numba import njit

    AVAILABLE = True
except ImportError:
    AVAILABLE = False

    def njit(*args, **kwargs):  # type: ignore[no-redef]
        return lambda f: f
