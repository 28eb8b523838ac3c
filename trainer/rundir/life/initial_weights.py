"""Which generator drew a run's initial table weights, as RUN/initial_weights.json records it.

embeddings.init draws each block on the device of the shard it fills: a run on GPUs draws with
CUDA's generator, which export does not repeat on the CPU. Rank 0 writes the record when a job
drew the weights it trains from (a new run, or one that had no checkpoint yet), never when a
checkpoint's replaced them, so a run resumed on another device kind keeps its first start's.
Export reads it to tell, per model file, whether a table whose every row changed trained whole
(the CPU's draws) or cannot be told (another device's).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from shardrec.dataloader.util.files import atomic_write_bytes
from shardrec.trainer.rundir import names


@dataclass(frozen=True)
class InitialWeights:
    """The draws a run's tables started from."""

    device: str
    """The device kind whose generator drew them: "cpu" or "cuda"."""
    seed: int
    """The seed embeddings.init drew them with (the run's train.seed)."""
    torch: str = ""
    """The torch release that drew them ("": not recorded): another's CPU draws may differ."""


def record_initial_weights(run_dir: Path, drawn: InitialWeights) -> None:
    """Write RUN/initial_weights.json (rank 0, once the job's tables hold their draws)."""
    text = json.dumps(asdict(drawn), sort_keys=True) + "\n"
    atomic_write_bytes(Path(run_dir) / names.INITIAL_WEIGHTS, text.encode())


def read_initial_weights(run_dir: Path) -> InitialWeights | None:
    """The run's record; None for a run started before runs kept one. ValueError (one line) for a
    file that is no such record."""
    path = Path(run_dir) / names.INITIAL_WEIGHTS
    try:
        raw = json.loads(path.read_text())
        return InitialWeights(str(raw["device"]), int(raw["seed"]), str(raw.get("torch", "")))
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as e:
        raise ValueError(
            f"{path}: not a record of the run's initial weights ({type(e).__name__}: {e}); "
            "delete it to export as runs before it did (predict then tells less)"
        ) from None
