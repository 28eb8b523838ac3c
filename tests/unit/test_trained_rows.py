"""Which table rows trained: export compares each table with its initial weights drawn again
(embeddings.init.rows_at_initial_values), whatever optimizer changed them; predict counts the
lookups of rows that never trained and, asked to, scores them as a missing value
(trainer.inference.trained_rows)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torchrec.datasets.utils import Batch
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from shardrec.embeddings.init import (
    INIT_BLOCK_ROWS,
    _fill_rows,
    init_embedding_weights,
    rows_at_initial_values,
)
from shardrec.embeddings.optim import TORCH_OPTIMIZERS, optimizer_kwargs
from shardrec.embeddings.tables import build_ebc
from shardrec.trainer.inference.trained_rows import (
    DRAWN_ON_KEY,
    TRAINED_PREFIX,
    trained_bits,
    trained_rows,
    untrained_lines,
)


def _table(rows: int, name: str = "t_a", dim: int = 4) -> EmbeddingBagConfig:
    return EmbeddingBagConfig(
        name=name, embedding_dim=dim, num_embeddings=rows, feature_names=[name[2:]]
    )


@pytest.mark.parametrize("optimizer", sorted(TORCH_OPTIMIZERS))
def test_rows_a_step_looked_up_differ_from_their_initial_weights_and_no_other(
    optimizer: str,
) -> None:
    # Two blocks of draws: the rows of the second are compared with their own block's.
    tables = [_table(7), _table(INIT_BLOCK_ROWS + 20, "t_b")]
    ebc = build_ebc(tables, "cpu")
    init_embedding_weights(ebc, tables, seed=5, ebc_path="")
    weights = [ebc.embedding_bags[t.name].weight for t in tables]
    step = TORCH_OPTIMIZERS[optimizer](weights, **optimizer_kwargs(optimizer, 0.1, 1e-8))
    looked_up = {"a": [2, 5], "b": [3, INIT_BLOCK_ROWS + 11]}
    features = KeyedJaggedTensor.from_lengths_sync(
        keys=["a", "b"],
        values=torch.tensor(looked_up["a"] + looked_up["b"]),
        lengths=torch.tensor([1, 1, 1, 1], dtype=torch.int32),
    )
    ebc(features).values().sum().backward()
    step.step()
    for index, (table, feature) in enumerate(zip(tables, "ab")):
        at_init = rows_at_initial_values(weights[index].detach(), index, table, seed=5)
        assert torch.nonzero(~at_init).flatten().tolist() == looked_up[feature], optimizer


def test_a_table_drawn_by_another_generator_has_no_row_at_the_initial_weights() -> None:
    # Another seed stands for a GPU's draws, which export cannot repeat: no row is said to be
    # untrained (predict then says it cannot tell).
    tables = [_table(50)]
    ebc = build_ebc(tables, "cpu")
    init_embedding_weights(ebc, tables, seed=1, ebc_path="")
    weight = ebc.embedding_bags["t_a"].weight.detach()
    assert rows_at_initial_values(weight, 0, tables[0], seed=1).all()
    assert not rows_at_initial_values(weight, 0, tables[0], seed=2).any()
    # A table kept in half precision: init cast its draws, and so does the comparison.
    assert rows_at_initial_values(weight.half(), 0, tables[0], seed=1).all()


def _model(missing_id: int | None = 0, oov_id: int | None = None) -> tuple[dict, dict]:
    """A header of two tables (a one-hot feature `a` of 16 rows, a list feature `b` of 8) and
    its trained-row bits: rows 3 and 5 of `a` and row 6 of `b` never trained."""
    header = {
        "tables": [
            {"name": "t_a", "features": ["a"], "rows": 16, "dim": 2},
            {"name": "t_b", "features": ["b"], "rows": 8, "dim": 2},
        ],
        "multi_hot": ["b"],
        "transform": {"missing_id": missing_id, "oov_id": oov_id},
        "trained_rows": ["t_a", "t_b"],
    }
    changed = {"t_a": np.ones(16, bool), "t_b": np.ones(8, bool)}
    changed["t_a"][[3, 5]] = False
    changed["t_b"][6] = False
    tensors = {
        TRAINED_PREFIX + name: torch.from_numpy(np.packbits(c, bitorder="little"))
        for name, c in changed.items()
    }
    return header, tensors


def _batch() -> Batch:
    """Three rows, the last a padding row (label -1): a = 3, 4, 5; b = [6, 1], [], [6]."""
    sparse = KeyedJaggedTensor.from_lengths_sync(
        keys=["a", "b"],
        values=torch.tensor([3, 4, 5, 6, 1, 6]),
        lengths=torch.tensor([1, 1, 1, 2, 0, 1], dtype=torch.int32),
    )
    return Batch(torch.zeros(3, 1), sparse, torch.tensor([1, 0, -1]))


def test_predict_counts_the_real_rows_lookups_of_rows_that_never_trained() -> None:
    header, tensors = _model()
    trained = trained_rows(header, tensors, "m.safetensors")
    assert not tensors  # the bits are no weights of the model
    batch = _batch()
    assert trained.look(batch) is batch  # scored as they are
    assert trained.summary() == {
        "t_a": {"lookups": 2, "untrained": 1},
        "t_b": {"lookups": 2, "untrained": 1},
    }
    assert untrained_lines(trained, "m.safetensors") == [
        "2 of 4 lookups fell on rows that never trained (at their initial random weights), in 2 "
        "of 2 tables; scored with those weights (--untrained-as-missing scores them as missing "
        "values):",
        "  t_a: 1 of 2 (50.0%)",
        "  t_b: 1 of 2 (50.0%)",
    ]


def _as_missing(missing_id: int | None, oov_id: int | None) -> dict[str, list[list[int]]]:
    header, tensors = _model(missing_id, oov_id)
    trained = trained_rows(header, tensors, "m.safetensors")
    trained.as_missing = True
    sparse = trained.look(_batch()).sparse_features
    return {key: [row.tolist() for row in sparse[key].to_dense()] for key in sparse.keys()}


def test_untrained_ids_score_as_the_missing_value_preprocessing_gives() -> None:
    # Hashing mode: an empty field's row for one id a row, a list's value left out.
    assert _as_missing(0, None) == {"a": [[0], [4], [0]], "b": [[1], [], []]}
    # Vocabulary mode: the out-of-vocabulary row, in lists too.
    assert _as_missing(0, 1) == {"a": [[1], [4], [1]], "b": [[1, 1], [], [1]]}
    # Data without a missing value's row (imported arrays): left out.
    assert _as_missing(None, None) == {"a": [[], [4], []], "b": [[1], [], []]}


def test_untrained_ids_scored_on_a_missing_row_that_never_trained_either_are_named() -> None:
    # Before: "scored as their feature's missing value" and not a word that t_a's missing value
    # (row 0: no training row left `a` empty, as for half of Criteo's features) never trained:
    # its ids still scored with initial random weights.
    header, tensors = _model()
    bits = np.unpackbits(tensors[TRAINED_PREFIX + "t_a"].numpy(), bitorder="little")
    bits[0] = 0
    tensors[TRAINED_PREFIX + "t_a"] = torch.from_numpy(np.packbits(bits, bitorder="little"))
    trained = trained_rows(header, tensors, "m.safetensors")
    trained.as_missing = True
    trained.look(_batch())
    assert trained.summary() == {
        "t_a": {"lookups": 2, "untrained": 1, "still_untrained": 1},
        "t_b": {"lookups": 2, "untrained": 1, "still_untrained": 0},  # a list's id: left out
    }
    assert untrained_lines(trained, "m.safetensors")[1:] == [
        "  t_a: 1 of 2 (50.0%)",
        "  t_b: 1 of 2 (50.0%)",
        "1 of them still scored with initial random weights (t_a): their feature's missing value "
        "never occurred in training, so its row never trained either",
    ]


def test_an_untrained_id_of_a_sequence_leaves_with_its_events_sides() -> None:
    # Before: the history lost its untrained id and its times kept theirs, and the sequence
    # model (a click log's HSTU) ended in "RuntimeError: The size of tensor a (551) must match the
    # size of tensor b (561)": a side holds one value per event of its sequence.
    header = {
        "tables": [{"name": "t_h", "features": ["c", "h"], "rows": 8, "dim": 2}],
        "multi_hot": ["h", "t"],
        "sparse_features": [
            {"name": "c", "table": "h"},
            {"name": "h", "sequence": True},
            {"name": "t", "sequence": True, "side_of": "h", "values": "timestamps"},
        ],
        "transform": {"missing_id": 0, "oov_id": None},
        "trained_rows": ["t_h"],
    }
    changed = np.ones(8, bool)
    changed[6] = False
    bits = torch.from_numpy(np.packbits(changed, bitorder="little"))
    trained = trained_rows(header, {TRAINED_PREFIX + "t_h": bits}, "m.safetensors")
    trained.as_missing = True
    sparse = KeyedJaggedTensor.from_lengths_sync(
        keys=["c", "h", "t"],
        values=torch.tensor([6, 2, 6, 1, 2, 6, 10, 11, 12, 13]),
        lengths=torch.tensor([1, 1, 2, 2, 2, 2], dtype=torch.int32),
    )
    scored = trained.look(Batch(torch.zeros(2, 1), sparse, torch.tensor([1, 0]))).sparse_features
    assert {key: [row.tolist() for row in scored[key].to_dense()] for key in scored.keys()} == {
        "c": [[0], [2]],  # the candidate, one id a row: the missing value's row
        "h": [[1], [2]],
        "t": [[11], [12]],
    }


def test_a_table_whose_every_row_changed_trained_whole_where_another_tells_the_draws() -> None:
    # A run draws every table on one device kind: t_a's rows at export's draw say t_b's were the
    # CPU's too, so t_b trained every row (before: "can't tell which lookups of t_b ...").
    header, tensors = _model()
    tensors[TRAINED_PREFIX + "t_b"] = torch.full((1,), 255, dtype=torch.uint8)
    trained = trained_rows(header, tensors, "m.safetensors")
    trained.look(_batch())
    assert trained.summary() == {
        "t_a": {"lookups": 2, "untrained": 1},
        "t_b": {"lookups": 2, "untrained": 0},
    }
    assert untrained_lines(trained, "m.safetensors") == [
        "1 of 4 lookups fell on rows that never trained (at their initial random weights), in 1 "
        "of 2 tables; scored with those weights (--untrained-as-missing scores them as missing "
        "values):",
        "  t_a: 1 of 2 (50.0%)",
    ]


def test_tables_whose_every_row_changed_cannot_tell_and_an_old_file_says_so() -> None:
    header, tensors = _model()
    tensors[TRAINED_PREFIX + "t_a"] = torch.full((2,), 255, dtype=torch.uint8)
    tensors[TRAINED_PREFIX + "t_b"] = torch.full((1,), 255, dtype=torch.uint8)
    trained = trained_rows(header, tensors, "m.safetensors")
    trained.look(_batch())
    assert trained.summary()["t_b"] == {"lookups": 2, "untrained": None}
    assert untrained_lines(trained, "m.safetensors") == [
        "can't tell which lookups of t_a, t_b fell on rows that never trained: none of their rows "
        "is at its initial weights (every row trained, or the run drew them on a GPU, whose draws "
        "export does not repeat)"
    ]
    del header["trained_rows"]
    assert trained_rows(header, {}, "m.safetensors") is None
    assert untrained_lines(None, "m.safetensors") == [
        "m.safetensors: exported before model files recorded which rows trained: can't tell "
        "whether lookups fell on rows that never trained (export the run again to know)"
    ]


def test_the_runs_record_of_the_drawing_device_decides_which_tables_predict_can_tell() -> None:
    # Before: a CPU run whose every row trained said "can't tell ... (every row trained, or the
    # run drew them on a GPU ...)", and a GPU run's file said the same, never which.
    header, tensors = _model()
    for name in ("t_a", "t_b"):
        tensors[TRAINED_PREFIX + name] = torch.full_like(tensors[TRAINED_PREFIX + name], 255)
    trained = trained_rows({**header, DRAWN_ON_KEY: "cpu"}, dict(tensors), "m.safetensors")
    trained.look(_batch())
    assert trained.summary() == {
        "t_a": {"lookups": 2, "untrained": 0},
        "t_b": {"lookups": 2, "untrained": 0},
    }
    assert untrained_lines(trained, "m.safetensors") == []
    # Drawn on a GPU: no table is told, even one with rows at the CPU's draws, and the line says why.
    header, tensors = _model()
    trained = trained_rows({**header, DRAWN_ON_KEY: "cuda"}, tensors, "m.safetensors")
    trained.look(_batch())
    assert trained.summary()["t_a"] == {"lookups": 2, "untrained": None}
    assert untrained_lines(trained, "m.safetensors") == [
        "can't tell which lookups of t_a, t_b fell on rows that never trained: the run drew their "
        "initial weights on cuda, whose draws export does not repeat on the CPU"
    ]


def test_bits_for_the_file_mark_the_changed_rows() -> None:
    table = _table(10)
    weight = torch.empty(10, 4)
    _fill_rows(weight, 0, 0, 0, table, seed=0)
    weight[[1, 9]] += 1
    bits = trained_bits(weight, 0, {"name": "t_a", "features": ["a"], "rows": 10, "dim": 4}, 0)
    changed = np.unpackbits(bits.numpy(), count=10, bitorder="little")
    assert np.flatnonzero(changed).tolist() == [1, 9]
