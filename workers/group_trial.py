"""A group trial: the stacks of one or more cells, each trained as one stacked model, every member
reported as its own trial.

What :func:`workers.trainable.autonorm_trial` does for one trial config, done for K member configs at
once through :mod:`autonorm_core.stacking`: every member gets the data split, the initial weights (its
seed, in a forked RNG, as the separate trial), the data order and the noise of its separate run, so
member ``k`` here is the trial it would have been alone (tests/core/test_stacking.py). A group holds
one stack per cell (workers/members.py: :func:`~workers.members.bundle_points`); the stacks train
side by side, one epoch of each per *round* (each stack is the same computation as alone: its own
generators, no shared random state), and the group reports once per round. A Tune trial waits at
every report until the driver has taken it, so the rounds, not the cells' epochs, are what a group
pays in round trips. A stack whose model has no stacked form trains its members one after the
other first, each epoch reported as it ends (``stack_fallback`` on the reports says why).

Every report is packed (:func:`workers.members.pack`): the latest metrics of each member that ended
an epoch since the previous report, with its own ``status`` (``running``, then ``completed`` or
``diverged``), so a diverged member stops while the others go on; the final report has every member.
The checkpoint holds every unfinished member's training state (the one a separate trial would
checkpoint) and every member's latest metrics: a group restored after its driver or process died
resumes each member from its own last epoch, a finished member stays finished and a member that
diverged before the checkpoint stays diverged.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from workers.members import member_params, member_stacks, pack
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
    """``checkpoint_fn`` and every member's callback of a group's stacks: collects each epoch's
    metrics and states, and reports them once per round (:meth:`report`), or, for a stack that trains
    its members one after the other (``auto``), once every member that ran the epoch has its metrics in."""

    def __init__(
        self, session: Any, *, num_epochs: Sequence[int], size: int, latest: dict[int, dict[str, Any]]
    ):
        self.session = session
        self.num_epochs = list(num_epochs)  # per member: its stack's epochs
        self.size = size
        self.latest = latest  # member -> its last reported metrics (status included)
        self.states: dict[int, dict[str, Any]] = {}
        self.waiting: dict[int, set[int]] = {}  # epoch -> members whose metrics are not in yet (auto)
        self.dirty: set[int] = set()  # members with metrics not reported yet
        self.auto = False
        self.fallback = ""
        self.configs: list[str] = []  # each member's resolved config as JSON
        self.reported = 0

    def checkpoint_fn(self, epoch: int, states: Mapping[int, dict[str, Any]]) -> None:
        self.states.update(states)
        if self.auto:
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
        entry["status"] = "completed" if epoch >= self.num_epochs[k] else "running"
        self.latest[k] = entry
        self.dirty.add(k)
        waiting = self.waiting.get(epoch)
        if not self.auto or waiting is None:
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
        members = (
            self.latest if final else {k: self.latest[k] for k in sorted(self.dirty) if k in self.latest}
        )
        payload = pack(self.shared(epoch, final), members)
        self.dirty.clear()
        # every member's resolved config, as an ordinary trial's report carries its own: readers of
        # the study directory need no base config to know what a member ran. In the first report of
        # this run and the last only: Tune keeps a trial's latest result (and each kept checkpoint's)
        # in its snapshot and encodes it again at every result, and K configs are most of it.
        if final or not self.reported:
            payload.update({f"{CONFIG_RESULT_KEY}@m{k}": text for k, text in enumerate(self.configs)})
        self.reported += 1
        if final:
            self.session.report(payload, status="completed")
            return
        done = {k for k, m in self.latest.items() if m.get("status") in ("completed", "diverged")}
        for k in done:
            self.states.pop(k, None)  # a finished member resumes as finished: no state to keep
        state = {"format": GROUP_STATE, "members": dict(self.states), "latest": dict(self.latest)}
        self.session.report(payload, state=state, status="running")


def _member_inputs(
    configs: Sequence[Mapping[str, Any]], device: str
) -> tuple[list[Any], list[Any], list[Any]]:
    """Per member: its data splits, its model and its TrainConfig, each built as its separate trial
    builds them (:func:`workers.trainable.build_trial`); members with the same seed share one split."""
    memo: dict[Any, Any] = {}
    built = [build_trial(config, device, data_memo=memo) for config in configs]
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


def autonorm_group_trial(
    configs: Sequence[Mapping[str, Any]], session: Any, stacks: Sequence[Sequence[int]] | None = None
) -> None:
    """Train the resolved member ``configs`` of one group, reporting through ``session``.

    ``stacks``: the member indices of each stack (one cell's members, trained as one model); one stack
    of every member when ``None``."""
    from autonorm_core.stacking import StackedTraining, fit_stacked, start_stacked

    size = len(configs)
    stacks = [list(s) for s in stacks] if stacks is not None else [list(range(size))]
    if sorted(k for s in stacks for k in s) != list(range(size)):
        raise ValueError(f"the stacks {stacks} do not number the group's {size} members once each")
    splits, models, cfgs = _member_inputs(configs, session.device)
    seeds = [int(c.get("seed", 0)) for c in configs]
    states, latest = _restored(session.resume_state, size)
    num_epochs = [cfgs[k].num_epochs(splits[k].sizes["train"]) for k in range(size)]
    reporter = _GroupReporter(session, num_epochs=num_epochs, size=size, latest=latest)
    reporter.states.update(states)
    reporter.configs = [json.dumps(dict(c), sort_keys=True, default=str) for c in configs]
    # Per stack, its members still to train, by the epoch they resume after (the usual case is one part).
    parts: list[list[int]] = []
    for stack in stacks:
        todo: dict[int, list[int]] = {}
        for k in stack:
            if latest.get(k, {}).get("status") in ("completed", "diverged"):
                continue
            todo.setdefault(int(states[k]["epoch"]) if k in states else 0, []).append(k)
        parts += [ks for _, ks in sorted(todo.items())]
    results: dict[int, Any] = {}
    running: list[tuple[list[int], StackedTraining, Iterator[int]]] = []
    for ks in parts:

        def checkpoint(epoch: int, st: Mapping[int, Any], ks: list[int] = ks) -> None:
            reporter.checkpoint_fn(epoch, {ks[i]: s for i, s in st.items()})

        member_args: dict[str, Any] = {
            "seeds": [seeds[k] for k in ks],
            "callbacks": [(reporter.callback(k),) for k in ks],
            "device": session.device,
            "resume_states": [states[k] for k in ks] if ks[0] in states else None,
            "checkpoint_fn": checkpoint,
        }
        inputs = ([models[k] for k in ks], [splits[k] for k in ks], [cfgs[k] for k in ks])
        prepared = start_stacked(*inputs, **member_args)
        if isinstance(prepared, StackedTraining):
            running.append((ks, prepared, iter(prepared.epochs())))
            continue
        # No stacked form: fit_stacked trains them one after the other, each epoch reported as it ends.
        reporter.auto = True
        out = fit_stacked(*inputs, **member_args)
        reporter.auto = False
        if len(ks) > 1:
            reporter.fallback = out.reason
        for i, k in enumerate(ks):
            results[k] = out.results[i]
    while running:
        going = []
        for ks, training, epochs in running:
            if next(epochs, None) is None:
                out = training.result()
                for i, k in enumerate(ks):
                    results[k] = out.results[i]
            else:
                going.append((ks, training, epochs))
        running = going
        if reporter.dirty and running:
            # the group's epoch: the furthest its stacks have come (one stack: its epoch)
            reporter.report(max(int(latest[k].get("epoch", 0)) for k in reporter.dirty), final=False)
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
    stacks = member_stacks(config)
    session = TrialSession(checkpoint=tune.get_checkpoint(), tracking_uri=tracking_uri, metric=metric)

    def train(configs: Any, session: Any) -> None:
        autonorm_group_trial(configs, session, stacks)

    run_with_retries(train, configs, session, retries=retries)  # type: ignore[arg-type]
