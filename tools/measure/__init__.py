"""Measurements of this machine and this data that plans are made from (product code, not
benchmarks): the calibration rank program of `shardrec plan calibrate` (calibrate.py) and the
ids every table sees, batch by batch, for cache sizing (id_stream.py).

May import: nothing of shardrec.tools.
"""
