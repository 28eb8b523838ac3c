"""The trainer on CUDA: what `make gpu-check` runs (`pytest -m gpu`), skipped without CUDA.

One dataset (synth + preprocess: Criteo's format) and one 1-GPU run (planned at start for this GPU)
are made once and shared: kill-and-resume must end bit for bit on that run's weights, with its plan
and with that plan's tables moved to host memory (UVM caches), eval at another world size (CPU ranks
reading the GPU checkpoint), export and predict use it. bf16, on-the-fly multi-hot and sparse Adam
across a changed column cut train runs of their own. What needs 2 GPUs (NCCL between ranks) skips on
1 with the reason "needs 2 GPUs", which the check's summary shows as "not run: needs 2 GPUs", never
as passed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import TINY_MODEL, settings

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
# Without CUDA at all the module skips for that ("needs CUDA"), not for this.
needs_two_gpus = pytest.mark.skipif(0 < GPUS < 2, reason="needs 2 GPUs")

BATCH = 64
JOB = settings(
    *TINY_MODEL,
    'train.device="cuda"',
    f"train.global_batch_size={BATCH}",
    "checkpoint.interval_steps=4",
    "checkpoint.keep=3",
    "eval.interval_steps=8",
    'data.eval_splits=["val"]',
)  # train.pipeline "auto": TrainPipelineSparseDist on CUDA
STEPS = "16"
MULTIHOT_AUC = 0.6
"""The multi-hot run's val AUC must exceed it: well above chance (the same job on 1 CPU rank
reached 0.705, the one-hot one 0.749)."""


def shardrec(*args: str, cwd: Path, fault: str = "") -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "SHARDREC_FAULT"}
    if fault:
        env["SHARDREC_FAULT"] = fault
    return subprocess.run(
        [sys.executable, "-m", "shardrec.tools.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def ok(done: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert done.returncode == 0, f"{done.args}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done


def train(
    root: Path, out_dir: str, *extra: str, ranks: int = 1, steps: str = STEPS, fault: str = ""
) -> dict:
    """`shardrec train` of JOB on `ranks` GPUs; its summary, with the run's stderr under
    "stderr"."""
    args = [
        "train",
        "--data",
        "data",
        "--out-dir",
        out_dir,
        "--nproc-per-node",
        str(ranks),
        "--json",
    ]
    done = ok(shardrec(*args, "--steps", steps, *JOB, *extra, cwd=root, fault=fault))
    return {**json.loads(done.stdout), "stderr": done.stderr}


def final_state(run_dir: Path) -> dict:
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    ckpt = sorted((run_dir / "checkpoints").glob("step-*"))[-1]
    dcp_to_torch_save(ckpt, run_dir / "final.pt")
    return torch.load(run_dir / "final.pt", weights_only=False)


def flat(tree: dict, prefix: str = "") -> dict[str, torch.Tensor]:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}."))
        elif isinstance(value, torch.Tensor):
            out[f"{prefix}{key}"] = value
    return out


@pytest.fixture(scope="module")
def gpu_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """A Criteo-format dataset (day_0: train, day_1: val + test) and 16 steps on one GPU."""
    root = tmp_path_factory.mktemp("gpu")
    ok(shardrec("synth", "raw", "--rows", "4000", "--days", "2", "--max-vocab", "500", cwd=root))
    ok(
        shardrec(
            "preprocess", "raw/day_0", "raw/day_1", "--out", "data", "--max-ids", "1000", cwd=root
        )
    )
    return root, train(root, "run")


def test_trains_on_one_gpu_with_the_pipeline(gpu_run: tuple[Path, dict]) -> None:
    from shardrec.sharding.machine.hardware import preset_for

    root, summary = gpu_run
    assert summary["steps"] == 16 and summary["eval"]["val"]["auc"] > 0.55
    # Every step through torchrec's sparse-dist pipeline (train.pipeline "auto" on CUDA).
    assert summary["pipeline"] == {"TrainPipelineSparseDist": 16}
    plan = json.loads((root / "run" / "plan.json").read_text())
    assert plan["fingerprint"]["device_kind"] == "cuda"
    # Planned at start for this GPU: its model's preset, its free memory (not the h100 preset's 80
    # GiB).
    topology = plan["topology"]
    assert (topology["name"], topology["memory_source"]) == (
        preset_for(torch.cuda.get_device_name(0)),
        "device",
    )
    assert topology["memory_bytes"] <= torch.cuda.mem_get_info(0)[1]


def assert_killed_and_resumed_ends_as_the_run(
    gpu_run: tuple[Path, dict], out_dir: str, *extra: str
) -> None:
    """Train `out_dir` killed after step 10 and resumed by torchrun from step 8's checkpoint: its
    weights and optimizer states end bit for bit as the uninterrupted run's, and so does its AUC."""
    root, summary = gpu_run
    resumed = train(root, out_dir, *extra, "--max-restarts", "1", fault="kill:10:0:0")
    assert resumed["resumed_from_step"] == 8
    reference, again = flat(final_state(root / "run")), flat(final_state(root / out_dir))
    assert reference.keys() == again.keys()
    differ = [k for k in reference if not torch.equal(reference[k], again[k])]
    assert not differ, f"{out_dir}: not bitwise the run's: {differ[:5]}"
    assert resumed["eval"]["val"]["auc"] == summary["eval"]["val"]["auc"]


