"""gzip inputs: opening them through ISA-L where it is installed (gz.py), one large .gz split
into line-aligned ranges across workers (gz_split.py).

May import: nothing of shardrec.tools.preprocess.
"""
