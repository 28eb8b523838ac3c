"""A compiled kernel cached on disk is compiled anew when a file it inlines from changes, not only
its own (dataloader/util/jit.py): a checkout updated by `git pull` runs the new rules."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HELPER = "from shardrec.dataloader.util.jit import njit\n\n\n@njit(cache=True)\ndef rule():\n    return {}\n"
KERNEL = (
    "from helper import rule\n\nfrom shardrec.dataloader.util.jit import njit\n\n\n"
    "@njit(cache=True)\ndef kernel():\n    return rule() + 1\n"
)


def _run(folder: Path, covered: bool) -> int:
    """kernel() in a process of its own (numba caches in memory too), its folder covered by the
    package's stamp or not."""
    roots = [str(folder)] if covered else []
    code = (
        f"import sys, pathlib; sys.path.insert(0, {str(folder)!r})\n"
        "from shardrec.dataloader.util import jit\n"
        f"jit.SOURCE_ROOTS[:] = [pathlib.Path(p) for p in {roots!r}]\n"
        "import kernel; print(kernel.kernel())"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(done.stdout)


def test_a_kernel_is_compiled_anew_when_a_file_it_calls_into_changes(tmp_path: Path) -> None:
    for covered, folder in ((True, tmp_path / "ours"), (False, tmp_path / "other")):
        folder.mkdir()
        (folder / "helper.py").write_text(HELPER.format(10))
        (folder / "kernel.py").write_text(KERNEL)
        assert _run(folder, covered) == 11  # compiled, and cached beside the files
        assert list((folder / "__pycache__").glob("kernel.kernel-*.nbi"))
        (folder / "helper.py").write_text(HELPER.format(200))  # kernel.py itself unchanged
        # numba's own stamp is the kernel's file alone: outside the package the cached machine
        # code of the old rule still runs; the package's kernels are compiled anew.
        assert _run(folder, covered) == (201 if covered else 11), folder.name