def test_kill_and_resume_on_a_gpu_is_bitwise(gpu_run: tuple[Path, dict]) -> None:
    assert_killed_and_resumed_ends_as_the_run(gpu_run, "killed")


def test_bf16_trains_on_a_gpu_near_fp32(gpu_run: tuple[Path, dict]) -> None:
    root, summary = gpu_run
    bf16 = train(root, "bf16", "--set", 'train.precision="bf16"')
    assert (
        "emulated" not in bf16["stderr"]
    )  # a GPU of compute capability 8.0 or newer has native bf16
    assert bf16["eval"]["val"]["auc"] == pytest.approx(summary["eval"]["val"]["auc"], abs=0.02)
    # The model the trainer builds for bf16 runs its dense layers under autocast on the GPU: every
    # Linear gives bf16 activations, the lookups stay fp32 and the logits come back fp32.
    activations = _dense_activation_dtypes(root, "bf16")
    assert activations["linear"] == {torch.bfloat16} and activations["embeddings"] == {
        torch.float32
    }
    assert activations["logits"] == {torch.float32}
    assert _dense_activation_dtypes(root, "fp32")["linear"] == {torch.float32}


def _dense_activation_dtypes(root: Path, precision: str) -> dict[str, set]:
    """dtypes of the activations of the model build_model makes for `precision` on CUDA, in one
    forward of a val batch: every Linear's output, the pooled embeddings and the logits."""
    from shardrec.dataloader.format.manifest import Manifest
    from shardrec.dataloader.loader import NO_SHUFFLE, Delivery, build_loader
    from shardrec.embeddings.tables import build_ebc, build_table_configs
    from shardrec.trainer.job.config import load_job_config
    from shardrec.trainer.model.models import build_model

    job = load_job_config(None, [item for item in JOB if item != "--set"])
    manifest = Manifest.load(root / "data")
    tables = build_table_configs(manifest, job.model.embedding_dim)
    features = [name for t in tables for name in t.feature_names]
    model = build_model(
        job.model,
        build_ebc(tables, "cuda"),
        features,
        len(manifest.dense_features),
        dense_device="cuda",
        precision=precision,
    )
    seen: dict[str, set] = {"linear": set(), "embeddings": set(), "logits": set()}
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            module.register_forward_hook(lambda m, i, out: seen["linear"].add(out.dtype))
    model.sparse_arch.register_forward_hook(
        lambda m, i, out: seen["embeddings"].update(t.dtype for t in out)
    )
    loader = build_loader(
        root / "data",
        "val",
        global_batch_size=BATCH,
        rank=0,
        world_size=1,
        shuffle=NO_SHUFFLE,
        tail="pad",
        delivery=Delivery(num_workers=0),
    )
    batch = next(iter(loader)).to("cuda")
    with torch.no_grad():
        seen["logits"].add(model(batch.dense_features, batch.sparse_features).dtype)
    return seen


def test_on_the_fly_multihot_trains_on_a_gpu(gpu_run: tuple[Path, dict]) -> None:
    root, _ = gpu_run
    sizes = [3, 1, 2, 6] * 6 + [1, 2]  # 26 sparse features
    summary = train(
        root,
        "multihot",
        "--set",
        f"data.multihot_sizes={sizes}",
        "--set",
        f'data.multihot_cache="{root / "cache"}"',
    )
    # Learned, not merely ran.
    assert summary["steps"] == 16 and summary["eval"]["val"]["auc"] > MULTIHOT_AUC


