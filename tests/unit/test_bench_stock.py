"""The stock-torchrec baseline of `shardrec bench train` runs no shardrec code but its timing
harness."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parents[2] / "tools"
STOCK = TOOLS / "bench" / "train" / "stock_torchrec.py"
# The harness pieces the baseline may use: the timer, and the (import-free) packages around it.
ALLOWED = {"shardrec.tools.bench.train.timing"}
PACKAGES = {"shardrec", "shardrec.tools", "shardrec.tools.bench"}


def _imports(path: Path) -> set[str]:
    """Every module a file imports, at any depth (imports inside functions too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path.name}: relative import"
            found.add(node.module or "")
            # `from shardrec.tools.bench import train` imports the module train, not a name.
            found.update(
                f"{node.module}.{alias.name}" for alias in node.names if node.module in PACKAGES
            )
    return found


def _source(module: str) -> Path:
    parts = module.split(".")[
        1:
    ]  # shardrec.tools.bench.train.timing -> tools/bench/train/timing.py
    path = TOOLS.parent.joinpath(*parts)
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def _shardrec_imports(path: Path) -> set[str]:
    return {m for m in _imports(path) if m == "shardrec" or m.startswith("shardrec.")}


def test_stock_baseline_imports_only_the_timing_harness() -> None:
    direct = _shardrec_imports(STOCK) - PACKAGES
    assert direct == ALLOWED, (
        f"stock_torchrec.py imports shardrec modules {sorted(direct - ALLOWED)}"
    )
    # Transitively too: the allowed harness and the package __init__s import no shardrec module.
    for module in ALLOWED | PACKAGES - {"shardrec"}:
        leaked = _shardrec_imports(_source(module)) - PACKAGES
        assert not leaked, f"{module} (imported by the stock baseline) imports {sorted(leaked)}"


def test_stock_baseline_trains_with_torchrecs_own_pieces() -> None:
    imported = _imports(STOCK)
    names = {
        alias.name
        for node in ast.walk(ast.parse(STOCK.read_text()))
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
        if (node.module or "").startswith("torchrec")
    }
    assert {
        "DLRM",
        "DLRM_DCN",
        "DLRMTrain",
        "EmbeddingBagCollectionSharder",
        "EmbeddingShardingPlanner",
        "TrainPipelineSparseDist",
        "KeyedOptimizerWrapper",
        "DistributedModelParallel",
    } <= names
    assert "torchrec.models.dlrm" in imported


def test_the_import_check_catches_a_shardrec_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from shardrec.trainer.model.models import build_model\n")
    assert _shardrec_imports(bad) == {"shardrec.trainer.model.models"}


def test_stock_baseline_refuses_fused_adam_on_cpu() -> None:
    from shardrec.tools.bench.train.stock_torchrec import StockModel, StockOptim, StockTrainer

    spec = StockModel("dlrm", 13, (("C1", 10),), 16, (16,), (8, 1))
    with pytest.raises(ValueError, match="sparse optimizer 'adam': torchrec's fused CPU kernel"):
        StockTrainer(spec, StockOptim("adam", 0.1, "adagrad", 0.1), 8, 1)


class _Moved:
    """A batch that records where it was moved."""

    def __init__(self, device: str = "cpu") -> None:
        self.device = device

    def to(self, device, non_blocking: bool = False) -> _Moved:
        return _Moved(str(device))


def test_stock_predict_moves_each_batch_to_the_models_device() -> None:
    """Its training batches reach the device through TrainPipelineSparseDist; predict calls the
    model directly, whose DDP wrapper does not move a Batch: on CUDA it must move them itself."""
    import torch

    from shardrec.tools.bench.train.stock_torchrec import StockTrainer

    seen = []

    class Model(torch.nn.Module):
        def forward(self, batch: _Moved):
            seen.append(batch.device)
            return None, (None, torch.zeros(2), torch.ones(2))

    class Pipeline:
        def detach(self) -> None:
            pass

    trainer = object.__new__(StockTrainer)  # the loop only: no process group or planner needed
    trainer.model, trainer.pipeline, trainer.device = Model(), Pipeline(), torch.device("cuda", 1)
    logits, labels = trainer.predict(iter([_Moved(), _Moved()]))
    assert seen == ["cuda:1", "cuda:1"] and logits.shape == labels.shape == (4,)
