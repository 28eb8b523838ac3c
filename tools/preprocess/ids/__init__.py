"""Raw categorical values -> embedding row ids: hashing or a frequency-cut vocabulary
(id_maps.py), vocabularies kept and merged in bounded memory (vocab.py) and looked up in compiled
code (vocab_kernel.py).

May import: nothing of shardrec.tools.preprocess.
"""
