"""`shardrec bench preprocess`: preprocessing speed against a polars pipeline doing the same work
(preprocess_bench.py, the baseline polars_pipeline.py), gzip inputs and workers (gzip_bench.py),
and a feature spec's preprocessing against polars (spec_bench.py, its baseline polars_spec.py).

May import: shardrec.tools.bench.proctree.
"""
