"""A preprocessing task, from its text to its parts: what a task is and what every task of a run
shares (task.py), its text read in pieces (task_text.py), running it: parse, map ids, write parts
(task_run.py), its malformed rows counted and the errors that name their file and line
(bad_rows.py), what to do about such a row by its reason (row_advice.py), and its marker, written
once its parts are on disk (task_markers.py).

May import: shardrec.tools.preprocess.cpu_stages, shardrec.tools.preprocess.text,
shardrec.tools.preprocess.ids, shardrec.tools.preprocess.parse, shardrec.tools.preprocess.parts.
"""
