"""Job file and --set mistakes are one line naming the file, the key and a near miss."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from shardrec.trainer.job.config import load_job_config


def test_job_file_mistakes_name_the_file_and_suggest(tmp_path: Path) -> None:
    """A section typo names the section and the file; an unknown key the file and the near miss; a
    wrong type is said in words."""
    job = tmp_path / "job.toml"
    job.write_text("[trian]\nsteps = 3\n")
    with pytest.raises(
        ValueError,
        match=rf"^{re.escape(str(job))}: unknown section \[trian\]; did you mean train\?$",
    ):
        load_job_config(job)
    job.write_text("[train]\nsed = 3\n")
    with pytest.raises(
        ValueError,
        match=rf"^{re.escape(str(job))}:2: unknown key 'sed' in \[train\]; did you mean seed\?$",
    ):
        load_job_config(job)
    job.write_text("[train]\nseed = 'x'\n")
    with pytest.raises(
        ValueError, match=rf'^{re.escape(str(job))}:2: train.seed = "x" should be an integer$'
    ):
        load_job_config(job)
    with pytest.raises(
        ValueError, match=r"^--set 'train.sed=1': unknown key train.sed; did you mean train.seed\?$"
    ):
        load_job_config(None, ["train.sed=1"])
    with pytest.raises(
        ValueError, match=r"^--set 'train.seed=-2': train.seed = -2 must be >= 0 \(or -1: unset\)$"
    ):
        load_job_config(None, ["train.seed=-2"])
    # Values are shown as the file writes them; a word where a number belongs is told so.
    job.write_text("[train]\nseed = true\n")
    with pytest.raises(ValueError, match=r"train.seed = true should be an integer$"):
        load_job_config(job)
    with pytest.raises(
        ValueError,
        match=r"^--set 'optim.dense_lr=fast': cannot parse 'fast' as a value; optim.dense_lr is a "
        r"number$",
    ):
        load_job_config(None, ["optim.dense_lr=fast"])


def test_a_key_in_the_wrong_section_is_told_the_section_it_belongs_to(tmp_path: Path) -> None:
    """`--set train.dense_lr=0.1` was told "did you mean train.device?"; `dense_lr` under [train]
    got the list of [train]'s keys; `steps = 5` above every section was "unknown section [steps]"."""
    with pytest.raises(ValueError) as e:
        load_job_config(None, ["train.dense_lr=0.1"])
    assert str(e.value) == (
        "--set 'train.dense_lr=0.1': unknown key train.dense_lr; did you mean optim.dense_lr?"
    )
    with pytest.raises(ValueError, match=r"did you mean eval.interval_steps or checkpoint.inter"):
        load_job_config(None, ["train.interval_steps=3"])
    job = tmp_path / "job.toml"
    job.write_text("[train]\ndense_lr = 0.1\n")
    with pytest.raises(ValueError) as e:
        load_job_config(job)
    assert str(e.value) == f"{job}:2: unknown key 'dense_lr' in [train]; it is a key of [optim]"
    job.write_text("# the job\nsteps = 5\n[train]\nseed = 1\n")
    with pytest.raises(ValueError) as e:
        load_job_config(job)
    assert str(e.value) == f"{job}:2: steps = 5 is set before any section: put it under [train]"


def test_a_setting_is_named_with_its_line_and_a_later_check_finds_it(tmp_path: Path) -> None:
    """A wrong value names the line that sets it (a dotted key, a [section] key, a table's inline
    value); a check made later, against the dataset's tables (sharding constraints), finds the line
    by the key its message starts with; --set names itself."""
    job = tmp_path / "job.toml"
    job.write_text(
        "# a job\n[model]\narch = 'dlrm'\n\n[optim]\nsparse_lr = 0.1\ndense_lr = 'fast'\n"
    )
    with pytest.raises(ValueError, match=rf'^{re.escape(str(job))}:7: optim.dense_lr = "fast"'):
        load_job_config(job)
    job.write_text("train.seed = 1\noptim.sparse_lr = -1\n")
    with pytest.raises(ValueError, match=rf"^{re.escape(str(job))}:2: optim.sparse_lr = -1"):
        load_job_config(job)
    job.write_text(
        "[sharding]\nqcomm = ''\n\n[sharding.constraints]\n"
        "t_a = { sharding_types = ['row_wise'] }\nt_b = { sharding_types = ['colum_wise'] }\n"
    )
    config = load_job_config(job)
    message = "sharding.constraints.t_b.sharding_types: 'colum_wise' is not one of ..."
    assert config.located(message) == f"{job}:6: {message}"
    unknown = "sharding.constraints.t_a: unknown table 't_a' (tables: t_c)"
    assert config.located(unknown) == f"{job}:5: {unknown}"
    assert config.located("data: no such dataset") == "data: no such dataset"
    overridden = load_job_config(job, ["sharding.constraints={}"])
    assert overridden.located(message) == f"--set 'sharding.constraints={{}}': {message}"
    assert "key_origins" not in overridden.to_dict()


def test_a_constraint_that_is_not_a_table_names_the_job_file(tmp_path: Path) -> None:
    # Before: 'sharding.constraints.t_C1 = 3 should be a table of settings', no file or line.
    job = tmp_path / "job.toml"
    job.write_text("[train]\nseed = 1\n\n[sharding]\nconstraints = { t_C1 = 3 }\n")
    said = "sharding.constraints.t_C1 = 3 should be a table of settings"
    with pytest.raises(ValueError, match=rf"^{re.escape(f'{job}:5: {said}')}$"):
        load_job_config(job)
    job.write_text("[sharding.constraints]\nt_C1 = 3\n")
    with pytest.raises(ValueError, match=rf"^{re.escape(f'{job}:1: {said}')}$"):
        load_job_config(job)


