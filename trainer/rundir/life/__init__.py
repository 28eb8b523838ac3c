"""A run directory's life between invocations: whether a job is new, resumes or has nothing left
to do, and why a resume is refused (lifecycle.py); the settings a resume may change
(resume_settings.py); the data a run trained on and whether other data is it (trained_data.py);
what a run directory holds and its status (run_state.py); the stretches of a run that goes on
with other data (stretches.py) and whether it may (continuation.py); which device's generator
drew its initial weights (initial_weights.py); whether the ranks of a job
started node by node run one job (node_agreement.py: the ranks exchange what it reads, once
joined). Torch-free: checked before any rank starts, and by each rank before it joins the group.

May import: shardrec.trainer.rundir.names, shardrec.trainer.rundir.checkpoint,
shardrec.trainer.rundir.metrics_log.
"""
