"""Training: one rank's job built and run, the epoch-and-step loop, progress and metrics.

Owns the rank program torchrun starts (train_entry.py), wiring a job's parts (train_job.py), the
whole epoch-segment-step loop (train_loop.py), a job's run from resume to summary (job_run.py),
its evaluations and MLPerf's log of them (evaluation.py), a stretch's records when a run goes on
with new data (stretch_run.py), how one step runs and its loss is reduced (steps.py), the raw-id
tables' id maps over a rank's batches (managed_ids.py), the evaluation schedule and target AUC
(target.py), rank 0's progress reports (progress.py) and the evaluation metrics (metrics.py).

May import: shardrec.trainer.distributed, shardrec.trainer.job, shardrec.trainer.model,
shardrec.trainer.rundir.
"""
