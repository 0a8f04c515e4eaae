"""The study's runs in MLflow as the Tune callback sees them: its parent (study or phase) run found by
its stable key, one child run per trial found by its ``ray.trial_id`` tag -- never remembered across
processes, always rebuilt from MLflow."""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from workers.tracking.names import (
    ROLE_TRIAL,
    STUDY_WIDE_TAGS,
    TAG_GROUP,
    TAG_PARENT,
    TAG_ROLE,
    TAG_RUN_KEY,
    TAG_STUDY_KEY,
    TAG_TRIAL_ID,
    render_run_name,
    source_tags,
    trial_index,
)
from workers.tracking.outage import OutageBackoff
from workers.tracking.replay import trial_params_tag
from workers.tracking.store import MlflowUnavailable, flatten_params
from workers.trainable import config_from_result

if TYPE_CHECKING:
    from ray.tune.experiment import Trial

logger = logging.getLogger(__name__)


@dataclass
class _ChildRun:
    run_id: str
    last_epoch: float = -math.inf
    status: str = "RUNNING"
    # Params not sent yet: they go with the run's first metrics (one call, not two).
    unsent_params: list[Any] = field(default_factory=list)


def _folder_of(trial: Any) -> str:
    """A Tune trial's folder name (its readable name), its id when Tune cannot say."""
    with contextlib.suppress(Exception):
        name = str(trial.path).rstrip("/").rpartition("/")[2]
        if name:
            return name
    return str(trial.trial_id)


