"""Event logs -> event-log datasets (`shardrec preprocess --events SPEC`): the log read whole and
checked, grouped by user in time order (event_log.py); anchors, windows, splits, parts and the
manifest (event_dataset.py).

May import: shardrec.tools.preprocess.text (where a plain file's text ends, less its blank last
lines, as the click-log readers take it); nothing else of the preprocessing package (the text
pipeline is for click logs).
"""