def _plan(root: Path, cut_first_table: bool) -> Path:
    """Every table whole on rank 0, the first one cut in two column shards of 4 if asked."""
    from shardrec.dataloader.format.manifest import Manifest
    from shardrec.embeddings.tables import build_table_configs
    from shardrec.sharding.plan.plan_file import plan_fingerprint
    from shardrec.sharding.plan.plan_types import PLAN_SCHEMA_VERSION, PlanFile, Shard, TablePlan

    tables = build_table_configs(Manifest.load(root / "data"), 8)
    placed = []
    for i, t in enumerate(tables):
        if i == 0 and cut_first_table:
            shards = [Shard(0, 0, 0, t.num_embeddings, 4), Shard(0, 0, 4, t.num_embeddings, 4)]
            placed.append(TablePlan(t.name, "column_wise", "fused", shards))
        else:
            placed.append(
                TablePlan(t.name, "table_wise", "fused", [Shard(0, 0, 0, t.num_embeddings, 8)])
            )
    plan = PlanFile(
        PLAN_SCHEMA_VERSION, plan_fingerprint(tables, 1, BATCH, "cuda"), placed, planner="test"
    )
    path = root / ("plan-cut.json" if cut_first_table else "plan-whole.json")
    path.write_text(plan.to_json())
    return path


def test_sparse_adam_resumes_exactly_after_a_column_cut_table_becomes_whole(
    gpu_run: tuple[Path, dict],
) -> None:
    """Adam's per-element moments are resharded by DCP like the weights, never converted as
    row-wise state, and fbgemm's step counter (its bias correction, outside torchrec's state) is
    restored: 8 steps on a column cut, resumed whole, end where 16 steps on the cut end. Without
    the counter the resumed TBE counts from 0 and its first updates are ~1/(1 - 0.9^9) = 2.6x too
    large, far outside the tolerance (cut and whole sum the same columns; kept loose in case the
    kernels order them otherwise)."""
    root, _ = gpu_run
    adam = ["--set", 'optim.sparse="adam"', "--set", "optim.sparse_lr=0.01"]
    cut = ["--plan", str(_plan(root, True))]
    went_on = train(root, "adam-on", *cut, *adam)
    train(root, "adam", *cut, *adam, steps="8")
    whole = ["--plan", str(_plan(root, False)), "--allow-change", "sharding.plan"]
    summary = train(root, "adam", *whole, *adam)
    assert summary["resumed_from_step"] == 8 and summary["steps"] == went_on["steps"] == 16
    reference, resumed = final_state(root / "adam-on"), final_state(root / "adam")
    # One counter per table, the optimizer steps taken (evaluation batches not counted).
    counters = {t: int(c) for t, c in resumed["fused_optim"]["step_counters"].items()}
    assert len(counters) == 26 and set(counters.values()) == {16}, counters
    assert counters == {t: int(c) for t, c in reference["fused_optim"]["step_counters"].items()}
    moments = {k: v for k, v in flat(resumed["fused_optim"]).items() if ".momentum1" in k}
    assert moments and all(v.dim() == 2 for v in moments.values())  # per element: [rows, dim]
    expected, got = flat(reference["model"]), flat(resumed["model"])
    assert expected.keys() == got.keys()
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], atol=1e-6, rtol=1e-4, msg=key)


def _uvm_plan(root: Path) -> Path:
    """The run's own plan (planned at start) with three of its sharded tables moved to host memory:
    two behind HBM caches of their own load factors (one TBE each), one read over the link."""
    from dataclasses import replace

    from shardrec.sharding.plan.plan_file import load_plan, save_plan
    from shardrec.sharding.plan.plan_types import CachePlan

    plan = load_plan(root / "run" / "plan.json")
    sharded = [i for i, t in enumerate(plan.tables) if t.sharding_type != "data_parallel"]
    assert len(sharded) >= 3, [t.sharding_type for t in plan.tables]
    for i, (kernel, load_factor) in zip(
        sharded, [("fused_uvm_caching", 0.2), ("fused_uvm_caching", 0.5), ("fused_uvm", 0)]
    ):
        t = plan.tables[i]
        cache = CachePlan(
            load_factor,
            [max(1, int(s.rows * load_factor)) for s in t.shards],
            [0.5] * len(t.shards),
        )
        plan.tables[i] = replace(t, compute_kernel=kernel, cache=cache if load_factor else None)
    save_plan(plan, root / "plan-uvm.json")
    return root / "plan-uvm.json"


