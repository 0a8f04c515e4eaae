"""Names of everything a study writes to MLflow: tag keys, run names, source tags, UI links, the study key."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from workers.dotted import get_path
from workers.members import member_params, member_stacks, views
from workers.trainable import config_from_result

TAG_ROLE = "autonorm.role"
TAG_STUDY_KEY = "autonorm.study_key"
"""The study's key (:func:`study_key` of the study directory), the same on every run of the study:
study, phase, trial and summary runs. ``tags.`autonorm.study_key` = '<key>'`` selects one study."""
TAG_RUN_KEY = "autonorm.run_key"
"""The key a study or phase run is found again by (:func:`study_key` of its Tune experiment path);
for a study run (or a one-plan study) equal to its ``autonorm.study_key``."""
TAG_STUDY_NAME = "autonorm.study_name"
"""The spec's ``name``, on every run of the study."""
TAG_KIND = "autonorm.kind"
"""The study's kind (``batchsize``, ``search``), on every run of the study."""
TAG_SPEC_HASH = "autonorm.spec_hash"
TAG_TRIAL_ID = "ray.trial_id"
TAG_GROUP = "autonorm.stack_group"
"""On a stacked member's trial run: the folder of the Tune trial its group trained in (``execution.stack``)."""
TAG_TRIAL_STATUS = "autonorm.trial_status"
TAG_PARENT = "mlflow.parentRunId"
TAG_UNDELIVERED = "autonorm.undelivered_trials"
ROLE_STUDY = "study"
ROLE_PHASE = "phase"
ROLE_TRIAL = "trial"
ROLE_SUMMARY = "summary"
"""A per-arm summary run under a phase run (means and CIs over seeds, ``step`` = the phase's axis):
never a trial (``plan``, ``status``, ``expected_trials`` and trial counts read ``role=trial`` only)."""
TAG_PHASE = "autonorm.phase"
TAG_ARM = "autonorm.arm"
STUDY_WIDE_TAGS = (TAG_STUDY_KEY, TAG_STUDY_NAME, TAG_KIND, TAG_SPEC_HASH)
"""Tags a plan's run passes on to each of its trial runs, as they are (with ``autonorm.phase`` and
``autonorm.arm``)."""
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
"""Every experiment a study creates or writes to carries ``mlflow.experimentKind=custom_model_development``:
MLflow 3 opens it in its training view (runs table, charts), not the GenAI view."""
TRAINING_VIEW = "machine_learning"
"""The MLflow UI's ``workflowType`` of its training view ("Model training"), in every link we print."""
TRIAL_TAG_PREFIX = "autonorm.trial_tag."
"""A plan tag ``autonorm.trial_tag.<name>`` is not put on the plan's run: each trial run gets the tag
``autonorm.<name>``, its value a :func:`render_run_name` template (``{model.layer.type}``)."""
SOURCE_GIT_COMMIT = "mlflow.source.git.commit"
SOURCE_NAME = "mlflow.source.name"
SOURCE_TYPE = "mlflow.source.type"
DEFAULT_UI = "http://127.0.0.1:5000"


_REPO_ROOT = Path(__file__).resolve().parents[2]


_FIELD = re.compile(r"\{([^{}:]+)(?::([^{}]*))?\}")
_MAX_RUN_NAME = 250


def render_run_name(template: str, config: Mapping[str, Any], index: int | str | None) -> str:
    """``template`` with each ``{dotted.path[:format]}`` replaced by the config's value there.

    ``{index}`` is the trial's number; a missing path renders as ``?``; a format spec that does not
    fit the value (``{index:03d}`` of a trial id) falls back to ``str``.
    """

    def field(match: re.Match[str]) -> str:
        path, spec = match.group(1).strip(), match.group(2) or ""
        value = index if path == "index" else get_path(config, path, default=None)
        if value is None:
            return "?"
        try:
            return format(value, spec)
        except (TypeError, ValueError):
            return str(value)

    return _FIELD.sub(field, template)[:_MAX_RUN_NAME]


_GENERATED_ID = re.compile(r"[0-9a-f]+_(\d{5})")
_LEADING_INT = re.compile(r"(\d+)")


def trial_index(trial: Any) -> int | None:
    """A trial's 1-based number in its experiment, from the ids Tune gives it.

    Tune's grid generator makes ids ``<prefix>_<counter:05d>`` (counter from 0); its searcher wrapper
    makes random ids and an ``experiment_tag`` starting with a counter from 1. ``None`` otherwise.
    """
    match = _GENERATED_ID.fullmatch(str(getattr(trial, "trial_id", "")))
    if match:
        return int(match.group(1)) + 1
    match = _LEADING_INT.match(str(getattr(trial, "experiment_tag", "") or ""))
    return int(match.group(1)) if match else None


_MEMBER_SUFFIX = re.compile(r"-m\d+$")


