"""`shardrec data ...`: the group (data_app.py) and its commands: statistics and rows (stats.py,
displayed by view.py), torchrec's `.npy` layout in and out, stream digests and verification
(stream.py), multi-hot copies (multihot.py).

May import: every shardrec package but the CLI's other command modules (tools.cli.common only).
"""
