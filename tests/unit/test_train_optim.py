"""The DLRMv2 schedule, row-wise Adagrad state conversion and fault-injection parsing."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from shardrec.embeddings.optim_layouts import convert_rowwise_momentum
from shardrec.trainer.distributed import faults
from shardrec.trainer.model.train_optimizer import dlrm_schedule


def test_dlrm_schedule_warms_up_holds_and_decays_quadratically() -> None:
    f = dlrm_schedule(warmup_steps=4, decay_start=10, decay_steps=4)
    assert [f(s) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert f(9) == 1.0
    assert [f(s) for s in (10, 12, 14, 20)] == [1.0, 0.25, 0.0, 0.0]
    assert dlrm_schedule(0, 0, 0)(123) == 1.0


def test_rowwise_momentum_conversion() -> None:
    rows = 3
    two_shards = torch.tensor([1.0, 2.0, 3.0, 5.0, 6.0, 7.0])  # shard 0 rows, then shard 1 rows
    whole = convert_rowwise_momentum(two_shards, rows, [4, 4], [8])
    assert torch.equal(whole, torch.tensor([3.0, 4.0, 5.0]))  # equal widths: the mean
    uneven = convert_rowwise_momentum(two_shards, rows, [2, 6], [8])
    assert torch.allclose(uneven, (2 * two_shards[:3] + 6 * two_shards[3:]) / 8)
    assert torch.equal(
        convert_rowwise_momentum(whole, rows, [8], [4, 4]), torch.cat([whole, whole])
    )
    assert torch.equal(convert_rowwise_momentum(two_shards, rows, [4, 4], [4, 4]), two_shards)


def test_faults_fire_only_where_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(faults.ENV, raising=False)
    assert not faults.should_fire("kill", 3, 0)
    monkeypatch.setenv(faults.ENV, "kill:3:1,nan:5::1")
    assert faults.should_fire("kill", 3, 1) and not faults.should_fire("kill", 3, 0)
    assert not faults.should_fire("nan", 5, 0)  # attempt 1 only
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert faults.should_fire("nan", 5, 0) and not faults.should_fire("kill", 3, 1)
    monkeypatch.setenv(faults.ENV, "kill")
    with pytest.raises(ValueError, match="KIND:STEP"):
        faults.should_fire("kill", 1, 0)


def _cut_plans(rows: int):
    """The checkpoint's plan (table t_a in 2 column shards of 4) and the job's (t_a whole,
    table-wise)."""
    from torchrec.modules.embedding_configs import EmbeddingBagConfig

    from shardrec.sharding.plan.plan_file import plan_fingerprint
    from shardrec.sharding.plan.plan_types import PLAN_SCHEMA_VERSION, PlanFile, Shard, TablePlan

    config = EmbeddingBagConfig(
        name="t_a", embedding_dim=8, num_embeddings=rows, feature_names=["a"]
    )

    def plan(shards: list[Shard]) -> PlanFile:
        return PlanFile(
            PLAN_SCHEMA_VERSION,
            plan_fingerprint([config], 2, 64, "cpu"),
            [TablePlan("t_a", "x", "fused", shards)],
        )

    saved = plan([Shard(0, 0, 0, rows, 4), Shard(1, 0, 4, rows, 4)])
    return saved.to_json(), plan([Shard(0, 0, 0, rows, 8)])


def test_element_wise_state_is_never_converted_and_every_rank_loads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Adam's (or Adagrad's) per-element momentum of a column-cut table that becomes whole has
    [rows] as its first size, as row-wise state of a whole table does: it must not be converted
    (DCP reshards it like the weights). The one DCP load still runs, on the checkpoint's group."""
    from shardrec.trainer.rundir import optim_state

    rows, loads = 5, []
    saved, plan = _cut_plans(rows)
    moment = torch.zeros(rows, 8)
    state = {
        "state": {
            "sparse.t_a.weight": {"t_a.momentum1": moment, "t_a.momentum2": torch.zeros(rows, 8)}
        }
    }
    group = object()  # stands for the checkpoint's gloo group
    monkeypatch.setattr(
        optim_state.dcp,
        "load",
        lambda state, checkpoint_id, process_group: loads.append((state, process_group)),
    )
    assert optim_state.adapt_fused_state(Path("ckpt"), state, saved, plan, group) == {}  # type: ignore[arg-type]
    assert state["state"]["sparse.t_a.weight"]["t_a.momentum1"] is moment
    assert loads == [({"fused_optim": {"state": {}}}, group)]
    # A rank holding no part of the table joins the same load.
    loads.clear()
    assert optim_state.adapt_fused_state(Path("ckpt"), {"state": {}}, saved, plan, group) == {}  # type: ignore[arg-type]
    assert loads == [({"fused_optim": {"state": {}}}, group)]


