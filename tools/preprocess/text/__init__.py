"""Input text: opening it, plain or gzip (gz.py, through ISA-L where it is installed), counting
its lines and cutting a plain file into line-aligned byte ranges (lines.py), and one large .gz
split into line-aligned ranges across workers (gz_split.py); an input file as a rerun knows it, by
name, size, time and a sampled digest of its content (file_identity.py).

May import: nothing of shardrec.tools.preprocess.
"""
