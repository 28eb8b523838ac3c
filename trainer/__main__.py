"""`python -m shardrec.trainer ...`: the per-rank entry that torchrun starts.

Single node: `shardrec train --nproc-per-node N ...` runs torchrun for you. Several nodes:

    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29400 \\
        -m shardrec.trainer --config job.toml --data DIR --plan plan.json --out-dir RUN
"""

from shardrec.trainer.loop.train_entry import main

if __name__ == "__main__":
    main()
