import pytest

from shardrec.trainer.job import versions


def test_installed_stack_is_known_good():
    versions.check_stack()


def test_unknown_stack_names_the_versions_and_the_fix(monkeypatch):
    monkeypatch.setattr(versions, "found_stack", lambda: ("2.9.1+cpu", "1.3.0", "1.2.0"))
    with pytest.raises(ImportError) as e:
        versions.check_stack()
    message = str(e.value)
    assert "torch 2.9.1+cpu, fbgemm-gpu 1.3.0, torchrec 1.2.0" in message
    assert "make setup" in message


def test_missing_package_is_reported_as_none(monkeypatch):
    monkeypatch.setattr(versions, "found_stack", lambda: ("2.13.0", None, "1.8.0"))
    with pytest.raises(ImportError, match="fbgemm-gpu None"):
        versions.check_stack()


def test_allow_env_lets_exactly_the_named_triple_start(monkeypatch):
    monkeypatch.setattr(versions, "found_stack", lambda: ("2.11.0+cu130", "1.6.0", "1.6.1"))
    monkeypatch.delenv(versions.ALLOW_ENV, raising=False)
    with pytest.raises(
        ImportError, match=r"torch 2\.11\.0\+cu130, fbgemm-gpu 1\.6\.0, torchrec 1\.6\.1"
    ):
        versions.check_stack()
    monkeypatch.setenv(versions.ALLOW_ENV, "/".join(versions.GPU_CHECK_STACK))
    versions.check_stack()  # the lent GPU machine's triple, allowed for the check
    monkeypatch.setattr(versions, "found_stack", lambda: ("2.11.0+cu130", "1.6.0", "1.5.0"))
    with pytest.raises(
        ImportError,
        match=r"torchrec 1\.5\.0, .*SHARDREC_ALLOW_STACK allows 2\.11\.0/1\.6\.0/1\.6\.1 only",
    ):
        versions.check_stack()


def test_allow_env_with_a_bad_value_says_what_it_expects(monkeypatch):
    monkeypatch.setattr(versions, "found_stack", lambda: ("2.11.0", "1.6.0", "1.6.1"))
    monkeypatch.setenv(versions.ALLOW_ENV, "2.11.0/1.6.0")
    with pytest.raises(
        ImportError,
        match=r"SHARDREC_ALLOW_STACK='2\.11\.0/1\.6\.0': expected TORCH/FBGEMM/TORCHREC",
    ):
        versions.check_stack()


@pytest.mark.parametrize(
    "stack",
    [
        (
            "2.13.0+cu126",
            "1.8.0+cu126",
            "1.8.0",
        ),  # PyTorch's CUDA 12.6 index, for drivers older than 580
        ("2.13.0+cpu", "1.8.0+cpu", "1.8.0"),
        ("2.13.0", "1.8.0", "1.8.0+cu130"),
    ],
)
def test_builds_with_local_labels_of_the_pinned_releases_start(monkeypatch, stack):
    monkeypatch.setattr(versions, "found_stack", lambda: stack)
    monkeypatch.delenv(versions.ALLOW_ENV, raising=False)
    versions.check_stack()


def test_a_local_label_does_not_admit_another_release(monkeypatch):
    monkeypatch.setattr(versions, "found_stack", lambda: ("2.13.0+cu126", "1.7.0+cu126", "1.8.0"))
    monkeypatch.delenv(versions.ALLOW_ENV, raising=False)
    with pytest.raises(ImportError, match=r"fbgemm-gpu 1\.7\.0\+cu126"):
        versions.check_stack()