def record_run_name(
    template: str,
    *,
    plan_name: str,
    trial_id: str,
    config: Mapping[str, Any],
    experiment_tag: str | None = None,
) -> str:
    """The MLflow run name of a trial read back as a record (its id and resolved config): what the
    plan's :class:`TrialNamer` named its run (a stacked group's member ``<group id>-m<k>`` takes its
    group's ``{index}``, as its run did). A searcher's trial (a random id) takes its ``{index}`` from
    its ``experiment_tag``, which Tune puts in each of its results."""
    from types import SimpleNamespace

    index = trial_index(
        SimpleNamespace(trial_id=_MEMBER_SUFFIX.sub("", trial_id), experiment_tag=experiment_tag or "")
    )
    template = template or f"{plan_name}-{{index:03d}}"
    return render_run_name(template, config, index if index is not None else trial_id)


class TrialNamer:
    """Tune's ``trial_name_creator`` and the trial run's MLflow name: ``template`` rendered with the
    trial's resolved config (:func:`render_run_name`); a stacked group of several members (whose
    members each have a run named from their own config) is named for the group, :func:`group_name`.
    Picklable: Tune stores it with the experiment.

    Args:
        template: the plan's ``run_name``; empty means ``<plan name>-{index:03d}``.
        plan_name: the plan's name.
        base_config: the plan's base trial config (the trial's own params are applied on top).
    """

    def __init__(self, template: str, *, plan_name: str, base_config: Mapping[str, Any]) -> None:
        self.template = template or f"{plan_name}-{{index:03d}}"
        self.base_config = dict(base_config)
        self.plan_name = plan_name

    def config(self, trial: Any) -> dict[str, Any]:
        members = member_params(getattr(trial, "config", None))
        try:
            if members:  # a group of one stacked trial: named as that trial
                return config_from_result(None, self.base_config, members[0])
            return config_from_result(trial.last_result, self.base_config, dict(trial.config or {}))
        except Exception:  # a config the trial itself will reject: name it from what we have
            return dict(self.base_config)

    def _plan_name(self, trial: Any) -> str:
        """The plan's name; for a namer pickled with a study stored before it kept it, the name of
        the trial's experiment folder (the plan's), else nothing."""
        name = getattr(self, "plan_name", None)
        if name is None:
            with contextlib.suppress(Exception):
                name = str(trial.storage.experiment_dir_name or "")
        return name or ""

    def __call__(self, trial: Any) -> str:
        index = trial_index(trial)
        members = member_params(getattr(trial, "config", None))
        if members and len(members) > 1:  # a stacked group: named for the group, not a member
            return group_name(self._plan_name(trial), index if index is not None else trial.trial_id)
        return render_run_name(
            self.template, self.config(trial), index if index is not None else trial.trial_id
        )


GROUP_MEMBERS_FILE = "members.json"
"""In a stacked group's Tune folder: its members, each by its MLflow trial run's name
(:func:`group_members`), written by the tracking callback when the group starts."""


def group_name(plan_name: str, index: int | str) -> str:
    """A stacked group's name (Tune's trial name, and its folder's): ``<phase>-group<k>``, ``k`` its
    1-based number among the phase's groups, two digits at least (``confirm-epochs-group01``).

    A group holds stacks of several cells (arms, batch sizes), so no member's name fits it; its
    members are listed in its folder's :data:`GROUP_MEMBERS_FILE`. The name needs no trial id to be
    unique: groups are grid trials only, and a grid trial that Tune creates again after a restore
    (its driver killed before Tune saved the trial) is the same group, with the same id and number."""
    number = f"{index:02d}" if isinstance(index, int) else str(index)
    return f"{plan_name}-group{number}" if plan_name else f"group{number}"


def group_members(group: Any, name: Callable[[Any], str]) -> dict[str, Any]:
    """What a stacked group's :data:`GROUP_MEMBERS_FILE` holds: the group's name and Tune trial id,
    and per member (in member order ``k``) its MLflow run name (``name`` of its member view, as the
    tracking callback names the run), its trial id (the run's ``ray.trial_id``, ``<group id>-m<k>``),
    its stack (the cell's stacked model it trains in) and its own params; empty for a trial that is
    no group."""
    params = member_params(getattr(group, "config", None))
    if params is None:
        return {}
    stack_of = {k: s for s, ks in enumerate(member_stacks(group.config) or []) for k in ks}
    members = []
    for view in views(group):
        members.append(
            {
                "name": str(name(view)),
                "trial_id": view.trial_id,
                "k": view.k,
                "stack": stack_of.get(view.k, 0),
                "params": view.config,
            }
        )
    return {"group": str(name(group)), "trial_id": str(group.trial_id), "members": members}


_UNSAFE_DIRNAME = re.compile(r"[^A-Za-z0-9._=+-]+")


