"""The unsharded train module: the model (DLRM / DCNv2, or HSTU) with its loss, its embeddings on
the meta device until sharding.

The dense layers' initial weights are drawn here, before sharding, from a seeded global RNG, so
that two runs that differ only in their plan or world size start equal (the tables' weights are
plan-independent by construction: shardrec.embeddings.init).
"""

from __future__ import annotations

import logging

import torch
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from shardrec.dataloader.format.manifest import Manifest
from shardrec.embeddings.tables import build_ebc
from shardrec.trainer.distributed.dist import DistEnv
from shardrec.trainer.job.model_section import ModelConfig
from shardrec.trainer.job.precision import (
    auto_precision_line,
    check_precision,
    resolve_precision,
)
from shardrec.trainer.model.hstu_model import build_hstu_model
from shardrec.trainer.model.models import build_model, dense_parameters, resolve_compile
from shardrec.trainer.model.objective import TrainModule

logger = logging.getLogger(__name__)


def build_train_module(
    model_config: ModelConfig,
    manifest: Manifest,
    tables: list[EmbeddingBagConfig],
    env: DistEnv,
    *,
    global_batch_size: int,
    seed: int,
    precision: str = "fp32",
    allow_emulated_bf16: bool = False,
    compile_setting: str = "off",
    sequence_dedup: bool = False,
    loss_weight: float = 1.0,
) -> TrainModule:
    """The unsharded model (embeddings on the meta device, dense layers on `env.device`) wrapped
    with its loss; `seed` seeds the dense layers' initial weights; `precision`, `compile_setting`
    and `allow_emulated_bf16` are train.precision, train.compile and train.allow_emulated_bf16;
    `sequence_dedup` (HSTU) sends each table's distinct ids only. ValueError for bf16 on a device
    that only emulates it, unless allowed (the slowdown is measured and said)."""
    if model_config.arch == "hstu":
        return _hstu_train_module(
            model_config,
            manifest,
            tables,
            env,
            global_batch_size=global_batch_size,
            seed=seed,
            precision=precision,
            compile_setting=compile_setting,
            sequence_dedup=sequence_dedup,
            loss_weight=loss_weight,
        )
    device_type = env.device.type
    resolved = resolve_precision(precision, device_type)
    note = check_precision(resolved, device_type, allow_emulated_bf16)
    if env.is_main and note:
        logger.warning(note)
    if env.is_main and precision == "auto":
        logger.info(auto_precision_line(device_type))
    torch.manual_seed(seed)
    model = build_model(
        model_config,
        build_ebc(tables, "meta"),
        [name for t in tables for name in t.feature_names],
        len(manifest.dense_features),
        dense_device=env.device,
        precision=resolved,
    )
    if resolve_compile(compile_setting, device_type, dense_parameters(model)):
        if env.is_main:
            logger.info("compiling the dense layers and the interaction (train.compile)")
        model.compile_dense(fall_back=compile_setting == "auto")
    return TrainModule(model, global_batch_size, env.world_size, loss_weight)


def _hstu_train_module(
    model_config: ModelConfig,
    manifest: Manifest,
    tables: list[EmbeddingBagConfig],
    env: DistEnv,
    *,
    global_batch_size: int,
    seed: int,
    precision: str,
    compile_setting: str,
    sequence_dedup: bool,
    loss_weight: float,
) -> TrainModule:
    """HSTU's train module: fp32 (train.precision auto means fp32 here), not compiled."""
    if precision not in ("fp32", "auto"):
        raise ValueError(f'train.precision = "{precision}": HSTU trains in fp32 here (use "fp32")')
    if compile_setting == "on":
        raise ValueError(
            'train.compile = "on": HSTU\'s layers are not compiled (use "auto" or "off")'
        )
    torch.manual_seed(seed)
    with torch.device(env.device):  # the dense layers; the tables stay on the meta device
        hstu = build_hstu_model(
            model_config,
            tables,
            manifest.sparse_features,
            len(manifest.dense_features),
            dedup=sequence_dedup,
        )
    return TrainModule(hstu, global_batch_size, env.world_size, loss_weight)


def build_meta_model(
    model_config: ModelConfig, configs: list[EmbeddingBagConfig], manifest: Manifest
) -> torch.nn.Module:
    """The job's model with its dense layers on the meta device, for counting what every rank holds
    besides tables (`shardrec plan`'s dense footprint). ValueError for a model config that cannot
    be built."""
    names = [name for config in configs for name in config.feature_names]
    if model_config.arch == "hstu":
        with torch.device("meta"):
            return build_hstu_model(
                model_config, configs, manifest.sparse_features, len(manifest.dense_features)
            )
    return build_model(
        model_config,
        build_ebc(configs),
        names,
        len(manifest.dense_features),
        dense_device="meta",
    )
