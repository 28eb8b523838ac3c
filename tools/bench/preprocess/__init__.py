"""`shardrec bench preprocess`: preprocessing speed against a polars pipeline doing the same work
(preprocess_bench.py, the baseline polars_pipeline.py), gzip inputs and workers (gzip_bench.py),
a feature spec's preprocessing against polars (spec_bench.py, its baseline polars_spec.py), and a
Parquet log's against polars reading the same file (parquet_bench.py).

May import: shardrec.tools.bench.rounds (the harness of repeated, interleaved rounds),
shardrec.tools.bench.proctree (measuring a child process tree).
"""
