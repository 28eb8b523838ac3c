"""A part under construction: its columns filled in place from parsed text (part_columns.py), how a
run's parts hold their columns and take a piece's rows (part_layout.py), a spec's dense columns
written by their transforms (dense_table.py), the compiled kernels that hash ids into a part's
columns, look up dense values and count ids (column_kernels.py), a Parquet row group's ids made once
per distinct value of its dictionary columns (dictionary_ids.py), and the per-feature statistics the
planner reads, counted on the training split (feature_stats.py).

May import: shardrec.tools.preprocess.cpu_stages, shardrec.tools.preprocess.text,
shardrec.tools.preprocess.ids, shardrec.tools.preprocess.parse.
"""
