"""`shardrec bench preprocess --like movielens|avazu`: a feature spec's preprocessing against
polars.

On one generated file (synth --like: MovieLens-1M joined, with string categoricals, quoted titles
and a genre list; or Avazu's 24 columns), with the spec `spec infer` proposes for it, in the same
run: `shardrec preprocess --spec` end to end in a child process, then the polars pipeline of
polars_spec.py in a child on one thread and on all, its columns checked against shardrec's (values
and list lengths: the two did the same work). Rates are MB of text per second and per CPU-second
(CPU time of the whole process tree); the goal is shardrec at 2x polars or more per CPU-second.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shardrec.tools.bench.preprocess.child_runs import (
    per_cpu_median,
    rate_lines,
    spec_rounds,
)
from shardrec.tools.bench.rounds import goal_text
from shardrec.tools.console import err_console

BYTES_PER_ROW = {
    "movielens": 68,
    "avazu": 150,
}  # synth --like's rows, measured; only sizes the file
_LABEL = {"movielens": "rating>=4", "avazu": "click"}


def prepare(like: str, size_gb: float, work_dir: Path) -> tuple[Path, Path]:
    """The generated log (reused when it is there at about the size) and its inferred spec."""
    from shardrec.dataloader.spec.spec_file import spec_to_toml
    from shardrec.tools.preprocess.infer.spec_infer import infer_spec
    from shardrec.tools.synth.avazu_movielens import write_like

    path, spec_path = work_dir / f"{like}.csv", work_dir / f"{like}.toml"
    if not path.is_file() or abs(path.stat().st_size - size_gb * 1e9) > 0.2 * size_gb * 1e9:
        err_console.print(
            f"generating {size_gb:g} GB of {like}-shaped CSV in {path} ...", highlight=False
        )
        write_like(path, like, max(1000, int(size_gb * 1e9 / BYTES_PER_ROW[like])), seed=0)
    spec, notes, _ = infer_spec(path, _LABEL[like])
    spec_path.write_text(spec_to_toml(spec, notes))
    return path, spec_path


def run_like_bench(
    like: str, size_gb: float, workers: int, work_dir: Path, chunk_mb: float, rounds: int = 3
) -> dict[str, Any]:
    path, spec = prepare(like, size_gb, work_dir)
    mb = path.stat().st_size / 1e6
    what = f"shardrec preprocess --spec ({like})"
    head = spec_rounds(path, spec, what, mb, workers, work_dir, chunk_mb, rounds)
    ratio = per_cpu_median(head["ratios"]["vs_polars_one_thread"])
    return {
        "like": like,
        **head,
        "goals": {"end_to_end_2x_polars_per_cpu_s": None if ratio is None else ratio >= 2},
    }


def print_like_report(r: dict[str, Any], console) -> None:
    console.print(
        rate_lines(r, f"{r['like']}-shaped CSV, its inferred spec")
        + "polars columns equal shardrec's (values and list lengths): "
        + ("yes" if r["polars_columns_equal"] else f"NO ({', '.join(r['polars_columns_differ'])})")
        + "\n"
        + "\n".join(
            f"goal {k}: {goal_text(v, r['ratios']['vs_polars_one_thread'])}"
            for k, v in r["goals"].items()
        ),
        highlight=False,
    )
