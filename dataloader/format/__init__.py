"""The dataset on disk: the manifest (manifest.py), its files kept inside the dataset directory and
hashed as it records them (dataset_files.py) and the fingerprints a run records of the data
(fingerprints.py), one Arrow IPC file per part (part_file.py: its columns, writing, opening and
checking a part; arrow_ipc.py: the container's bytes, for any column of the three kinds a part
holds, laid out with flatbuffer.py and written, streamed and hashed, by arrow_ipc_write.py), checks
beyond what opening costs (integrity.py), the parts of a split mapped on first use (part_cache.py),
torchrec's `day_N_*.npy` layout (torchrec_npy.py) and opening a split whichever layout holds it
(source.py).

May import: shardrec.dataloader.util.
"""
