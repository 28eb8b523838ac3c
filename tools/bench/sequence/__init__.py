"""`shardrec bench train --model hstu` and `shardrec bench sequence`: HSTU's training speed against
a plain PyTorch version of its layer, with where a step's time goes (hstu_bench.py, its baseline
plain_stu.py), and its held-out AUC against a DLRM that pools the same history
(sequence_quality.py).

May import: shardrec.tools.bench.train, shardrec.tools.bench.rounds (the harness of repeated,
interleaved rounds), shardrec.tools.bench.proctree (a run's ranks ended with it on a stop).
"""
