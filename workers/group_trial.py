"""A group trial: the members of one cell trained as one stacked model, each reported as its own trial.

What :func:`workers.trainable.autonorm_trial` does for one trial config, done for K member configs
at once through :func:`autonorm_core.stacking.fit_stacked`: every member gets the data split, the
initial weights (its seed, in a forked RNG, as the separate trial), the data order and the noise of
its separate run, so member ``k`` here is the trial it would have been alone (tests/core/
test_stacking.py). Members whose model has no stacked form train one after the other in the same
process (``fit_stacked`` falls back, and says why on the group's reports as ``stack_fallback``).

Every report is one epoch of the group, packed (:func:`workers.members.pack`): each member's latest
metrics and its own ``status`` (``running``, then ``completed`` or ``diverged``), so a diverged
member stops while the others go on. The checkpoint holds every member's training state (the one a
separate trial would checkpoint) and its latest metrics: a group restored after its driver or
process died resumes each member from its own last epoch, and a member that diverged before the
checkpoint stays diverged.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from workers.members import member_params, pack
from workers.trainable import (
    CONFIG_RESULT_KEY,
    TrialFunction,
    TrialSession,
    _diverged_report,
    _quiet_exit_in_callbacks,
    autonorm_trial,
    build_trial,
    resolve_trial_config,
    run_with_retries,
    tune_entry,
)

__all__ = ["autonorm_group_trial", "group_entry"]

GROUP_STATE = "autonorm-group-1"


class _GroupReporter:
    """``fit_stacked``'s ``checkpoint_fn`` and every member's callback: one packed report per epoch,
    once every member that ran the epoch has its metrics in."""

    def __init__(self, session: Any, *, num_epochs: int, size: int, latest: dict[int, dict[str, Any]]):
        self.session = session
        self.num_epochs = num_epochs
        self.size = size
        self.latest = latest  # member -> its last reported metrics (status included)
        self.states: dict[int, dict[str, Any]] = {}
        self.waiting: dict[int, set[int]] = {}  # epoch -> members whose metrics are not in yet
        self.fallback = ""
        self.configs: list[str] = []  # each member's resolved config as JSON

    def checkpoint_fn(self, epoch: int, states: Mapping[int, dict[str, Any]]) -> None:
        self.states.update(states)
        self.waiting[epoch] = self.waiting.get(epoch, set()) | set(states)

    def callback(self, k: int) -> Any:
        reporter = self

        class _Member:
            def on_epoch_end(self, epoch: int, model: Any, metrics: dict[str, float]) -> None:
                reporter.end_epoch(k, epoch, metrics)

        return _Member()

    def end_epoch(self, k: int, epoch: int, metrics: Mapping[str, float]) -> None:
        entry: dict[str, Any] = dict(metrics)
        entry.setdefault("epoch", epoch)
        entry["status"] = "completed" if epoch >= self.num_epochs else "running"
        self.latest[k] = entry
        waiting = self.waiting.get(epoch)
        if waiting is None:
            return
        waiting.discard(k)
        if not waiting:
            del self.waiting[epoch]
            self.report(epoch, final=False)

    def shared(self, epoch: int, final: bool) -> dict[str, Any]:
        out: dict[str, Any] = {"epoch": epoch, "members": float(self.size)}
        if self.fallback:
            out["stack_fallback"] = self.fallback
        return out

    def report(self, epoch: int, *, final: bool) -> None:
        payload = pack(self.shared(epoch, final), self.latest)
        # every member's resolved config, as an ordinary trial's report carries its own: readers of
        # the study directory need no base config to know what a member ran
        payload.update({f"{CONFIG_RESULT_KEY}@m{k}": text for k, text in enumerate(self.configs)})
        if final:
            self.session.report(payload, status="completed")
            return
        state = {"format": GROUP_STATE, "members": dict(self.states), "latest": dict(self.latest)}
        self.session.report(payload, state=state, status="running")


def _member_inputs(
    configs: Sequence[Mapping[str, Any]], device: str
) -> tuple[list[Any], list[Any], list[Any]]:
    """Per member: its data splits, its model and its TrainConfig, each built as its separate trial
    builds them (:func:`workers.trainable.build_trial`)."""
    built = [build_trial(config, device) for config in configs]
    return [b[0] for b in built], [b[1] for b in built], [b[2] for b in built]


def _restored(state: Mapping[str, Any] | None, size: int) -> tuple[dict[int, Any], dict[int, dict[str, Any]]]:
    """(member -> training state, member -> latest metrics) of a group checkpoint; a member whose
    latest metrics say ``running`` but that has no state diverged before the checkpoint was taken."""
    if not state:
        return {}, {}
    if state.get("format") != GROUP_STATE:
        raise ValueError(f"not a group checkpoint (format {state.get('format')!r}, expected {GROUP_STATE})")
    states = {int(k): v for k, v in state["members"].items()}
    latest = {int(k): dict(v) for k, v in state["latest"].items()}
    for k, metrics in latest.items():
        if metrics.get("status") == "running" and k not in states:
            metrics["status"] = "diverged"
            metrics["train_loss"] = math.nan
    if any(k >= size for k in states):
        raise ValueError("the group checkpoint has more members than the trial")
    return states, latest


def autonorm_group_trial(configs: Sequence[Mapping[str, Any]], session: Any) -> None:
    """Train the resolved member ``configs`` of one group, reporting through ``session``."""
    from autonorm_core.stacking import fit_stacked

    size = len(configs)
    splits, models, cfgs = _member_inputs(configs, session.device)
    seeds = [int(c.get("seed", 0)) for c in configs]
    states, latest = _restored(session.resume_state, size)
    num_epochs = cfgs[0].num_epochs(splits[0].sizes["train"])
    reporter = _GroupReporter(session, num_epochs=num_epochs, size=size, latest=latest)
    reporter.states.update(states)
    reporter.configs = [json.dumps(dict(c), sort_keys=True, default=str) for c in configs]
    # Members still to train, by the epoch they resume after (one stack per epoch: the usual case is one).
    todo: dict[int, list[int]] = {}
    for k in range(size):
        if latest.get(k, {}).get("status") in ("completed", "diverged"):
            continue
        todo.setdefault(int(states[k]["epoch"]) if k in states else 0, []).append(k)
    results: dict[int, Any] = {}
    for _, ks in sorted(todo.items()):

        def checkpoint(epoch: int, st: Mapping[int, Any], ks: list[int] = ks) -> None:
            reporter.checkpoint_fn(epoch, {ks[i]: s for i, s in st.items()})

        out = fit_stacked(
            [models[k] for k in ks],
            [splits[k] for k in ks],
            [cfgs[k] for k in ks],
            seeds=[seeds[k] for k in ks],
            callbacks=[(reporter.callback(k),) for k in ks],
            device=session.device,
            resume_states=[states[k] for k in ks] if ks[0] in states else None,
            checkpoint_fn=checkpoint,
        )
        if not out.stacked and len(ks) > 1:
            reporter.fallback = out.reason
        for i, k in enumerate(ks):
            results[k] = out.results[i]
    for k, result in results.items():
        if result.status == "diverged":
            report = _diverged_report(result)
            report["status"] = "diverged"
            latest[k] = report
        elif latest.get(k, {}).get("status") != "completed":
            latest[k] = {**dict(result.final), "status": "completed"}
    last = max((int(m.get("epoch", 0)) for m in latest.values()), default=0)
    reporter.report(last, final=True)


def group_entry(
    config: dict[str, Any],
    *,
    trial_fn: TrialFunction,
    base_config: Mapping[str, Any],
    tracking_uri: str | None = None,
    metric: str | None = None,
    retries: int = 0,
) -> None:
    """The Tune function trainable of a stacked plan (:func:`workers.trainable.tune_entry`'s arguments):
    a group's members resolved and trained by :func:`autonorm_group_trial`; a config that is no group
    goes to ``tune_entry``."""
    members = member_params(config)
    if members is None:
        tune_entry(
            config,
            trial_fn=trial_fn,
            base_config=base_config,
            tracking_uri=tracking_uri,
            metric=metric,
            retries=retries,
        )
        return
    if trial_fn is not autonorm_trial:
        raise ValueError("a stacked group runs the default trial function only (execution.stack: off)")
    from ray import tune

    _quiet_exit_in_callbacks()
    configs = [resolve_trial_config(base_config, m) for m in members]
    session = TrialSession(checkpoint=tune.get_checkpoint(), tracking_uri=tracking_uri, metric=metric)
    run_with_retries(autonorm_group_trial, configs, session, retries=retries)  # type: ignore[arg-type]