def test_a_list_set_without_brackets_is_told_the_brackets_that_work() -> None:
    with pytest.raises(ValueError) as e:
        load_job_config(None, ["model.dense_arch=64,16"])
    assert str(e.value) == (
        "--set 'model.dense_arch=64,16': cannot parse '64,16' as a value; a list is written in "
        "brackets: --set 'model.dense_arch=[64, 16]'"
    )
    hinted = str(e.value).split("--set '")[-1].rstrip("'")
    assert load_job_config(None, [hinted]).model.dense_arch == [64, 16]


@pytest.mark.parametrize("typed, hint", [("False", "false"), ("no", "false"), ("YES", "true")])
def test_a_bool_set_as_python_or_words_is_told_the_lowercase_that_works(
    typed: str, hint: str
) -> None:
    """`--set data.shuffle=False` was told to "write it as in a TOML file (a string in quotes)",
    and "False" in quotes is refused as no bool either."""
    with pytest.raises(ValueError) as e:
        load_job_config(None, [f"data.shuffle={typed}"])
    assert str(e.value) == (
        f"--set 'data.shuffle={typed}': cannot parse {typed!r} as a value; data.shuffle is true or "
        f"false, in lowercase: --set data.shuffle={hint}"
    )
    hinted = str(e.value).split("--set ")[-1]
    assert load_job_config(None, [hinted]).data.shuffle is (hint == "true")


def test_a_table_set_that_is_no_toml_names_its_own_key_in_the_hint() -> None:
    """`--set 'tables.C3={kind=managed}'` was told to write `--set 'KEY={ ... }'`: no key, and
    braces it had already written; the string left unquoted was the fault."""
    with pytest.raises(ValueError) as e:
        load_job_config(None, ["tables.C3={kind=managed}"])
    assert str(e.value) == (
        "--set 'tables.C3={kind=managed}': cannot parse '{kind=managed}' as a value; a table is "
        "written in braces, as TOML's inline tables, its strings in quotes: "
        "--set 'tables.C3={ key = \"text\", n = 1 }'"
    )
    with pytest.raises(ValueError, match=r"tables.C3.rows is an integer$"):
        load_job_config(None, ["tables.C3.rows=many"])


def test_a_recency_prior_without_a_relative_bias_is_refused_naming_both_keys() -> None:
    """model.hstu_recency shapes the pairwise bias; with the input encoding alone it would do
    nothing, silently."""
    with pytest.raises(ValueError) as e:
        load_job_config(None, ['model.arch="hstu"', "model.hstu_recency=0.3"])
    assert str(e.value) == (
        "--set 'model.hstu_recency=0.3': model.hstu_recency = 0.3 shapes the relative bias, which "
        'model.hstu_bias = "input" does not have: set it to "pairwise" or "both"'
    )
    with pytest.raises(ValueError, match=r"model.hstu_recency = -1.0 must be >= 0$"):
        load_job_config(None, ['model.hstu_bias="pairwise"', "model.hstu_recency=-1.0"])
    both = ['model.hstu_bias="both"', "model.hstu_recency=0.3"]
    assert load_job_config(None, both).model.hstu_recency == 0.3


@pytest.mark.parametrize(
    "setting", ["optim.sparse_lr=nan", "optim.clip_grad_norm=nan", "optim.loss_weight=inf"]
)
def test_a_rate_or_weight_that_is_no_finite_number_is_refused_naming_the_key(setting: str) -> None:
    """TOML's nan and inf are floats: a sparse rate of nan reached torch at the first step without
    its key, a clipping norm of nan trained into a NaN loss that blamed optim.dense_lr."""
    key, value = setting.split("=")
    with pytest.raises(
        ValueError, match=rf"^--set '{setting}': {key} = {value} must be a finite number$"
    ):
        load_job_config(None, [setting])


@pytest.mark.parametrize(
    ("settings", "said"),
    [
        (["optim.decay_start=5"], "optim.decay_start = 5 and optim.decay_steps = 0"),
        (["optim.decay_steps=4"], "optim.decay_start = 0 and optim.decay_steps = 4"),
    ],
)
def test_a_decay_given_half_is_refused_not_trained_without_it(settings: list[str], said: str):
    """The schedule decays only where both are set: one alone trained at the peak rate to the end
    without a word."""
    with pytest.raises(ValueError) as refused:
        load_job_config(None, settings)
    assert str(refused.value).endswith(
        f"{said}: a decay needs both (the step it starts at, the steps it lasts); "
        "set the other, or neither for no decay"
    ), str(refused.value)
    assert (
        load_job_config(None, ["optim.decay_start=5", "optim.decay_steps=4"]).optim.decay_steps == 4
    )


def test_a_key_given_by_its_flag_and_by_set_is_refused_not_resolved_silently(
    tmp_path: Path,
) -> None:
    # `--steps 5 --set train.steps=10` trained 5 steps without a word (the flag won, as only a
    # docstring said): which of two values the user meant, no rule of precedence can tell.
    from helpers import assert_one_line_error
    from typer.testing import CliRunner

    from shardrec.tools.cli.app import app

    out = tmp_path / "run"
    result = CliRunner().invoke(
        app,
        ["train", "--data", str(tmp_path / "data"), "--steps", "5", "--set", "train.steps=10",
         "--out-dir", str(out)],
    )  # fmt: skip
    assert_one_line_error(
        result,
        re.escape("error: --steps 5 and --set 'train.steps=10' both set train.steps: give one"),
    )
    assert not out.exists()
