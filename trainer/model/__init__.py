"""The model and its optimizers: DLRM / DCNv2, the loss, building and sharding them.

Owns the models (models.py), the training objective and its gradient semantics (objective.py),
the build_* functions that make the train module, the plan and the sharded model (build.py),
and the after-backward optimizer with its LR schedule (train_optimizer.py).

May import: shardrec.trainer.distributed, shardrec.trainer.job.
"""
