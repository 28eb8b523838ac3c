"""Training and using DLRM-family models, in subpackages by concept, each importing only those
before it in this order (each subpackage's `__init__` says what it owns):

- `distributed`: process groups (the one module that reads RANK / WORLD_SIZE), launching ranks;
- `job`: the config dataclasses, the flags of a run, the checks before ranks start;
- `model`: the models, their loss, building and sharding them, the after-backward optimizer;
- `rundir`: the run directory's files, checkpoints and their trust, its life and lock;
- `loop`: one rank's training job and its epoch-and-step loop, progress, metrics;
- `inference`: evaluating, exporting and scoring a trained run.

`python -m shardrec.trainer` is the rank program torchrun starts (loop/train_entry.py).

Imports: shardrec.dataloader, shardrec.embeddings and shardrec.sharding (never tools).
"""

from shardrec.trainer.job.versions import check_stack

check_stack()
