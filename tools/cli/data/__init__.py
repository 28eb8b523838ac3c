"""`shardrec data ...`: the group (data_app.py) and its commands: statistics and rows (stats.py,
displayed by view.py), torchrec's `.npy` layout in and out, stream digests and verification
(stream.py), multi-hot copies (multihot.py), the old layout upgraded (upgrade.py).

May import: shardrec.tools.cli.common (not the CLI's other command modules).
"""
