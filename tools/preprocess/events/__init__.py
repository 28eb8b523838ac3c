"""Event logs -> event-log datasets (`shardrec preprocess --events SPEC`): the log read whole and
checked, grouped by user in time order (event_log.py); anchors, windows, splits, parts and the
manifest (event_dataset.py).

May import: nothing of shardrec.tools.preprocess (the text pipeline is for click logs).
"""
