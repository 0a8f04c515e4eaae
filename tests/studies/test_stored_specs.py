"""A study's stored spec that predates a field reads as the study ran: ``lr_tuning.refine`` (issue 39
item 3), absent from every ``study_spec.yaml`` written before it, means ``refine: 0`` there, while a
new spec defaults to 2. The stored spec is the real one of ``fixtures/study_before_37.tar.gz`` (a
compare study: 3-point grid, no extension), no Ray."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from studies.kinds import kind_for, load_study
from studies.kinds.search.spec import StudySpec
from studies.running import _check_unchanged
from studies.schema import SpecError, stored_defaults_missing
from studies.study_dir import SPEC_FILE, StudyDir

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "study_before_37.tar.gz"
SEARCH_SPEC = Path(__file__).resolve().parents[2] / "studies" / "specs" / "autonorm_search.yaml"


def _old_spec(tmp_path: Path) -> Path:
    """The study's ``study_spec.yaml``, written by commit 49c576e, at ``tmp_path``."""
    with tarfile.open(FIXTURE) as tar:
        member = tar.extractfile("autonorm-study-before-37/runs/before_37/study_spec.yaml")
        assert member is not None
        text = member.read().decode("utf-8")
    assert "refine" not in text and "max_extensions: 0" in text
    path = tmp_path / "old_spec.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_a_stored_spec_without_refine_reads_as_refine_0(tmp_path: Path) -> None:
    path = _old_spec(tmp_path)
    stored, fresh = load_study(path, stored=True), load_study(path)
    assert stored.lr_tuning.refine == 0 and fresh.lr_tuning.refine == 2  # a new spec: today's default
    # ... and its trials ran one process each (before ``execution`` existed), a new spec's stacked
    assert stored.execution.stack == "off" and fresh.execution.stack == "auto"
    # ... and it had no training-adequacy check (issue #47), which a new spec runs
    assert stored.analysis.adequacy.check is False and fresh.analysis.adequacy.check is True
    same = {"lr_tuning": fresh.lr_tuning, "execution": fresh.execution, "analysis": fresh.analysis}
    assert stored.model_copy(update=same) == fresh
    # what the study runs: no refinement phase as stored, one (2 rates x 2 arms x 2 seeds) as new
    assert not any(p.refine for p in kind_for(stored).phases(stored))
    assert [len(p.configs) for p in kind_for(fresh).phases(fresh) if p.refine] == [8]
    # an override still wins over what the stored spec means
    assert load_study(path, ["lr_tuning.refine=4"], stored=True).lr_tuning.refine == 4
    # a spec stored with the field keeps its value
    again = tmp_path / "new_spec.yaml"
    again.write_text(fresh.to_yaml(), encoding="utf-8")
    assert "refine: 2" in again.read_text() and load_study(again, stored=True).lr_tuning.refine == 2


def test_the_search_kinds_stored_spec_reads_confirm_lr_tuning_refine_as_0() -> None:
    spec = load_study(SEARCH_SPEC)
    assert spec.confirm is not None and spec.confirm.lr_tuning is not None
    doc = spec.to_document()
    assert doc["confirm"]["lr_tuning"].pop("refine") == 2
    assert stored_defaults_missing(doc, StudySpec) == {"confirm.lr_tuning.refine": 0}
    doc["confirm"]["lr_tuning"] = None  # no tuning (or no confirm:): nothing to read
    assert stored_defaults_missing(doc, StudySpec) == {}
    assert stored_defaults_missing(StudySpec(name="s").to_document(), StudySpec) == {}


def test_resuming_a_study_stored_without_refine_is_no_changed_spec(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _old_spec(tmp_path)
    here = f"storage_path={tmp_path / 'runs'}"
    where = StudyDir.of(load_study(path, [here]))
    where.write_text(SPEC_FILE, path.read_text(encoding="utf-8"))

    # `run SPEC` again, the spec leaving refine to its default: resumes as the study ran
    resumed = _check_unchanged(load_study(path, [here]), where, allow_changed=False)
    assert resumed.lr_tuning.refine == 0
    assert "lr_tuning.refine: 0, as the study ran" in capsys.readouterr().out
    # `resume STUDY_DIR` reads the stored spec: the same, nothing said
    assert _check_unchanged(load_study(path, [here], stored=True), where, allow_changed=False) == resumed
    assert capsys.readouterr().out == ""
    # a spec that asks for refinement itself is another study
    with pytest.raises(SpecError) as err:
        _check_unchanged(load_study(path, [here, "lr_tuning.refine=2"]), where, allow_changed=False)
    assert [i.path for i in err.value.issues] == ["lr_tuning.refine"]
    # a study stored with refine: 2 resumes with it
    new = load_study(path, [here])
    where.write_text(SPEC_FILE, new.to_yaml())
    assert _check_unchanged(new, where, allow_changed=False).lr_tuning.refine == 2
