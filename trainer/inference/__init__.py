"""Using a trained run: evaluate a checkpoint at any world size, export it unsharded, score with it.

Owns `shardrec eval`'s request and its checks, torch-free for the CLI (eval_request.py), its work
and its rank program (evaluate.py, eval_entry.py), the exported model file (export.py; its header
made by file_header.py and read torch-free by model_file.py; which of its rows trained,
trained_rows.py) and scoring with it in one process (predict.py; the ids its managed tables had
no slot for, shared_row.py).

May import: shardrec.trainer.distributed, shardrec.trainer.job, shardrec.trainer.model,
shardrec.trainer.rundir, shardrec.trainer.loop.
"""
