"""numba's `njit`, or a no-op decorator where numba does not import.

numba is a dependency; the fallback only keeps a broken install usable (slower, the numpy
paths), and the test suite fails without numba (tests/robustness/test_suite_can_fail.py).
The compiled kernels of the loader and of preprocessing both take `njit` from here.

Compiled kernels are cached on disk (`cache=True`), and numba keys a kernel's cache on its own
file alone: a kernel that calls (and inlines) a function of another file, or reads a constant
from one, kept the machine code of the old version of that file after it changed. A checkout
updated with `git pull`, which rewrites only the files that changed, went on parsing by the old
rules without a word. Here a kernel of this package is cached under a stamp of every source file
of the package (SOURCE_ROOTS: names, sizes and modification times), so any change to them compiles
the kernels anew on their first use; other code's kernels keep numba's own stamp.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

try:
    from numba import njit

    AVAILABLE = True
except ImportError:
    AVAILABLE = False

    def njit(*args, **kwargs):  # type: ignore[no-redef]
        return lambda f: f


_PACKAGE = Path(__file__).resolve().parents[2]
SOURCE_ROOTS = [
    _PACKAGE / name for name in ("dataloader", "embeddings", "sharding", "trainer", "tools")
]
"""The folders whose Python files a kernel's cache stamp covers: the package's code folders."""


@functools.cache
def sources_stamp(roots: tuple[Path, ...]) -> bytes:
    """SHA-256 of the (path, size, modification time) of every .py file under `roots`, once per
    process (a kernel compiled in it reads the files as they were when it started)."""
    h = hashlib.sha256()
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            st = path.stat()
            h.update(f"{path.relative_to(root.parent)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.digest()


def _ours(py_file: str) -> bool:
    path = Path(py_file).resolve()
    return any(path.is_relative_to(root) for root in SOURCE_ROOTS)


if AVAILABLE:
    from numba.core import caching, config

    class _PackageStamp:
        """A locator whose stamp is numba's (its own file's) and the package's sources_stamp;
        None (the next locator) for a function outside the package."""

        @classmethod
        def from_function(cls, py_func, py_file):
            return super().from_function(py_func, py_file) if _ours(py_file) else None

        def get_source_stamp(self):
            return super().get_source_stamp(), sources_stamp(tuple(SOURCE_ROOTS))

    class UserProvided(_PackageStamp, caching.UserProvidedCacheLocator):
        pass

    class InTree(_PackageStamp, caching.InTreeCacheLocator):
        pass

    class UserWide(_PackageStamp, caching.UserWideCacheLocator):
        pass

    if not config.CACHE_LOCATOR_CLASSES:  # a user's own NUMBA_CACHE_LOCATOR_CLASSES stays
        ours = [f"{__name__}.{c.__name__}" for c in (UserProvided, InTree, UserWide)]
        numba_own = [c.__name__ for c in caching.CacheImpl._locator_classes]
        config.CACHE_LOCATOR_CLASSES = ",".join(ours + numba_own)
