"""`shardrec bench scale`: a Criteo-1TB-shaped dataset at a fraction, end to end on this machine
(scale_bench.py), its stream stage reading every train part as training does (scale_stream.py).

May import: shardrec.tools.bench.loader, shardrec.tools.bench.proctree (measuring a child
process tree), shardrec.tools.bench.rounds (the harness of repeated, interleaved rounds).
"""