class TrialDirnamer:
    """Tune's ``trial_dirname_creator``: a trial's folder is named after its readable name (the
    :class:`TrialNamer`'s, ``corrected-B32-s0``), characters a path cannot hold replaced by ``_``.
    A name that rendered a missing field (``?``) or nothing gets ``_<trial id>`` appended, and so does
    one built from the trial's ``{index}``: Tune restores its trial counter from the last saved search
    state, so after a driver killed between creating a trial and saving that state a new trial gets an
    index (and a name) an earlier trial has. Two trials never share a folder (they would share, and
    overwrite, each other's checkpoints). A stacked group's folder is named for the group
    (:func:`group_name`, ``confirm-epochs-group01``) and lists its members in
    :data:`GROUP_MEMBERS_FILE`. Picklable: Tune stores it with the experiment.

    Only a new trial is named: a restored study's trials keep the folders Tune recorded for them (a
    study stored when a group was named ``<first member>+<N>`` resumes in those folders)."""

    def __init__(self, namer: TrialNamer) -> None:
        self.namer = namer

    def __call__(self, trial: Any) -> str:
        try:
            name = str(self.namer(trial))
        except Exception:
            name = ""
        clean = _UNSAFE_DIRNAME.sub("_", name).strip("._-")[:200]
        members = member_params(getattr(trial, "config", None))
        if clean and members and len(members) > 1:
            return clean  # a group's ``<phase>-group<k>`` (:func:`group_name`): unique as it is
        if not clean or "?" in name or "{index" in str(getattr(self.namer, "template", "")):
            return f"{clean or 'trial'}_{trial.trial_id}"
        return clean


def trial_tag_templates(plan_tags: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """Split a plan's tags into ``(tags of the plan's run, tag templates of every trial run)``.

    Trial runs get the plan's ``autonorm.phase``, ``autonorm.arm`` and :data:`STUDY_WIDE_TAGS` as they
    are, and ``autonorm.<name>`` for every ``autonorm.trial_tag.<name>`` (a template, rendered per
    trial), which does not go on the plan's run.
    """
    parent = {k: v for k, v in plan_tags.items() if not k.startswith(TRIAL_TAG_PREFIX)}
    trial = {k: v for k, v in parent.items() if k in (TAG_PHASE, TAG_ARM, *STUDY_WIDE_TAGS)}
    for key, value in plan_tags.items():
        if key.startswith(TRIAL_TAG_PREFIX):
            trial[f"autonorm.{key[len(TRIAL_TAG_PREFIX) :]}"] = value
    return parent, trial


@functools.lru_cache(maxsize=4)
def _git_head(root: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    commit = out.stdout.strip()
    return commit if out.returncode == 0 and commit else None


def _source_name(argv: Sequence[str]) -> str:
    script = argv[0] if argv else ""
    path = Path(script)
    if not script or path.name in ("autonorm-study", "__main__.py", "-c", "-m") or path.name == "cli.py":
        return "autonorm-study"
    with contextlib.suppress(ValueError, OSError):
        return path.resolve().relative_to(_REPO_ROOT).as_posix()
    return path.name


def source_tags(
    environ: Mapping[str, str] | None = None, argv: Sequence[str] | None = None
) -> dict[str, str]:
    """MLflow's standard source tags for every run of a study (study, phase and trial runs).

    ``mlflow.source.git.commit`` from ``AUTONORM_GIT_COMMIT`` (what ``autonorm-study submit`` passes to
    a job, whose working dir has no ``.git``), else ``git rev-parse HEAD`` of this checkout (once per
    process), omitted when neither is known; ``mlflow.source.name`` the entry script (``autonorm-study``
    for the CLI); ``mlflow.source.type`` ``JOB``.
    """
    env = os.environ if environ is None else environ
    tags = {SOURCE_NAME: _source_name(sys.argv if argv is None else argv), SOURCE_TYPE: "JOB"}
    commit = env.get("AUTONORM_GIT_COMMIT") or _git_head(str(_REPO_ROOT))
    if commit and commit != "unknown":
        tags[SOURCE_GIT_COMMIT] = commit
    return tags


def mlflow_links(tracking_uri: str, experiment_id: str, run_id: str | None = None) -> list[str]:
    """Direct links into the MLflow UI: the experiment's runs table, then the run (when given).

    The tracking server's own address for ``http(s)://`` URIs, ``http://127.0.0.1:5000`` otherwise
    (``mlflow ui --backend-store-uri <uri>`` serves it there). The runs table of MLflow's training
    view, not the experiment's default page: MLflow 3 opens an experiment on its GenAI overview, and
    its UI (3.17) takes the view from its "GenAI / Model training" switch, which the
    ``workflowType=machine_learning`` query sets (the experiment's ``mlflow.experimentKind`` tag says
    the same to every other reader).
    """
    base = tracking_uri.rstrip("/") if urlparse(tracking_uri).scheme in ("http", "https") else DEFAULT_UI
    view = f"?workflowType={TRAINING_VIEW}"
    links = [f"{base}/#/experiments/{experiment_id}/runs{view}"]
    if run_id:
        links.append(f"{base}/#/experiments/{experiment_id}/runs/{run_id}{view}")
    return links


def study_key(experiment_uri: str) -> str:
    """Stable key of a study: the same experiment path always finds the same parent run."""
    return hashlib.sha256(experiment_uri.encode()).hexdigest()[:16]
