"""Preprocessing: raw click logs -> a shardrec dataset, in subpackages by concept, each importing
only those before it in this order: `text` (input text, plain or gzip, and its lines), `ids`
(hashing and vocabularies), `parse` (Criteo's parser, feature-spec parsing), `infer` (a spec
proposed from a log's first rows or a Parquet schema), `parts` (a part's columns under
construction, dense transforms, statistics), `tasks` (a task from its text to its parts, its
malformed rows, its marker), `derived` (datasets made from datasets: torchrec's `.npy` layout,
multi-hot copies, the MLPerf reference's arrays, the old layout upgraded) and `events` (event logs
-> event-log datasets, apart from the text pipeline).

At the top: the run's settings and their record in the output (settings.py), input discovery and
byte-range tasks (inputs.py), the worker pool (pool.py), one large .gz decoded once while its tasks'
text is handed out (gz_stream.py), vocabulary mode's counting pass (vocab_count.py), what a run kept
(kept_rows.py: the checks before its manifest, skipped shares and empty splits; the manifest; the
run's summary), the whole run (pipeline.py), where its CPU goes (cpu_stages.py) and raw rows read
for `shardrec predict` (raw_rows.py; their label column and the line for a malformed row in
raw_labels.py).

May import: shardrec.dataloader (the dataset format it writes), shardrec.tools.synth; not the
CLI or the benchmarks.
"""