def test_the_schedule_reaches_the_tables_only_when_asked() -> None:
    from shardrec.trainer.model.train_optimizer import TrainOptimizer

    def optimizers(lr: float) -> list[torch.optim.Optimizer]:
        return [torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=lr) for _ in range(3)]

    schedule = dlrm_schedule(warmup_steps=4, decay_start=0, decay_steps=0)
    # dense, data-parallel tables, and a stand-in for the sharded model's fused optimizer
    dense, tables, fused = optimizers(0.004)
    both = TrainOptimizer(dense, tables, {}, schedule, fused)
    seen = []
    for _ in range(5):
        both.zero_grad()  # before forward: the fused tables update in this step's backward
        seen.append([round(o.param_groups[0]["lr"], 6) for o in (dense, tables, fused)])
        both.step()
    assert seen == [[r, r, r] for r in (0.001, 0.002, 0.003, 0.004, 0.004)]
    dense, tables, fused = optimizers(0.004)
    dense_only = TrainOptimizer(dense, tables, {}, schedule)
    dense_only.zero_grad()
    assert [o.param_groups[0]["lr"] for o in (dense, tables, fused)] == [0.001, 0.004, 0.004]


def _trained(dense_lr: float, table_lr: float, eps: float, steps: int, resume=None):
    """A TrainOptimizer (Adagrad dense layers, warm-up over 4 steps; sgd data-parallel tables)
    whose parameters took `steps` steps of a fixed gradient, after loading `resume` (an earlier
    return's optimizer and weights) if given."""
    from shardrec.trainer.model.train_optimizer import TrainOptimizer

    start = (torch.ones(3), torch.ones(2)) if resume is None else resume[1:]
    dense_w, table_w = (torch.nn.Parameter(w.detach().clone()) for w in start)
    dense = torch.optim.Adagrad([dense_w], lr=dense_lr, eps=eps)
    tables = torch.optim.SGD([table_w], lr=table_lr)
    opt = TrainOptimizer(dense, tables, {"t": ("t", table_w)}, dlrm_schedule(4, 0, 0))
    if resume is not None:
        opt.load_state_dict(resume[0].state_dict())
    for _ in range(steps):
        opt.zero_grad()
        dense_w.grad, table_w.grad = torch.tensor([1.0, 2.0, 3.0]), torch.ones(2)
        opt.step()
    return opt, dense_w, table_w


def test_a_resume_trains_at_the_rates_the_job_sets_now_with_the_checkpoints_state() -> None:
    saved = _trained(0.05, 0.1, 1e-8, steps=2)
    # Unchanged settings: the same weights as the run that went on.
    _, whole_d, whole_t = _trained(0.05, 0.1, 1e-8, steps=3)
    _, same_d, same_t = _trained(0.05, 0.1, 1e-8, steps=1, resume=saved)
    assert torch.equal(same_d, whole_d) and torch.equal(same_t, whole_t)
    # A change accepted on resume (--allow-change optim): the new rates and eps, at the
    # schedule's step 2 (warm-up 3/4), on the checkpoint's Adagrad sums.
    resumed, _, _ = _trained(0.5, 0.7, 0.25, steps=0, resume=saved)
    dense_group, table_group = resumed.param_groups
    assert dense_group["lr"] == 0.5 * 3 / 4 and dense_group["eps"] == 0.25
    assert table_group["lr"] == 0.7
    assert resumed.scheduler.get_last_lr() == [0.5 * 3 / 4]
    assert torch.equal(
        resumed.dense.state_dict()["state"][0]["sum"],
        saved[0].dense.state_dict()["state"][0]["sum"],
    )


def test_the_reported_rate_of_a_step_is_the_rate_that_step_took() -> None:
    """metrics.jsonl's `lr` at step N (the train loop reads stepped_lr after the step): under a
    warm-up over 4 steps then a decay from step 5 over 2, steps 1..8 take the rates below, not
    the next step's (the scheduler has moved on by the time the step is reported)."""
    from shardrec.trainer.model.train_optimizer import TrainOptimizer

    dense = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.004)
    opt = TrainOptimizer(
        dense, None, {}, dlrm_schedule(warmup_steps=4, decay_start=5, decay_steps=2)
    )
    reported = []
    for _ in range(8):
        opt.zero_grad()
        opt.step()
        reported.append(round(opt.stepped_lr, 6))
    assert reported == [0.001, 0.002, 0.003, 0.004, 0.004, 0.004, 0.001, 0.0]


def test_sgd_tables_resume_under_a_plan_that_moves_them_to_or_from_data_parallel() -> None:
    """Plain SGD keeps no state per table: a checkpoint whose plan had other data-parallel tables
    (or none) loads, as a checkpoint reshards onto any plan. Adam's moments would be lost: still
    refused."""
    from shardrec.trainer.model.train_optimizer import TrainOptimizer

    def job(kind: type[torch.optim.Optimizer], tables: tuple[str, ...]) -> TrainOptimizer:
        dense = torch.optim.Adagrad([torch.nn.Parameter(torch.ones(3))], lr=0.1)
        params = {f"ebc.{t}.weight": (t, torch.nn.Parameter(torch.ones(2))) for t in tables}
        table_opt = kind([p for _, p in params.values()], lr=0.1) if params else None
        opt = TrainOptimizer(dense, table_opt, params, dlrm_schedule(0, 0, 0))
        for _, p in params.values():
            p.grad = torch.ones(2)
        opt.step()
        return opt

    job(torch.optim.SGD, ("t_b",)).load_state_dict(job(torch.optim.SGD, ("t_a",)).state_dict())
    job(torch.optim.SGD, ("t_a",)).load_state_dict(job(torch.optim.SGD, ()).state_dict())
    with pytest.raises(ValueError, match="Adam state cannot move between layouts"):
        job(torch.optim.Adam, ("t_b",)).load_state_dict(
            job(torch.optim.Adam, ("t_a",)).state_dict()
        )
