"""Parsing click-log text with no per-row Python: Criteo's parser (criteo_text.py) with its compiled
kernels (parse_kernel.py) and vectorized field decoding (parse_fields.py); a feature spec resolved
against a file's fields (spec_program.py) and its text parsed by it (spec_parse.py, spec_kernel.py,
spec_values.py; where CSV fields and rows end, csv_scan.py); Parquet files resolved by a spec
(parquet_schema.py) and read a row group at a time into the same parsed form (parquet_rows.py, its
kernels over Arrow's buffers in parquet_kernel.py); the parser a run chooses (text_parser.py). A
spec proposed from a log's first rows is the `infer` package's.

May import: shardrec.tools.preprocess.text, shardrec.tools.preprocess.ids.
"""
