"""The id maps of a job's managed tables as one checkpoint part (a main part of train_state.pt).

A map is a replica, the same on every rank, so rank 0 writes it whole and every rank loads it:
it does not depend on the world size or the plan, and a checkpoint reshards onto any of them as
the tables do. What each rank counted since the last update is combined over the ranks when the
checkpoint is written (the same collective as an update's); on load rank 0 takes the combined
statistics and the others start from none: sums and maxima give the next update the same
inputs as in the run that was not stopped, at any world size.

Tensors and plain values only (ids as int64 bit patterns), so the part loads with
weights_only=True like the rest of train_state.pt.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from shardrec.embeddings.managed.id_map import Pending
from shardrec.embeddings.managed.map_reduce import combine_over_ranks
from shardrec.embeddings.managed.maps import ManagedMaps, Stretches

_SLOT_ARRAYS = ("slot_key", "slot_count", "slot_last", "slot_born")
_WAITING = ("cand_key", "cand_count", "cand_last")
_PENDING = ("hits", "lasts", "miss_keys", "miss_counts", "miss_lasts")


def _tensor(array: np.ndarray) -> torch.Tensor:
    a = np.ascontiguousarray(array)
    return torch.from_numpy(a.view(np.int64) if a.dtype == np.uint64 else a.astype(np.int64))


def _array(tensor: torch.Tensor, like: np.ndarray) -> np.ndarray:
    a = tensor.cpu().numpy()
    return a.view(np.uint64).copy() if like.dtype == np.uint64 else a.astype(like.dtype)


class IdMapsState:
    """A job's id maps (and their update schedule's stretches) as a checkpoint part.

    Args:
        maps: the job's raw-id tables.
        group: the gloo group the statistics are combined over (None: one rank).
        keeps_pending: whether this rank takes a checkpoint's combined statistics (rank 0).
        counts: extra per-stretch figures saved with the maps (a state_dict-able object).
    """

    def __init__(
        self,
        maps: ManagedMaps,
        group: dist.ProcessGroup | None,
        keeps_pending: bool,
        counts: Any = None,
    ) -> None:
        self.maps = maps
        self.group = group
        self.keeps_pending = keeps_pending
        self.counts = counts

    def state_dict(self) -> dict[str, Any]:
        """Collective: every rank calls it (the statistics are combined); rank 0's is saved."""
        mapped = self.maps.mapped
        pending = combine_over_ranks([t.idmap.pending() for t in mapped], self.group)  # type: ignore[union-attr]
        tables = {}
        for table, p in zip(mapped, pending):
            m = table.idmap
            assert m is not None
            tables[table.feature] = {
                "rows": m.rows,
                **{name: _tensor(getattr(m, name)) for name in _SLOT_ARRAYS + _WAITING},
                "pending": {name: _tensor(getattr(p, name)) for name in _PENDING},
            }
        s = self.maps.stretches
        return {
            "tables": tables,
            "stretches": {"starts": list(s.starts), "steps": s.steps},
            "counts": self.counts.state_dict() if self.counts is not None else {},
        }

    def schedule(self) -> dict[str, Any]:
        """The maps' update schedule as a checkpoint's id_maps.json keeps it (torch-free readers:
        the checks before any rank starts): the steps the current stretch began with, whose 1/50
        spaces the updates of tables without evict_every on a resume."""
        return {"stretch_steps": self.maps.stretches.steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for table in self.maps.mapped:
            saved = state["tables"].get(table.feature)
            m = table.idmap
            assert m is not None
            if saved is None or saved["rows"] != m.rows:
                raise ValueError(
                    f"tables.{table.feature}: the checkpoint holds no id map of {m.rows} slots for "
                    "it; resume with the table settings it was saved with"
                )
            for name in _SLOT_ARRAYS:
                getattr(m, name)[:] = _array(saved[name], getattr(m, name))
            for name in _WAITING:
                setattr(m, name, _array(saved[name], getattr(m, name)))
            m.rebuild_index()
            m.clear_pending()
            if self.keeps_pending:
                p = saved["pending"]
                empty = Pending.empty(m.rows)
                m.set_pending(
                    Pending(*(_array(p[name], getattr(empty, name)) for name in _PENDING))
                )
        s = state["stretches"]
        self.maps.stretches = Stretches([int(x) for x in s["starts"]], int(s["steps"]))
        if self.counts is not None and state.get("counts"):
            self.counts.load_state_dict(state["counts"])
