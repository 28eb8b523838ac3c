"""The step a checkpoint folder holds, read from its train_state.pt without torch and without
running anything the file names: `shardrec runs` and the checks before any rank starts tell by it
a folder copied or moved under another step's name."""

from __future__ import annotations

import io
import pickle
import zipfile
from pathlib import Path
from typing import Any

from shardrec.trainer.rundir import names


class _Opaque:
    """What `held_step` reads for every object a checkpoint's pickle names a class of: nothing
    of the class is imported or run."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        pass

    def __setitem__(self, key: Any, value: Any) -> None:
        pass

    def append(self, value: Any) -> None:
        pass

    def extend(self, values: Any) -> None:
        pass


class _Containers(pickle.Unpickler):
    """A pickle's dicts, lists and numbers; every class and tensor storage it names a stand-in."""

    def find_class(self, module: str, name: str) -> Any:
        return _Opaque

    def persistent_load(self, pid: Any) -> None:
        return None


def held_step(checkpoint: Path) -> int | None:
    """The step the checkpoint folder's train_state.pt holds (None: it cannot be read), read
    torch-free from the containers of its pickle: no class it names is run, so a file another
    user wrote is read safely."""
    try:
        with zipfile.ZipFile(checkpoint / names.TRAIN_STATE) as archive:
            pickled = next(n for n in archive.namelist() if n.endswith("/data.pkl"))
            state = _Containers(io.BytesIO(archive.read(pickled))).load()
        return int(state["progress"]["step"])
    # A damaged or foreign file fails in any of pickle's ways: the step is then not known.
    except Exception:
        return None
