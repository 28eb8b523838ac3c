import pytest

from shardrec.trainer import versions


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
