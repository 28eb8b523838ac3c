"""gzip inputs: opening them through ISA-L where it is installed (gz.py), one large .gz split
into line-aligned ranges across workers (gz_split.py), and one large .gz decoded once while its
tasks' text is handed out (gz_stream.py).

May import: nothing of shardrec.tools.preprocess.
"""
