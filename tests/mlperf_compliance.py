"""The checks mlcommons/logging's compliance checker makes of a closed dlrm_dcnv2 log (ruleset
training_6.0.0: common.yaml, closed_common.yaml, closed_dlrm_dcnv2.yaml), restated for the tests:
mlperf-logging is not on this project's package index. Each check is the YAML's, cited by key.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

EXACTLY_ONE = (
    "submission_org submission_platform submission_division submission_benchmark init_stop run_start run_stop "
    "train_samples eval_samples gradient_accumulation_steps global_batch_size opt_name opt_base_learning_rate "
    "opt_adagrad_learning_rate_decay opt_weight_decay opt_adagrad_initial_accumulator_value opt_adagrad_epsilon "
    "opt_learning_rate_warmup_steps opt_learning_rate_decay_start_step opt_learning_rate_decay_steps"
).split()
AT_LEAST_ONE = (
    "cache_clear init_start epoch_start epoch_stop eval_start eval_stop eval_accuracy".split()
)
ZERO = (
    "opt_adagrad_learning_rate_decay opt_weight_decay opt_adagrad_initial_accumulator_value "
    "opt_learning_rate_warmup_steps opt_learning_rate_decay_start_step opt_learning_rate_decay_steps"
).split()


def read_log(path: Path) -> list[dict[str, Any]]:
    """The parser's reading (ruleset_600.py): the JSON after ':::MLLOG ' on each line; any other
    line fails."""
    records = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        head, sep, body = line.partition(":::MLLOG ")
        assert sep and not head, f"{path}:{number}: not an MLLOG line: {line!r}"
        records.append(json.loads(body))
    return records


def compliance_errors(records: list[dict[str, Any]], eval_samples: int, target: float) -> list[str]:
    """What the checker would report for a closed dlrm_dcnv2 log (eval_samples: 89137319 on the real
    data; target: 0.80275); [] when it passes, ATLEAST_ONE_CHECK on the target included."""
    errors: list[str] = []
    by_key: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        assert list(r) == ["namespace", "time_ms", "event_type", "key", "value", "metadata"], r
        assert isinstance(r["time_ms"], int) and {"file", "lineno"} <= set(r["metadata"]), r
        by_key.setdefault(r["key"], []).append(r)
    for key in EXACTLY_ONE:
        if len(by_key.get(key, [])) != 1:
            errors.append(f"{key}: {len(by_key.get(key, []))} lines, not exactly one")
    for key in AT_LEAST_ONE:
        if not by_key.get(key):
            errors.append(f"{key}: missing")
    if errors:
        return errors
    keys = [r["key"] for r in records]
    one = {k: by_key[k][0] for k in EXACTLY_ONE}
    checks = [
        (one["submission_org"]["value"] != "", "submission_org empty"),
        (one["submission_platform"]["value"] != "", "submission_platform empty"),
        (one["submission_division"]["value"] == "closed", "submission_division not closed"),
        (
            one["submission_benchmark"]["value"] == "dlrm_dcnv2",
            "submission_benchmark not dlrm_dcnv2",
        ),
        (one["gradient_accumulation_steps"]["value"] > 0, "gradient_accumulation_steps not > 0"),
        (one["opt_name"]["value"] == "adagrad", "opt_name not adagrad"),
        (one["opt_adagrad_epsilon"]["value"] == 1e-8, "opt_adagrad_epsilon not 1e-8"),
        (
            one["eval_samples"]["value"] == eval_samples,
            f"eval_samples {one['eval_samples']['value']}",
        ),
        (one["train_samples"]["value"] != "", "train_samples empty"),
        ("value" in by_key["cache_clear"][0], "cache_clear without a value"),
        # init_start before init_stop before run_start; init within 30 minutes (closed).
        (
            keys.index("init_start") < keys.index("init_stop") < keys.index("run_start"),
            "init / run order",
        ),
        (
            one["init_stop"]["time_ms"] - by_key["init_start"][0]["time_ms"] < 30 * 60 * 1e3,
            "init_stop more than 30 minutes after init_start",
        ),
        (keys.index("run_start") < keys.index("run_stop"), "run_stop before run_start"),
        ("status" in one["run_stop"]["metadata"], "run_stop without a status"),
        (
            any(target <= r["value"] <= 1.0 for r in by_key["eval_accuracy"]),
            f"no eval_accuracy in [{target}, 1]",
        ),
    ]
    checks += [(one[k]["value"] == 0, f"{k} not 0") for k in ZERO]
    for key in ("epoch_start", "epoch_stop", "eval_start", "eval_stop", "eval_accuracy"):
        checks.append(
            (all("epoch_num" in r["metadata"] for r in by_key[key]), f"{key} without epoch_num")
        )
    return [why for ok, why in checks if not ok]


DLRMV4_EXACTLY_ONE = (
    "submission_org submission_platform submission_division submission_benchmark init_stop run_start "
    "run_stop train_samples eval_samples gradient_accumulation_steps global_batch_size "
    "max_sequence_length opt_name opt_base_learning_rate opt_adam_beta_1 opt_adam_beta_2 "
    "opt_adam_epsilon opt_weight_decay opt_gradient_clip_norm opt_sparse_name "
    "opt_sparse_base_learning_rate opt_learning_rate_warmup_steps opt_learning_rate_warmup_start_lr "
    "eval_every_data_pct"
).split()
DLRMV4_AT_LEAST_ONE = (
    "cache_clear init_start block_start block_stop eval_start eval_stop eval_accuracy".split()
)


def dlrmv4_compliance_errors(
    records: list[dict[str, Any]],
    *,
    train_samples: int,
    eval_samples: int,
    interval_samples: int,
    first_eval_samples: int,
    target: float,
) -> list[str]:
    """What the checker would report for a closed dlrmv4 log (ruleset training_6.1.0 of
    mlcommons/logging PR #470: common.yaml, closed_common.yaml, closed_dlrmv4.yaml), with the
    dataset's figures as arguments (the rules': 2290835423 train and 2058204 eval samples, the
    interval ROUND(0.001 x FLOOR(train / GBS)) x GBS, the first evaluation at the interval's first
    multiple past FLOOR((4480 GBS + 135331840) / 3), target 0.75) and the values the rules fix
    checked as written; [] when it passes."""
    errors: list[str] = []
    by_key: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        assert list(r) == ["namespace", "time_ms", "event_type", "key", "value", "metadata"], r
        by_key.setdefault(r["key"], []).append(r)
    for key in DLRMV4_EXACTLY_ONE:
        if len(by_key.get(key, [])) != 1:
            errors.append(f"{key}: {len(by_key.get(key, []))} lines, not exactly one")
    for key in DLRMV4_AT_LEAST_ONE:
        if not by_key.get(key):
            errors.append(f"{key}: missing")
    if errors:
        return errors
    one = {k: by_key[k][0]["value"] for k in DLRMV4_EXACTLY_ONE}
    keys = [r["key"] for r in records]
    accuracy = by_key["eval_accuracy"]
    checks = [
        (one["submission_benchmark"] == "dlrmv4", "submission_benchmark not dlrmv4"),
        (one["submission_division"] == "closed", "submission_division not closed"),
        (one["train_samples"] == train_samples, f"train_samples {one['train_samples']}"),
        (one["eval_samples"] == eval_samples, f"eval_samples {one['eval_samples']}"),
        (one["opt_name"] == "Adam", "opt_name not Adam"),
        (one["opt_adam_beta_1"] == 0.95 and one["opt_adam_beta_2"] == 0.999, "Adam betas"),
        (one["opt_adam_epsilon"] == 1e-8, "opt_adam_epsilon not 1e-8"),
        (one["opt_weight_decay"] == 0.0, "opt_weight_decay not 0"),
        (one["opt_gradient_clip_norm"] == 1.0, "opt_gradient_clip_norm not 1.0"),
        (one["opt_sparse_name"] == "RowWiseAdagrad", "opt_sparse_name not RowWiseAdagrad"),
        (
            one["opt_sparse_base_learning_rate"] == one["opt_base_learning_rate"],
            "opt_sparse_base_learning_rate differs from opt_base_learning_rate",
        ),
        (one["opt_learning_rate_warmup_start_lr"] == 0.0, "warm-up does not start at 0"),
        (
            keys.index("init_start") < keys.index("init_stop") < keys.index("run_start"),
            "init / run order",
        ),
        ("status" in by_key["run_stop"][0]["metadata"], "run_stop without a status"),
        (
            all("samples_count" in r["metadata"] for r in accuracy),
            "eval_accuracy without samples_count",
        ),
        (
            all(r["metadata"]["samples_count"] % interval_samples == 0 for r in accuracy),
            "an eval_accuracy off the evaluation grid",
        ),
        (
            accuracy[0]["metadata"]["samples_count"] == first_eval_samples,
            f"first eval_accuracy at {accuracy[0]['metadata']['samples_count']}, not {first_eval_samples}",
        ),
        (all(0.0 <= r["value"] <= 1.0 for r in accuracy), "an eval_accuracy outside [0, 1]"),
        (any(r["value"] >= target for r in accuracy), f"no eval_accuracy >= {target}"),
        (not by_key.get("epoch_start") and not by_key.get("epoch_stop"), "epoch events"),
    ]
    for key in ("block_start", "block_stop", "eval_start", "eval_stop"):
        checks.append(
            (
                all("samples_count" in r["metadata"] for r in by_key[key]),
                f"{key} without samples_count",
            )
        )
    return [why for ok, why in checks if not ok]
