"""Spec inference: a proposed feature spec from a log's first rows (spec_infer.py) or a Parquet
schema (parquet_infer.py) by the same column rules (column_infer.py), each categorical's hash
size checked against the values its sample saw with preprocess's own id formula
(spec_hash_fit.py).

May import: shardrec.tools.preprocess.text, shardrec.tools.preprocess.ids,
shardrec.tools.preprocess.parse.
"""
