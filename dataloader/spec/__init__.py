"""Feature specs: what each column of a click log is and how it becomes model inputs
(feature_spec.py; how its rows are written, text_format.py), read from and written to TOML and
the manifest (spec_file.py, the one reader of spec keys); event specs: an event log's columns
and how its samples are made (event_spec.py, read and written by event_spec_file.py); both
written as TOML through toml_text.py; the words text writes for a missing value, and the key a
refusal of one names (missing_words.py).

May import: shardrec.dataloader.util, shardrec.dataloader.format.
"""
