"""Models, the training loop, distributed set-up, checkpoints and metrics."""

from shardrec.trainer.versions import check_stack

check_stack()
