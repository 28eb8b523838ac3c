"""`spec infer` on a CSV proposes the same role (and a dense column the same type) for a column
whether or not some of its fields are empty. pandas writes an integer column that has nulls as
floats (`15.0`): judged as written, a count was proposed `type = "float"` where it had empty
fields and `"int"` where it had none, 4-digit codes a dense float against a categorical, Unix
times a dense float against a column left out."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from helpers import cli

from shardrec.dataloader.spec.feature_spec import CategoricalColumn, DenseColumn
from shardrec.dataloader.spec.spec_file import load_spec


def _shape(spec: Path) -> dict[str, tuple]:
    """Each column's role, and a dense column's type."""
    return {
        c.name: (c.role, c.type if isinstance(c, DenseColumn) else None)
        for c in load_spec(spec).columns
    }


def test_empty_fields_do_not_change_a_columns_proposed_role_or_type(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    rows = 400
    log = pd.DataFrame({
        "click": rng.integers(0, 2, rows),
        "views": rng.integers(0, 1000, rows),
        "delta": rng.integers(-5, 5, rows),
        "score": rng.random(rows).round(3),
        "site": rng.integers(1000, 1100, rows),
        "event_time": rng.integers(1_700_000_000, 1_700_900_000, rows),
    })  # fmt: skip
    log.to_csv(tmp_path / "full.csv", index=False)
    for name in ("views", "delta", "score", "site", "event_time"):
        log[name] = log[name].astype(float)
        log.loc[::7, name] = np.nan
    log.to_csv(tmp_path / "nulls.csv", index=False)
    assert ",1001.0," in (tmp_path / "nulls.csv").read_text().replace("\n", ",")
    shapes = {}
    for name in ("full", "nulls"):
        spec = tmp_path / f"{name}.toml"
        cli("spec", "infer", tmp_path / f"{name}.csv", "--label", "click", "--out", spec)
        shapes[name] = _shape(spec)
    assert shapes["nulls"] == shapes["full"]
    assert shapes["full"]["views"] == ("dense", "int")
    assert shapes["full"]["site"] == ("categorical", None)
    assert shapes["full"]["event_time"] == ("ignore", None)
    # The codes written 1001.0 are read as the integers they are, as a file without nulls'
    # comment proposes (kind = "string" would hash `1001.0` apart from `1001`).
    site = next(c for c in load_spec(tmp_path / "nulls.toml").columns if c.name == "site")
    assert isinstance(site, CategoricalColumn) and site.kind == "integer"
