"""`shardrec bench ...`: benchmarks that print ratios against a baseline measured in the same run."""

from __future__ import annotations

import typer

from shardrec.tools.bench import loader as bench_loader
from shardrec.tools.bench import plan as bench_plan
from shardrec.tools.bench import preprocess as bench_preprocess
from shardrec.tools.bench import scale as bench_scale
from shardrec.tools.bench import train as bench_train

bench_app = typer.Typer(
    help="Benchmarks; each but `scale` prints its ratio against a baseline measured in the same run.",
    no_args_is_help=True,
)


def register(app: typer.Typer) -> None:
    bench_loader.register(bench_app)
    bench_preprocess.register(bench_app)
    bench_plan.register(bench_app)
    bench_train.register(bench_app)
    bench_scale.register(bench_app)
    app.add_typer(bench_app, name="bench")