def test_tables_in_host_memory_behind_gpu_caches_train_as_in_hbm_and_resume(
    gpu_run: tuple[Path, dict],
) -> None:
    """The 1-GPU run's plan with tables in host memory (UVM, cached and not): SIGKILL after step 10,
    resumed from step 8's checkpoint (the caches flushed into it), the weights end bit for bit as
    the run's, whose tables were all in HBM. That the tables were in host memory at all is read
    from the kernels' own buffers (rank 0 logs each TBE with UVM weights): a silent fall back to
    HBM would end bit for bit the same."""
    root = gpu_run[0]
    plan_path = _uvm_plan(root)
    resumed = train(
        root, "uvm", "--plan", str(plan_path), "--max-restarts", "1", fault="kill:10:0:0"
    )
    placed = {
        m.group(1): (int(m.group(2).replace(",", "")), m.group(3))
        for m in re.finditer(
            r"table batch (\S+): ([\d,]+) rows in host memory \(UVM\), (no cache|an HBM cache of [\d,]+ rows)",
            resumed["stderr"],
        )
    }
    from shardrec.sharding.plan.plan_file import load_plan

    moved = {
        t.name: t for t in load_plan(plan_path).tables if t.compute_kernel.startswith("fused_uvm")
    }
    # One TBE per table in host memory (the cached ones' own load factors), no other table there.
    assert set(placed) == set(moved), resumed["stderr"][-3000:]
    for name, table in moved.items():
        rows, cache = placed[name]
        assert rows == sum(s.rows for s in table.shards)
        if table.compute_kernel == "fused_uvm_caching":
            cache_rows = int(re.sub(r"\D", "", cache))
            assert 0 < cache_rows < rows, (name, cache)
        else:
            assert cache == "no cache", (name, cache)
    reference, again = flat(final_state(root / "run")), flat(final_state(root / "uvm"))
    differ = [k for k in reference if not torch.equal(reference[k], again[k])]
    assert resumed["resumed_from_step"] == 8 and not differ, differ[:5]
    assert resumed["eval"]["val"]["auc"] == gpu_run[1]["eval"]["val"]["auc"]


def _evaluate_on_cpu(env, run_dir: str) -> dict:
    from shardrec.trainer.inference.evaluate import EvalRequest, evaluate_checkpoint

    return evaluate_checkpoint(EvalRequest(Path(run_dir), split="val", device="cpu"), env)


def test_eval_on_two_cpu_ranks_reads_the_gpu_checkpoint(gpu_run: tuple[Path, dict]) -> None:
    """Another world size and another device: the checkpoint's CUDA tensors load onto the CPU."""
    from shardrec.trainer.distributed.local_ranks import run_local_ranks

    root, summary = gpu_run
    metrics = run_local_ranks(_evaluate_on_cpu, 2, str(root / "run"), device_kind="cpu")[0]
    assert (metrics["world_size"], metrics["trained_world_size"]) == (2, 1)
    assert metrics["auc"] == pytest.approx(summary["eval"]["val"]["auc"], abs=1e-3)


@needs_two_gpus
def test_two_ranks_train_over_nccl_and_eval_reshards(gpu_run: tuple[Path, dict]) -> None:
    root, _ = gpu_run
    summary = train(root, "two", ranks=2)
    assert summary["steps"] == 16 and summary["eval"]["val"]["auc"] > 0.55
    one = json.loads(ok(shardrec("eval", "two", "--split", "val", "--json", cwd=root)).stdout)
    two = json.loads(
        ok(
            shardrec("eval", "two", "--split", "val", "--nproc-per-node", "2", "--json", cwd=root)
        ).stdout
    )
    assert two["auc"] == summary["eval"]["val"]["auc"]  # its own world size: bit for bit
    assert one["auc"] == pytest.approx(two["auc"], abs=1e-3)


