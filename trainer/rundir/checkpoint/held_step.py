"""The step a checkpoint folder holds, read from its train_state.pt without torch and without
running anything the file names: `shardrec runs` and the checks before any rank starts tell by it
a folder copied or moved under another step's name. The same torch-free reading of a checkpoint's
pickles tells, before any rank starts, one that cannot be read (`readable`)."""

from __future__ import annotations

import io
import pickle
import zipfile
from pathlib import Path
from typing import Any

from shardrec.trainer.rundir import names


class _Opaque:
    """What `held_step` reads for every object a checkpoint's pickle names a class of: nothing
    of the class is imported or run; its pickled state (a dataclass's fields) is kept as it is."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.state: Any = None

    def __setstate__(self, state: Any) -> None:
        self.state = state

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


def pickled_containers(data: bytes) -> Any:
    """The dicts, lists and numbers of the pickle `data`, every object of a class a stand-in
    holding its pickled state (`.state`); raises what pickle raises for data cut short or
    corrupt."""
    return _Containers(io.BytesIO(data)).load()


def torch_file_containers(path: Path) -> Any:
    """pickled_containers of the torch.save file (a zip holding data.pkl) at `path`; raises what
    zipfile or pickle raise for a file cut short or corrupt."""
    with zipfile.ZipFile(path) as archive:
        pickled = next((n for n in archive.namelist() if n.endswith("/data.pkl")), None)
        if pickled is None:
            raise zipfile.BadZipFile("holds no data.pkl: not a file torch.save wrote")
        return pickled_containers(archive.read(pickled))


def held_run_id(checkpoint: Path) -> str | None:
    """The id of the run that saved the checkpoint folder (its train_state.pt's signature; None:
    saved before run ids, or it cannot be read), read as held_step reads the step."""
    try:
        run = torch_file_containers(checkpoint / names.TRAIN_STATE)["signature"].get("run")
        return run if isinstance(run, str) else None
    except Exception:
        return None


def held_step(checkpoint: Path) -> int | None:
    """The step the checkpoint folder's train_state.pt holds (None: it cannot be read), read
    torch-free from the containers of its pickle: no class it names is run, so a file another
    user wrote is read safely."""
    try:
        state = torch_file_containers(checkpoint / names.TRAIN_STATE)
        return int(state["progress"]["step"])
    # A damaged or foreign file fails in any of pickle's ways: the step is then not known.
    except Exception:
        return None
