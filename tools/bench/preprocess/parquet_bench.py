"""`shardrec bench preprocess --parquet`: a Parquet click log preprocessed by shardrec against a
polars pipeline doing the same work from the same file, rows per CPU-second.

The file: `synth`'s rows (`--like criteo`: Criteo's label, 13 integers, 26 hex categoricals, with
its empty fields; `movielens` / `avazu`: those shapes, with string categoricals and a list)
converted once to Parquet as a click log would be stored (pyarrow's defaults: snappy, dictionary
pages; integers and floats as numbers, empty values as nulls, a list column as a native list of
strings), row groups of ~128 K rows. Its spec is `spec infer`'s from the Parquet file. In
interleaved rounds of one run (child_runs.py, an untimed warm-up first): `shardrec preprocess
--spec` end to end in a child process, and polars_spec.py's pipeline (`scan_parquet` and
expressions) in a child on one thread and on all, its columns checked against shardrec's (values
and list lengths: the same work). Rates: rows per second and per CPU-second of each process tree
(start-up, reading, writing included); the goal is shardrec at 1.5x polars on one thread, per
CPU-second, or more.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from shardrec.tools.bench.preprocess.child_runs import (
    BASELINES,
    per_cpu_median,
    rate_lines,
    spec_rounds,
)
from shardrec.tools.bench.rounds import goal_text
from shardrec.tools.console import err_console

ROW_GROUP_ROWS = 1 << 17
GOAL = 1.5
_LABEL = {"criteo": "label", "movielens": "rating>=4", "avazu": "click"}


def _text(like: str, size_gb: float, work_dir: Path) -> tuple[Path, Any]:
    """The generated text and the spec that reads it (Criteo's built-in one, or spec infer's)."""
    from shardrec.dataloader.spec.feature_spec import criteo_spec
    from shardrec.dataloader.spec.spec_file import load_spec
    from shardrec.tools.bench.preprocess.preprocess_bench import BYTES_PER_ROW
    from shardrec.tools.bench.preprocess.spec_bench import prepare

    if like != "criteo":
        path, spec = prepare(like, size_gb, work_dir)
        return path, load_spec(spec)
    from shardrec.tools.synth.criteo import write_dataset

    path = work_dir / "criteo" / "train.txt"
    if not path.is_file() or abs(path.stat().st_size - size_gb * 1e9) > 0.2 * size_gb * 1e9:
        shutil.rmtree(path.parent, ignore_errors=True)
        err_console.print(f"generating {size_gb:g} GB of Criteo-shaped TSV ...", highlight=False)
        rows = max(1000, int(size_gb * 1e9 / BYTES_PER_ROW))
        write_dataset(path.parent, rows=rows, seed=0)  # its train.txt
    return path, criteo_spec(header=False)


def to_parquet(text: Path, spec, out: Path) -> Path:
    """The text's rows as a Parquet file typed by the spec that reads them (module doc)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    from shardrec.dataloader.spec.feature_spec import (
        CategoricalColumn,
        DenseColumn,
        LabelColumn,
        ListColumn,
    )

    fmt = spec.format
    names = [c.name for c in spec.columns]
    table = pcsv.read_csv(
        text,
        read_options=pcsv.ReadOptions(column_names=None if fmt.header else names),
        parse_options=pcsv.ParseOptions(
            delimiter=fmt.delimiter, quote_char='"' if fmt.quoting else False
        ),
        convert_options=pcsv.ConvertOptions(
            column_types={n: pa.string() for n in names}, strings_can_be_null=True
        ),
    )
    columns = {}
    for c in spec.columns:
        raw = table.column(c.name)
        if isinstance(c, LabelColumn):
            columns[c.name] = raw.cast(pa.float64() if c.threshold is not None else pa.int64())
        elif isinstance(c, DenseColumn):
            columns[c.name] = raw.cast(pa.int64() if c.type == "int" else pa.float64())
        elif isinstance(c, ListColumn):
            columns[c.name] = pc.split_pattern(raw, c.separator)
        elif isinstance(c, CategoricalColumn) and c.kind == "integer":
            columns[c.name] = raw.cast(pa.int64())
        else:
            columns[c.name] = raw
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), out, row_group_size=ROW_GROUP_ROWS)
    return out


def prepare_parquet(like: str, size_gb: float, work_dir: Path) -> tuple[Path, Path, int, float]:
    """(the Parquet file, its inferred spec, its rows, the MB of the text it holds), made once and
    reused."""
    import pyarrow.parquet as pq

    from shardrec.dataloader.spec.spec_file import spec_to_toml
    from shardrec.tools.preprocess.infer.parquet_infer import infer_parquet_spec

    path, spec_path = work_dir / f"{like}.parquet", work_dir / f"{like}-parquet.toml"
    text, spec = _text(like, size_gb, work_dir)
    if not path.is_file() or path.stat().st_mtime < text.stat().st_mtime:
        err_console.print(f"writing {path} from {text.name} ...", highlight=False)
        to_parquet(text, spec, path)
    inferred, notes, _ = infer_parquet_spec(path, _LABEL[like])
    spec_path.write_text(spec_to_toml(inferred, notes))
    return path, spec_path, pq.ParquetFile(path).metadata.num_rows, text.stat().st_size / 1e6


def run_parquet_bench(
    like: str, size_gb: float, workers: int, work_dir: Path, chunk_mb: float, rounds: int = 3
) -> dict[str, Any]:
    """shardrec's and polars' rows per CPU-second on the same Parquet file, in interleaved rounds
    of the same run (child_runs.py)."""
    path, spec, rows, text_mb = prepare_parquet(like, size_gb, work_dir)
    mb = path.stat().st_size / 1e6  # rates per MB of Parquet; too small or not by its text's MB
    what = f"shardrec preprocess --spec ({like}, Parquet)"
    head = spec_rounds(path, spec, what, mb, workers, work_dir, chunk_mb, rounds, text_mb)
    for name in ("shardrec", *BASELINES):  # the same file: rows scale as its MB
        head[name]["rows_per_cpu_s"] = round(head[name]["mb_per_cpu_s"] * rows / mb)
    ratio = per_cpu_median(head["ratios"]["vs_polars_one_thread"])
    return {
        "like": like,
        "rows": rows,
        **head,
        "goals": {
            f"rows_per_cpu_s_{GOAL}x_polars_one_thread": None if ratio is None else ratio >= GOAL
        },
    }


def print_parquet_report(r: dict[str, Any], console) -> None:
    console.print(
        rate_lines(r, f"Parquet ({r['rows']:,} rows, {r['like']}-shaped, its inferred spec)")
        + "polars columns equal shardrec's (values and list lengths): "
        + ("yes" if r["polars_columns_equal"] else f"NO ({', '.join(r['polars_columns_differ'])})")
        + "\n"
        + "\n".join(
            f"goal {k}: {goal_text(v, r['ratios']['vs_polars_one_thread'])}"
            for k, v in r["goals"].items()
        ),
        highlight=False,
    )