def test_export_and_predict_score_the_gpu_run(gpu_run: tuple[Path, dict]) -> None:
    root, summary = gpu_run
    ok(shardrec("export", "run", "--out", "model.safetensors", cwd=root))
    scored = ok(
        shardrec(
            "predict",
            "model.safetensors",
            "data",
            "--split",
            "val",
            "--out",
            "p.npy",
            "--json",
            cwd=root,
        )
    )
    result = json.loads(scored.stdout)
    assert result["rows"] == 1000
    assert result["auc"] == pytest.approx(
        summary["eval"]["val"]["auc"], abs=1e-3
    )  # CPU scoring of GPU weights


def test_auc_on_the_gpu_equals_the_auc_on_the_cpu() -> None:
    from shardrec.trainer.loop.metrics import auc

    g = torch.Generator().manual_seed(0)
    logits = torch.round(torch.randn(300_000, generator=g), decimals=2)  # ties
    labels = (torch.rand(300_000, generator=g) < torch.sigmoid(logits)).float()
    assert auc(logits.cuda(), labels.cuda()) == auc(logits, labels)


def test_initial_weights_on_the_gpu_do_not_depend_on_the_cut() -> None:
    from torchrec.modules.embedding_configs import EmbeddingBagConfig

    from shardrec.embeddings.init import INIT_BLOCK_ROWS, _fill_rows

    table = EmbeddingBagConfig(
        name="t", embedding_dim=8, num_embeddings=3 * INIT_BLOCK_ROWS, feature_names=["f"]
    )
    whole = torch.empty(table.num_embeddings, 8, device="cuda")
    _fill_rows(whole, 0, 0, 1, table, seed=7)
    shard = torch.empty(300, 4, device="cuda")
    _fill_rows(shard, INIT_BLOCK_ROWS - 100, 2, 1, table, seed=7)
    assert torch.equal(shard, whole[INIT_BLOCK_ROWS - 100 : INIT_BLOCK_ROWS + 200, 2:6])
    assert whole.abs().max() <= (1.0 / table.num_embeddings) ** 0.5 and whole.std() > 0


_BAD_ID_ON_CUDA = """
import sys, torch, torch.distributed as dist
dist.init_process_group("nccl", init_method="file://" + sys.argv[1], rank=0, world_size=1)
torch.cuda.set_device(0)
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.types import ShardingEnv
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor
from shardrec.embeddings.optim import attach_fused_optimizer
from shardrec.trainer.distributed.rank_process import exit_after_cuda_failure
from shardrec.trainer.model.build import trainer_sharders

ebc = EmbeddingBagCollection(
    tables=[EmbeddingBagConfig(name="t", embedding_dim=4, num_embeddings=100, feature_names=["f"])],
    device=torch.device("meta"),
)
attach_fused_optimizer(ebc, ["t"], optimizer="sgd", lr=1.0, eps=1e-8)
model = DistributedModelParallel(
    ebc, env=ShardingEnv.from_process_group(dist.GroupMember.WORLD), device=torch.device("cuda", 0),
    sharders=trainer_sharders(None),
)
try:
    for ids in ([3, 99], [3, 150]):
        kjt = KeyedJaggedTensor(keys=["f"], values=torch.tensor(ids), lengths=torch.tensor([1, 1], dtype=torch.int32))
        model(kjt.to("cuda"))["f"].sum().backward()
        torch.cuda.synchronize()
        print("trained", ids, flush=True)
except Exception:
    exit_after_cuda_failure()
"""


def test_an_id_beyond_its_table_on_a_gpu_ends_the_rank_at_once(tmp_path: Path) -> None:
    """fbgemm's FATAL bounds check on CUDA is a device-side assert: the rank ends instead of
    training row 0 or hanging, and says why; torchrun then stops its peers. Which ends it first,
    the rank's own exit (1) or NCCL's watchdog (SIGABRT), varies: the failure is known by its
    message (fbgemm's assert, or CUDA's error that reports it), whatever the exit."""
    done = subprocess.run(
        [sys.executable, "-c", _BAD_ID_ON_CUDA, str(tmp_path / "store")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    said = done.stdout + done.stderr
    assert done.returncode != 0, said[-3000:]
    assert done.stdout.splitlines()[:1] == ["trained [3, 99]"], said[-3000:]
    assert "trained [3, 150]" not in done.stdout and "Setting idx to zero" not in said
    assert re.search(r"device-side assert|idx < num_rows", said), said[-3000:]
