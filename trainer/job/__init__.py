"""What a job is: its settings and the checks made before any rank starts.

Owns the config: the sections' dataclasses (sections.py, `[model]`'s in model_section.py, the one
home of defaults), JobConfig and its loader (config.py) and a value as TOML text, its help and its
checks (toml_values.py), all torch-free; the flags of a training run and the one flags -> JobConfig
conversion (flags.py; torch-free, the CLI imports them), the pre-start checks against the dataset
and the plan (preflight.py), the precision a job computes in on this machine and the refusal of
emulated bf16 (precision.py), the one job -> PlanRequest conversion, with the topology `plan
--topology` names and the managed tables' proposed row budgets (planning.py), what the data settings
mean for loaders and tables (data_options.py), the known-good torch / fbgemm-gpu / torchrec versions
(versions.py) and the `[tables.FEATURE]` settings as a resume compares them, key by key
(table_changes.py).

May import: shardrec.trainer.distributed.
"""
