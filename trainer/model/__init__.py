"""The model and its optimizers: DLRM / DCNv2, the loss, building and sharding them.

Owns the models (models.py), the training objective and its gradient semantics (objective.py), the
unsharded train module with its seeded dense layers, and the model on the meta device that
`shardrec plan` counts (train_module.py), the plan a run shards by, planned at start or checked
(run_plan.py), the build_* functions that make the sharded model and its optimizer (build.py), and
the after-backward optimizer with its LR schedule (train_optimizer.py).

May import: shardrec.trainer.distributed, shardrec.trainer.job.
"""