class TrialRuns(OutageBackoff):
    """Finds or creates the parent run and the trial runs; the configuration is the callback's."""

    key: str
    role: str
    nest_under: str | None
    study_name: str
    base_config: dict[str, Any]
    parent_tags: dict[str, str]
    parent_params: dict[str, str]
    artifacts: dict[str, str]
    expected_trials: int | None
    run_namer: Callable[[Any], str] | None
    trial_tags: dict[str, str]
    _parent_id: str | None
    _children: dict[str, _ChildRun]
    _uncreated: set[str]
    _artifacts_logged: bool
    # The trials (id, Tune status) of the last pass of closing the runs that left nothing undelivered,
    # while nothing has been written since; ``None`` otherwise (set by the callback).
    _settled: tuple[tuple[str, str], ...] | None = None

    @property
    def parent_run_id(self) -> str | None:
        return self._parent_id

    def _find_parent(self) -> Any | None:
        runs = self._search(f"tags.`{TAG_RUN_KEY}` = '{self.key}' and tags.`{TAG_ROLE}` = '{self.role}'")
        if not runs:  # a run made before runs carried their own key: its study key was its run key
            runs = self._search(
                f"tags.`{TAG_STUDY_KEY}` = '{self.key}' and tags.`{TAG_ROLE}` = '{self.role}'"
            )
            runs = [r for r in runs if TAG_RUN_KEY not in r.data.tags]
        if not runs:
            return None
        return min(runs, key=lambda r: r.info.start_time or 0)

    def prepare(self, *, fresh: bool, log_artifacts: bool = True) -> str:
        """Create (or find again) the experiment and the study's parent run; returns its id.

        Call in the driver before any trial starts: it also creates the sqlite schema.

        Args:
            fresh: Tune starts this experiment from scratch (no state to restore). A parent with the
                same key that already has children then belongs to a study whose Tune state is gone:
                it is closed and re-keyed, and a new parent is made.
        """
        from mlflow.entities import Param, RunTag

        experiment_id = self._ensure_experiment()
        parent = self._find_parent()
        if parent is not None and fresh and self._children_of(parent.info.run_id):
            old = parent.info.run_id
            logger.warning("experiment state is gone; superseding the previous parent run %s", old)
            for tag in (TAG_RUN_KEY, TAG_STUDY_KEY):
                value = parent.data.tags.get(tag, self.key)
                self._call(self.client.set_tag, old, tag, f"{value}:superseded")
            for run in self._children_of(old):
                if run.info.status == "RUNNING":
                    self._call(self.client.set_terminated, run.info.run_id, "KILLED")
            if parent.info.status == "RUNNING":
                self._call(self.client.set_terminated, old, "KILLED")
            parent = None
        if parent is None:
            tags = {**self._own_tags(), **source_tags(), **self.parent_tags}
            if self.nest_under:
                tags[TAG_PARENT] = self.nest_under
            run = self._call(self.client.create_run, experiment_id, tags=tags, run_name=self.study_name)
            parent_id = self._parent_id = run.info.run_id
            params = dict(self.parent_params)
            if self.expected_trials is not None:
                params["expected_trials"] = str(self.expected_trials)
            param_items = [Param(k, str(v)[:6000]) for k, v in params.items()]
            for i in range(0, len(param_items), 100):
                chunk = param_items[i : i + 100]
                self._call(self.client.log_batch, parent_id, params=chunk)
        else:
            parent_id = self._parent_id = parent.info.run_id
            if parent.info.status != "RUNNING":
                self._call(self.client.update_run, parent_id, status="RUNNING")
            if log_artifacts:
                tags = {**self._own_tags(), **source_tags(), **self.parent_tags}
                tags_list = [RunTag(k, str(v)) for k, v in tags.items()]
                self._call(self.client.log_batch, parent_id, tags=tags_list)
        if log_artifacts or not self._artifacts_logged:
            for name, text in self.artifacts.items():
                self._call(self.client.log_text, parent_id, text, name)
            self._artifacts_logged = True
        return parent_id

    def _own_tags(self) -> dict[str, str]:
        """The parent run's role and keys; the plan's tags may set the study key (a phase run's is
        the study run's key), else it is the run's own."""
        return {TAG_ROLE: self.role, TAG_RUN_KEY: self.key, TAG_STUDY_KEY: self.key}

    def _children_of(self, parent_id: str) -> list[Any]:
        return self._search(f"tags.`{TAG_PARENT}` = '{parent_id}' and tags.`{TAG_ROLE}` = '{ROLE_TRIAL}'")

    def _rebuild(self, runs: list[Any] | None = None) -> list[Any]:
        """The trial -> run map from MLflow itself (the only source that survives a driver crash),
        from ``runs`` (the parent's trial runs, listed by the caller) or a new listing; the runs."""
        if self._parent_id is None:
            raise RuntimeError("not attached to a parent run")
        if runs is None:
            runs = self._children_of(self._parent_id)
        self._children = {}
        for run in sorted(runs, key=lambda r: r.info.start_time or 0):
            trial_id = run.data.tags.get(TAG_TRIAL_ID)
            if trial_id is None or trial_id in self._children:
                continue
            self._children[trial_id] = _ChildRun(
                run_id=run.info.run_id,
                last_epoch=run.data.metrics.get("epoch", -math.inf),
                status=run.info.status,
            )
        return runs

    def _connect(self) -> bool:
        """Make sure parent and run map are known; False while MLflow is unreachable."""
        if self._parent_id is not None:
            return True
        try:
            self.prepare(fresh=False, log_artifacts=False)
            self._rebuild()
        except Exception as exc:
            if not isinstance(exc, MlflowUnavailable):
                logger.warning("MLflow unreachable (%s); results are queued and logged later", exc)
            self._parent_id = None
            return False
        return True

    def _create_child(self, trial: Trial) -> _ChildRun:
        from mlflow.entities import Param

        assert self._parent_id is not None and self._experiment_id is not None
        if trial.trial_id in self._uncreated:
            # An earlier create_run failed: it may have reached the server anyway. Look first.
            for run in self._children_of(self._parent_id):
                if run.data.tags.get(TAG_TRIAL_ID) == trial.trial_id:
                    found = _ChildRun(
                        run.info.run_id, run.data.metrics.get("epoch", -math.inf), run.info.status
                    )
                    self._children[trial.trial_id] = found
                    self._uncreated.discard(trial.trial_id)
                    return found
        self._uncreated.add(trial.trial_id)
        # The trial's own resolved config when its result carries it; resolved here otherwise.
        config = config_from_result(trial.last_result, self.base_config, dict(trial.config or {}))
        index = trial_index(trial)
        tags = {
            **source_tags(),
            **{k: v for k, v in self.parent_tags.items() if k in STUDY_WIDE_TAGS},
            **{
                k: render_run_name(v, config, index if index is not None else trial.trial_id)
                for k, v in getattr(self, "trial_tags", {}).items()
            },
            TAG_ROLE: ROLE_TRIAL,
            TAG_TRIAL_ID: trial.trial_id,
            TAG_PARENT: self._parent_id,
        }
        tags.setdefault(TAG_STUDY_KEY, self.key)
        node_id = (trial.last_result or {}).get("node_id")
        if node_id:
            tags["autonorm.node_id"] = str(node_id)
        tags.update(trial_params_tag(trial.config))
        group = getattr(trial, "group", None)
        if group is not None:  # a member of a stacked group: the Tune trial (and folder) it trained in
            tags[TAG_GROUP] = _folder_of(group)
        # One attempt only (a retried create could make two runs); the next result tries again.
        run = self._call(
            self.client.create_run, self._experiment_id, tags=tags, run_name=self._run_name(trial), attempts=1
        )
        params = [Param(k, v) for k, v in flatten_params(config).items()]
        child = _ChildRun(run_id=run.info.run_id, unsent_params=params)
        self._children[trial.trial_id] = child
        self._uncreated.discard(trial.trial_id)
        return child

    def _run_name(self, trial: Trial) -> str:
        """The trial run's name: the plan's :class:`TrialNamer`, else Tune's display name of the trial
        unless that is the internal trainable's (``tune_entry_...``)."""
        namer = getattr(self, "run_namer", None)  # callbacks pickled by an older version have none
        if namer is not None:
            with contextlib.suppress(Exception):
                return str(namer(trial))
        name = str(trial)
        if name.startswith("tune_entry"):
            return f"{self.study_name}-{trial.trial_id}"
        return name

    def child_run_ids(self) -> dict[str, str]:
        """``trial_id -> MLflow run id`` as MLflow knows it now (what this tracker knows, when MLflow
        does not answer). Without a listing when the last pass of closing the runs left nothing
        undelivered and nothing was written since (``_settled``): its map is MLflow's."""
        if self._connect() and self._settled is None:
            known = dict(self._children)
            try:
                self._rebuild()
            except Exception as exc:
                if not isinstance(exc, MlflowUnavailable):
                    logger.warning("could not list MLflow runs: %s", exc)
                self._children = known
        return {trial_id: child.run_id for trial_id, child in self._children.items()}
