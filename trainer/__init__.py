"""Models, the training loop, distributed set-up, checkpoints and metrics.

Owns the job: the config dataclasses (the one home of defaults), the DLRM/DCNv2 models and
their loss, building and sharding the model from a plan, the step loop and evaluation,
checkpoints (named stateful parts plus a signature), the one module that reads RANK/WORLD_SIZE
and creates or destroys process groups (dist.py), launching local ranks (launch.py).

Imports: shardrec.dataloader, shardrec.embeddings and shardrec.sharding (never tools).
"""

from shardrec.trainer.versions import check_stack

check_stack()
