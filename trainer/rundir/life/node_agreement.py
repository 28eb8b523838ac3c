"""Whether the ranks of a job started node by node (`torchrun --nnodes N ... -m shardrec.trainer`
on each machine) run one job: the same run directory, the same data, the same settings and plan.

Each node reads its own flags and files, so nothing else makes them agree: a node with its own
`--out-dir` (no shared filesystem) had rank 0 write checkpoints that hold only rank 0's shards, a
node with another copy of the data or another `--set` trained on it without a word, and the run's
config.toml and dataset.json recorded rank 0's alone. Every rank describes what it sees
(`rank_view`); once the group is joined they exchange the views and all refuse the same line
(`disagreement`) before anything is written. Torch-free: the exchange is the caller's.
"""

from __future__ import annotations

import hashlib
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardrec.dataloader.format.fingerprints import dataset_fingerprint
from shardrec.dataloader.format.manifest import Manifest
from shardrec.trainer.job.config import JobConfig
from shardrec.trainer.rundir.life.resume_settings import flat_settings, show_value

PER_NODE_KEYS = ("data.path", "sharding.plan", "data.num_workers", "dist.bind_cores")
"""Settings a node may give its own value: where its copy of the data and of the plan lie (their
contents are compared instead) and its machine's loader threads and core binding, which change no
result."""


@dataclass(frozen=True)
class RankView:
    """What one rank sees of its job, as it was started on its node."""

    host: str
    out_dir: str
    data: str
    data_fingerprint: str
    plan: str
    plan_digest: str
    settings: dict[str, Any]
    marker: str = ""
    """Rank 0's only: the name of the file it wrote into its run directory for the others to see."""


def rank_view(config: JobConfig, out_dir: Path, marker: str = "") -> RankView:
    """This rank's view of `config` run in `out_dir` (its data and plan read from its node)."""
    plan = config.sharding.plan
    settings = {k: v for k, v in flat_settings(config).items() if k not in PER_NODE_KEYS}
    return RankView(
        host=socket.gethostname(),
        out_dir=str(out_dir),
        data=config.data.path,
        data_fingerprint=dataset_fingerprint(Manifest.load(config.data.path)),
        plan=plan,
        plan_digest=hashlib.sha256(Path(plan).read_bytes()).hexdigest() if plan else "",
        settings=settings,
        marker=marker,
    )


def disagreement(views: list[RankView], sees_marker: list[bool]) -> str | None:
    """The one line every rank refuses where a rank's view differs from rank 0's (the first such
    rank is named; `sees_marker[r]`: rank r found rank 0's marker in its run directory); None
    where all agree."""
    first = views[0]
    for rank, view in enumerate(views[1:], start=1):
        who, rank0 = f"rank {rank} (host {view.host})", f"rank 0 (host {first.host})"
        if not sees_marker[rank]:
            return (
                f"{view.out_dir}: {who} does not see the files {rank0} writes in its "
                f"--out-dir {first.out_dir}: the run directory must be one folder on a "
                "filesystem every node sees (NFS, a cluster's shared storage), since every rank "
                "writes its shards of each checkpoint there; give every node such a folder"
            )
        if view.data_fingerprint != first.data_fingerprint:
            return (
                f"{who} reads other data than {rank0}: {view.data} (fingerprint "
                f"{view.data_fingerprint[:12]}) on rank {rank}, {first.data} (fingerprint "
                f"{first.data_fingerprint[:12]}) on rank 0; every node needs the same "
                "preprocessed dataset (copy rank 0's)"
            )
        changed = [
            f"{key}: {show_value(first.settings.get(key))} on rank 0, "
            f"{show_value(view.settings.get(key))} on rank {rank}"
            for key in sorted(first.settings.keys() | view.settings.keys())
            if first.settings.get(key) != view.settings.get(key)
        ]
        if changed:
            return (
                f"{who} was started with other settings than {rank0} ({'; '.join(changed)}): "
                "start every node with the same job file, --set and --steps"
            )
        if view.plan_digest != first.plan_digest:
            shown = [p or "none (planned at start)" for p in (view.plan, first.plan)]
            return (
                f"{who} was given another plan than {rank0}: {shown[0]} on rank {rank}, "
                f"{shown[1]} on rank 0; give every node the same plan file (copy rank 0's)"
            )
    return None
