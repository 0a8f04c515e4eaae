"""Statistics for hypothesis studies: the batch-size trend test and gate-entropy summaries.

The batch-size hypothesis (docs/science.md §2): layers that correct the affine divergence get *worse*
as the batch size B grows, and BatchNorm / plain affine layers do not. :func:`batchsize_trend` turns a
table of trials into per-arm statistics, gates, verdicts and a study verdict; its return value is
exactly what a study writes to ``verdict.json``.

Design choices that matter for validity:

* Seeds are the experimental unit. Every arm is run with the same seeds (common random numbers), so
  every statistic is first computed *per seed* (a slope over the batch sizes of one seed) and the
  uncertainty comes from the spread of those K per-seed values: a t-interval with K - 1 degrees of
  freedom when K < 10, a bootstrap that resamples whole seeds when K >= 10.
* The interaction of a fix arm is the trend of the paired differences ``metric(fix) -
  metric(control)`` per ``(B, seed)`` cell. Its permutation test shuffles the batch-size labels of
  those differences *within each seed*: under the null of no trend in the differences the labels are
  exchangeable there, and the seed structure is kept. Shuffling arm labels within cells would test
  the arms' level difference, not their trend, and is not valid here.
* Failed trials (status other than ``completed``, or a non-finite metric) are never silently
  dropped: the primary analysis scores them at chance (metric ``chance_metric``, train loss
  ``chance_loss``); the analysis that drops them is reported as a sensitivity check.
* Gates come before verdicts: an arm with too many failures, one that did not learn, one whose
  learning rate was tuned to the edge of its range, or a design too small to reach significance is
  ``inconclusive`` whatever its statistics say, with the reason named.
* Every random draw comes from a ``numpy.random.Generator`` owned by the call, derived from ``seed``,
  the budget and the arm name, so results do not depend on global state or on the other arms.

One arm's statistics are in :mod:`studies.kinds.batchsize.armstats`, the rules from statistics to
labels and verdicts beyond :func:`verdict_for` in :mod:`studies.kinds.batchsize.verdicts`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from studies.adequacy import failed_cells, study_line
from studies.kinds.batchsize.armstats import arm_statistics, cell_key, interaction_looks
from studies.kinds.batchsize.hypothesis import DIVERGENCE_FIXES, HYPOTHESIS, MIN_SEEDS
from studies.kinds.batchsize.hypothesis import MIN_BATCH_SIZES as _MIN_BATCH_SIZES
from studies.kinds.batchsize.seedstats import none_if_nan
from studies.kinds.batchsize.verdicts import (
    claim_reading,
    combine_budgets,
    control_label,
    fix_reasons,
    oriented,
    study_verdict,
    verdict_fields,
)
from studies.stats import EXACT_PERMUTATION_LIMIT, holm_into, ols_slope, permutation_p_value

__all__ = [
    "COMPLETED_STATUSES",
    "DIVERGENCE_FIXES",
    "EXACT_PERMUTATION_LIMIT",
    "HYPOTHESIS",
    "MIN_SEEDS",
    "VERDICTS",
    "batchsize_trend",
    "gate_entropy",
    "normalize_table",
    "ols_slope",
    "permutation_p_value",
    "verdict_for",
]

#: Trial statuses that count as finished (compared case-insensitively); anything else
#: (``diverged``, ``error``, ``pruned``, ...) is a failed trial.
COMPLETED_STATUSES = frozenset({"completed"})

VERDICTS = ("supported", "refuted", "inconclusive")
CONTROL_LABELS = ("stable", "declines", "unclear")

_FAILURE_SHARE = 0.2
_NOT_LEARNED = 0.9

_REQUIRED_COLUMNS = ("arm", "batch_size", "seed", "status")


def verdict_for(
    slope_ci: Sequence[float] | None,
    interaction_ci: Sequence[float] | None,
    *,
    higher_is_better: bool = True,
    p_holm: float | None = None,
    alpha: float = 0.05,
) -> str:
    """The verdict rule of docs/science.md §2 for one fix arm, gates aside.

    On the "goodness" scale (the metric itself when ``higher_is_better``, its negative for a loss):
    ``supported`` when ``p_holm < alpha`` and the slope CI and the interaction CI both lie strictly
    below 0; ``refuted`` when the slope CI or the interaction CI lies entirely at or above 0; else
    ``inconclusive``. ``p_holm=None`` skips the p-value condition (CI-only rule); a missing CI never
    supports.
    """
    sign = 1.0 if higher_is_better else -1.0
    s = oriented(slope_ci, sign)
    i = oriented(interaction_ci, sign)
    significant = p_holm is None or (math.isfinite(p_holm) and p_holm < alpha)
    if s is not None and i is not None and s[1] < 0 and i[1] < 0 and significant:
        return "supported"
    if (s is not None and s[0] >= 0) or (i is not None and i[0] >= 0):
        return "refuted"
    return "inconclusive"


def gate_entropy(probs: np.ndarray | Sequence[float], *, axis: int = -1) -> np.ndarray:
    """Shannon entropy ``-sum p log p`` (natural log) of gate probabilities along ``axis``.

    Use it on ``softmax(logits)``, never on Gumbel samples (docs/science.md §1). ``0 log 0`` is 0, so
    a collapsed gate has entropy exactly 0; a uniform 2-way gate has ``ln 2``.
    """
    p = np.asarray(probs, dtype=float)
    if np.any(p < 0):
        raise ValueError("gate probabilities must be non-negative")
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0)
    return np.asarray(-terms.sum(axis=axis))


def normalize_table(table: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Validate a trial table and return its analysis view.

    Columns: ``arm, batch_size, seed, status, value`` (the metric as float), ``ok`` (completed and
    finite metric), ``log2_b``, ``train_loss`` (NaN when the table has none), ``lr_at_edge`` (False
    when absent) and ``budget`` (``""`` when absent). The metric column is ``metric`` or, failing
    that, a column named ``"metric"``.

    Rows come out sorted by arm, budget, batch size and seed (numerically where the seeds are
    numbers), whatever order they came in: every resampling draw (bootstrap, permutations) then
    sees the same rows in the same order, so a table rebuilt from MLflow in another order gives the
    same numbers (``autonorm-study reproduce``).

    Raises:
        ValueError: a required column is missing or a batch size is not positive.
    """
    missing = [c for c in _REQUIRED_COLUMNS if c not in table.columns]
    if not missing:
        table = _sorted_rows(table)
    value_col = metric if metric in table.columns else "metric" if "metric" in table.columns else None
    if missing or value_col is None:
        need = [*_REQUIRED_COLUMNS, f"{metric!r} or 'metric'"]
        raise ValueError(f"table is missing columns {missing or [metric]}; required: {need}")
    df = table.loc[:, list(_REQUIRED_COLUMNS)].copy()
    df["value"] = pd.to_numeric(table[value_col], errors="coerce").astype(float)
    df["batch_size"] = pd.to_numeric(df["batch_size"], errors="raise")
    if (df["batch_size"] <= 0).any():
        raise ValueError("batch_size must be positive (its log2 is the regressor)")
    df["arm"] = df["arm"].astype(str)
    df["seed"] = df["seed"].astype(str)
    status_ok = df["status"].astype(str).str.lower().isin(COMPLETED_STATUSES)
    df["ok"] = status_ok & np.isfinite(df["value"].to_numpy())
    df["log2_b"] = np.log2(df["batch_size"].to_numpy(dtype=float))
    if "train_loss" in table.columns:
        df["train_loss"] = pd.to_numeric(table["train_loss"], errors="coerce").astype(float)
    else:
        df["train_loss"] = math.nan
    if "lr_at_edge" in table.columns:
        df["lr_at_edge"] = table["lr_at_edge"].fillna(False).astype(bool)
    else:
        df["lr_at_edge"] = False
    df["budget"] = table["budget"].fillna("").astype(str) if "budget" in table.columns else ""
    return df


def _sorted_rows(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` sorted by arm, budget, batch size, seed (stable; the index reset)."""
    keys = pd.DataFrame(
        {
            "arm": table["arm"].astype(str),
            "budget": table["budget"].fillna("").astype(str) if "budget" in table.columns else "",
            "batch_size": pd.to_numeric(table["batch_size"], errors="coerce"),
            "seed_n": pd.to_numeric(table["seed"], errors="coerce"),
            "seed_s": table["seed"].astype(str),
        },
        index=table.index,
    )
    order = keys.sort_values(["arm", "budget", "batch_size", "seed_n", "seed_s"], kind="mergesort").index
    return table.loc[order].reset_index(drop=True)


# --------------------------------------------------------------------------------------------------
# One budget


def _analyse(
    df: pd.DataFrame,
    *,
    fix_arms: list[str],
    control_arms: list[str],
    control: str,
    drop_failed: bool,
    negative: bool,
    alpha: float,
    delta: float,
    min_seeds: int,
    n_boot: int,
    n_perm: int,
    seed: int,
    confidence: float,
    chance_metric: float,
    chance_loss: float,
    salt: str,
    sequential: Mapping[str, Any] | None = None,
    adequacy: Any = None,
) -> dict[str, Any]:
    """Statistics, gates and verdicts of one budget, failures scored at chance or dropped.

    ``adequacy``: the budget's training-adequacy check per ``<arm>@<B>`` cell
    (:func:`studies.adequacy.measure`); an arm with a cell that did not pass is ``under-trained``.

    With ``sequential`` (``{"looks", "seed_order", "min_effect", "prior_scale"}``) each fix arm's
    per-seed interaction slopes, in ``seed_order``, are tested with the anytime-valid mixture t-test
    at every look (Holm over the fix arms at each): its p-value and confidence sequence replace the
    fixed-design p and interaction CI, a futile arm is ``refuted`` (``effect below min_effect``), and
    the replayed looks are returned as ``looks``."""
    sign = 1.0 if negative else -1.0
    seeds = sorted(df["seed"].unique(), key=lambda s: (len(s), s))
    bs = sorted(float(b) for b in df["batch_size"].unique())
    x = np.log2(np.asarray(bs, dtype=float))
    arm_col = df["arm"].to_numpy(dtype=object)
    seed_idx = pd.Index(seeds).get_indexer(df["seed"].to_numpy(dtype=object))
    b_idx = pd.Index(bs).get_indexer(df["batch_size"].to_numpy(dtype=float))
    ok = df["ok"].to_numpy(dtype=bool)
    value = df["value"].to_numpy(dtype=float)
    loss = df["train_loss"].to_numpy(dtype=float)
    if drop_failed:
        used_rows = ok
    else:
        used_rows = np.ones(len(df), dtype=bool)
        value = np.where(ok, value, chance_metric)
        loss = np.where(ok, loss, chance_loss)
    edge = df["lr_at_edge"].to_numpy(dtype=bool)
    n_b = len(bs)

    def matrix(mask: np.ndarray) -> np.ndarray:
        mask = mask & np.isfinite(value)  # a NaN chance level leaves failed trials as missing cells
        total = np.zeros((len(seeds), n_b))
        count = np.zeros((len(seeds), n_b))
        np.add.at(total, (seed_idx[mask], b_idx[mask]), value[mask])
        np.add.at(count, (seed_idx[mask], b_idx[mask]), 1.0)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(count > 0, total / np.maximum(count, 1.0), np.nan)

    in_arm = {arm: arm_col == arm for arm in (*control_arms, *fix_arms)}
    mats = {arm: matrix(mask & used_rows) for arm, mask in in_arm.items()}
    family = len(fix_arms)
    arms: dict[str, dict[str, Any]] = {}
    for arm in [*control_arms, *fix_arms]:
        is_fix = arm in fix_arms
        rows = in_arm[arm]
        used = rows & used_rows
        v = mats[arm]
        d = v - mats[control] if arm != control else None
        res = arm_statistics(
            v,
            d,
            x,
            negative=negative,
            n_perm=n_perm,
            n_boot=n_boot,
            confidence=confidence,
            seed=seed,
            salt=f"{salt}/{arm}",
        )
        failures_by_cell: dict[str, int] = {}
        n_by_cell: dict[str, int] = {}
        loss_by_cell: dict[str, float | None] = {}
        loss_missing = False  # a cell with trials but no finite train loss: the gate cannot be checked
        for j, b in enumerate(bs):
            in_cell = rows & (b_idx == j)
            failures_by_cell[cell_key(b)] = int(np.count_nonzero(in_cell & ~ok))
            n_by_cell[cell_key(b)] = int(np.count_nonzero(in_cell))
            cell_loss = loss[in_cell & used_rows]
            loss_missing |= cell_loss.size > 0 and not np.isfinite(cell_loss).any()
            cell_loss = cell_loss[np.isfinite(cell_loss)]
            loss_by_cell[cell_key(b)] = float(np.median(cell_loss)) if cell_loss.size else None
        complete = v if d is None else d
        n_complete = int(np.isfinite(complete).all(axis=1).sum()) if complete.size else 0
        res = {
            "role": "fix" if is_fix else "control",
            "n": int(np.count_nonzero(used)),
            "n_failed": int(np.count_nonzero(rows & ~ok)),
            "n_complete_seeds": n_complete,
            "batch_sizes": [int(b) if float(b).is_integer() else float(b) for b in bs],
            **res,
            "p_value_holm": None,
            "failures_by_cell": failures_by_cell,
            "n_by_cell": n_by_cell,
            "median_train_loss_by_cell": loss_by_cell,
            "lr_at_edge": bool(edge[rows].any()),
        }
        gates: list[str] = []
        if res["lr_at_edge"]:
            gates.append("lr-at-range-edge")
        if not drop_failed and any(
            res["failures_by_cell"][c] > _FAILURE_SHARE * res["n_by_cell"][c] for c in res["n_by_cell"]
        ):
            gates.append("failures")
        losses = list(res["median_train_loss_by_cell"].values())
        if math.isfinite(chance_loss) and any(
            val is not None and val > _NOT_LEARNED * chance_loss for val in losses
        ):
            gates.append("optimisation-limited")
        elif loss_missing:
            gates.append("train loss missing")
        under = failed_cells(adequacy, [f"{arm}@{int(b)}" for b in bs])
        if under:
            gates.append("under-trained")
            res["under_trained"] = under
        underpowered = n_complete < min_seeds or len(bs) < _MIN_BATCH_SIZES
        if (
            sequential is None
            and is_fix
            and res["min_attainable_p"] is not None
            and res["min_attainable_p"] * family >= alpha
        ):
            underpowered = True
        if underpowered:
            gates.append("underpowered")
        res["gates"] = gates
        arms[arm] = res

    holm_into(arms, fix_arms)
    looks = interaction_looks(arms, fix_arms, seeds, sequential, alpha=alpha, negative=negative)
    final = looks[-1]["hypotheses"] if looks else {}
    for arm, h in final.items():
        r = arms[arm]
        r["fixed_design"] = {k: r[k] for k in ("p_value", "p_value_holm", "interaction_ci")}
        r.update(
            p_value=h["p_value"],
            p_value_holm=h["p_value_holm"],
            interaction_ci=[none_if_nan(v) for v in h["ci"]],
            sequential=h["decision"],
        )

    verdict: dict[str, str] = {}
    # The interaction is measured against the control: a control that failed, did not learn or sat at
    # its lr edge contaminates every fix arm's paired differences.
    inherited = [f"control {g}" for g in arms[control]["gates"] if g != "underpowered"]
    for arm in fix_arms:
        r = arms[arm]
        r["gates"] += inherited
        if r["gates"]:
            verdict[arm], reasons = "inconclusive", _gate_reasons(r, arms[control])
        elif r.get("sequential") == "futile":
            verdict[arm], reasons = "refuted", ["effect below min_effect"]
        else:
            verdict[arm] = verdict_for(
                r["slope_ci"],
                r["interaction_ci"],
                higher_is_better=negative,
                p_holm=r["p_value_holm"],
                alpha=alpha,
            )
            reasons = [] if verdict[arm] == "supported" else fix_reasons(r, sign=sign, alpha=alpha)
            if verdict[arm] == "refuted":
                s, i = oriented(r["slope_ci"], sign), oriented(r["interaction_ci"], sign)
                reasons = [
                    *(["slope CI at or above 0 (opposite direction)"] if s is not None and s[0] >= 0 else []),
                    *(
                        ["interaction CI at or above 0 (opposite direction)"]
                        if i is not None and i[0] >= 0
                        else []
                    ),
                ]
        r["verdict"], r["reasons"] = verdict[arm], reasons
        del r["gates"]
    labels: dict[str, str] = {}
    for arm in control_arms:
        r = arms[arm]
        if r["gates"]:
            labels[arm], reasons = "unclear", _gate_reasons(r, r)
        else:
            labels[arm] = control_label(r["slope_ci"], sign=sign, delta=delta)
            reasons = (
                []
                if labels[arm] == "stable"
                else [f"slope CI {'below' if labels[arm] == 'declines' else 'overlaps'} -delta"]
            )
        r["label"], r["reasons"] = labels[arm], reasons
        del r["gates"]

    exploratory = any("underpowered" in r["reasons"] for r in arms.values())
    study, study_reasons = study_verdict(verdict, labels, arms, exploratory=exploratory)
    untestable = study_line(adequacy)
    if untestable:
        study_reasons = [untestable, *study_reasons]
    return {
        **verdict_fields(arms, verdict, labels, (study, study_reasons), exploratory),
        "batch_sizes": [int(b) if float(b).is_integer() else float(b) for b in bs],
        "seeds": seeds,
        "looks": looks,
    }


def _gate_reasons(r: Mapping[str, Any], control: Mapping[str, Any]) -> list[str]:
    """An arm's gates as its reasons: ``under-trained`` (and ``control under-trained``) spelt out as
    each failing cell's :func:`studies.adequacy.reason`."""
    out: list[str] = []
    for g in r["gates"]:
        if g == "under-trained":
            out += list(r.get("under_trained") or [g])
        elif g == "control under-trained":
            out += [f"control {x}" for x in control.get("under_trained") or ["under-trained"]]
        else:
            out.append(g)
    return out


# --------------------------------------------------------------------------------------------------
# Public entry point


def batchsize_trend(
    table: pd.DataFrame,
    *,
    control: str,
    controls: Sequence[str],
    metric: str = "test_accuracy",
    higher_is_better: bool = True,
    chance_metric: float,
    chance_loss: float,
    alpha: float = 0.05,
    delta: float = 0.005,
    min_seeds: int = MIN_SEEDS,
    n_boot: int = 2000,
    n_perm: int = 9999,
    seed: int = 0,
    confidence: float = 0.95,
    sequential: Mapping[str, Any] | None = None,
    adequacy: Any = None,
) -> dict[str, Any]:
    """Test the batch-size hypothesis (docs/science.md §2) and return the ``verdict.json`` dictionary.

    Statistics, per arm (every value on the metric's own scale; the hypothesis direction "worse as B
    grows" is a negative slope when ``higher_is_better``, a positive one for a loss):

    * ``slope``: mean over seeds of the per-seed OLS slope of the metric vs ``log2 B``; ``slope_ci``:
      t-interval over the K per-seed slopes (K - 1 df) when K < 10, else a percentile bootstrap over
      seeds (``n_boot``); ``ci_method`` says which. ``spearman_rho``: mean of the per-seed Spearman
      rho vs B; ``spearman_rho_ci``: its interval on the Fisher-z scale (rho = +-1 taken as +-0.999,
      t-interval of the mean atanh(rho), back-transformed), inside [-1, 1]; ``None`` below 3 seeds.
    * ``interaction`` (every arm but ``control``): the same per-seed slope of the paired differences
      ``arm - control`` per ``(B, seed)`` cell -> d_1..d_K; in a balanced design it equals the OLS slope
      of the pooled differences. ``p_value`` = max(within-seed permutation p, one-sided t-test p of
      d_1..d_K) in the hypothesis direction (``p_value_permutation``, ``p_value_t``; ``permutation``
      is ``"exact"`` when there are <= 100,000 distinct permutations, else ``"monte-carlo"`` with
      ``n_perm`` draws). ``p_value_holm``: Holm over the fix arms only (``None`` for controls).
    * Failed trials (status not ``completed`` or a non-finite metric) are scored at ``chance_metric``
      and their train loss at ``chance_loss``; ``sensitivity`` repeats everything with them dropped.

    Gates (reason -> the fix arm is ``inconclusive``, a control ``unclear``): ``lr-at-range-edge``
    (any ``lr_at_edge`` true), ``failures`` (> 20 % failed in a batch-size cell),
    ``optimisation-limited`` (a cell's median final train loss > 0.9 x ``chance_loss``), ``train loss
    missing`` (a cell without any finite train loss), ``control <gate>`` (a fix arm whose ``control``
    failed one of these gates: its paired differences are contaminated), ``underpowered`` (fewer than ``min_seeds`` seeds
    with data in every cell -- for a fix arm, paired data --, fewer than 4 batch sizes, or, for a fix
    arm, smallest attainable permutation p x number of fix arms >= ``alpha``).

    Verdicts: a fix arm that passed its gates is ``supported`` iff Holm p < ``alpha`` and the slope
    CI and the interaction CI both lie strictly in the hypothesis direction of 0, ``refuted`` iff one
    of them lies entirely at or beyond 0 in the opposite direction, else ``inconclusive``; every
    non-supported arm lists its ``reasons``. Controls are labelled ``declines`` (oriented slope CI
    upper bound < -delta), ``stable`` (whole oriented CI > -delta) or ``unclear``. Per budget the claim
    holds (a fix arm supported, every control stable), fails (every fix arm refuted, or a control
    declines) or is undecided (``claim_by_budget``; :mod:`studies.kinds.batchsize.verdicts`); the
    study is ``supported`` / ``refuted`` where it holds / fails under every budget,
    ``budget-dependent`` where it holds under one and fails under another, else ``inconclusive``
    with ``study_reasons``.

    Budgets: when ``table`` has a ``budget`` column with more than one value, each budget is
    analysed on its own and ``budgets`` maps the budget name to that full result (this same layout,
    without ``budgets``). The top level then combines them: ``verdict[arm]`` is ``supported`` only
    if supported under every budget, ``refuted`` only if refuted under every budget, else
    ``inconclusive`` (reason ``budget-dependent`` when supported under some budgets); control labels
    are ``stable`` only if stable everywhere, ``declines`` if they decline under any budget, else
    ``unclear``; the study verdict from the claim's reading per budget (above). Top-level ``arms[arm]`` then holds ``role``,
    ``verdict`` (fix) or ``label`` (control), ``reasons`` (union over budgets, plus
    ``budget-dependent``) and ``by_budget: {budget: {verdict|label, reasons, slope, slope_ci,
    interaction, interaction_ci, p_value, p_value_holm, n, n_failed}}``; the full statistics are in
    ``budgets[name]["arms"][arm]``. Without budgets ``budgets`` is ``None`` and ``arms[arm]`` holds
    the full statistics.

    Args:
        table: one row per trial: ``arm, batch_size, seed, status, <metric>, train_loss`` and
            optionally ``lr_at_edge`` (bool) and ``budget`` (``epochs | updates``).
        control: the arm the interaction is measured against.
        controls: every arm the claim says does not decline (``control`` is added when missing);
            every other arm of the table is a fix arm.
        metric: the metric's name (and column; a column named ``"metric"`` is the fallback).
        higher_is_better: accuracy (True) or a loss (False).
        chance_metric: the metric of a failed trial (1/C for accuracy).
        chance_loss: the train loss of a failed trial and the convergence gate's scale (ln C). With
            NaN for both chance values (a task without a chance level, e.g. regression) failed trials
            are counted and left out as missing cells, and the convergence gate is not applied.
        alpha: significance level of the Holm-adjusted p-values.
        delta: the control tolerance, metric units per doubling of B.
        min_seeds: minimum seeds with data in every cell.
        n_boot: bootstrap resamples of seeds (used when there are >= 10 seeds).
        n_perm: Monte-Carlo permutations when exact enumeration is too large.
        seed: seeds every random draw.
        confidence: two-sided level of the intervals.
        sequential: a sequential design (``{"looks", "seed_order", "min_effect", "prior_scale"}``,
            the protocol's §4): each fix arm's per-seed interaction slopes in ``seed_order`` are
            tested anytime-validly at every look in ``looks`` the data reach; the sequential p and
            confidence sequence replace the fixed-design p and interaction CI (those are kept in the
            arm's ``fixed_design``), a futile arm is ``refuted`` (``effect below min_effect``), the
            permutation part of the power gate is dropped, and each budget's result holds ``looks``.
        adequacy: the training-adequacy check (:mod:`studies.adequacy`) per budget name (``""`` for
            a table without budgets): ``{budget: {"<arm>@<B>": {"passed", "reached", "gain",
            "reason", ...}}}``. An arm with a cell that did not pass is gated ``under-trained`` (a
            fix arm ``inconclusive``, a control ``unclear``; a fix arm whose control is gated
            ``control under-trained``) with the cell's reason, and the budget's study reasons open
            with ``not testable at this budget``. ``None`` or a budget without a mapping: not
            measured, no gate.

    Returns:
        ``{"hypothesis", "metric", "control", "control_arms", "fix_arms", "higher_is_better",
        "direction", "alpha", "delta", "min_seeds", "chance_metric", "chance_loss", "confidence",
        "n_boot", "n_perm", "seed", "batch_sizes", "seeds", "arms", "verdict", "controls",
        "study_verdict", "study_reasons", "exploratory", "test", "sensitivity", "budgets"}``. ``test``
        is ``"sequential"`` with a ``sequential`` design, else ``"fixed"``. ``sensitivity`` holds
        ``test`` (always the primary's: the sensitivity analysis replays the same design, so with
        no failure it equals the primary), ``verdict``, ``controls``, ``study_verdict``,
        ``study_reasons`` of the analysis with failures dropped; each arm's own ``sensitivity`` its
        statistics there (and ``test``). Undefined numbers are ``None``; the result is strict JSON.

    Raises:
        ValueError: a required column is missing, ``control`` or a listed control is not in the
            table, or an argument is out of range.
    """
    if n_boot < 1 or n_perm < 1:
        raise ValueError(f"n_boot and n_perm must be >= 1, got n_boot={n_boot}, n_perm={n_perm}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    if not (math.isnan(chance_loss) or chance_loss > 0):
        raise ValueError(f"chance_loss must be positive (or NaN: no chance level), got {chance_loss}")
    if min_seeds < 2:
        raise ValueError(f"min_seeds must be >= 2, got {min_seeds}")
    df = normalize_table(table, metric)
    present = sorted(df["arm"].unique())
    control_arms = [control, *sorted(set(controls) - {control})]
    absent = [a for a in control_arms if a not in present]
    if absent:
        raise ValueError(f"control arm(s) {absent} not in the table; arms: {present}")
    fix_arms = [a for a in present if a not in control_arms]
    common: dict[str, Any] = {
        "fix_arms": fix_arms,
        "control_arms": control_arms,
        "control": control,
        "negative": bool(higher_is_better),
        "alpha": float(alpha),
        "delta": float(delta),
        "min_seeds": int(min_seeds),
        "n_boot": int(n_boot),
        "n_perm": int(n_perm),
        "seed": int(seed),
        "confidence": float(confidence),
        "chance_metric": float(chance_metric),
        "chance_loss": float(chance_loss),
    }
    header: dict[str, Any] = {
        "hypothesis": HYPOTHESIS,
        "metric": metric,
        "control": control,
        "control_arms": control_arms,
        "fix_arms": fix_arms,
        "higher_is_better": bool(higher_is_better),
        "direction": "negative" if higher_is_better else "positive",
        "alpha": float(alpha),
        "delta": float(delta),
        "min_seeds": int(min_seeds),
        "chance_metric": float(chance_metric),
        "chance_loss": float(chance_loss),
        "confidence": float(confidence),
        "n_boot": int(n_boot),
        "n_perm": int(n_perm),
        "seed": int(seed),
    }

    def one(sub: pd.DataFrame, budget: str) -> dict[str, Any]:
        # The sensitivity analysis uses the primary's test (sequential or fixed): with no failure
        # dropped it is the primary analysis, so the two can differ only by the failures.
        test = "fixed" if sequential is None else "sequential"
        checks = adequacy.get(budget) if isinstance(adequacy, Mapping) else None
        primary = _analyse(
            sub, drop_failed=False, salt=budget, sequential=sequential, adequacy=checks, **common
        )
        dropped = _analyse(
            sub[sub["ok"]], drop_failed=True, salt=budget, sequential=sequential, adequacy=checks, **common
        )
        keys = (
            "n",
            "n_seeds",
            "n_complete_seeds",
            "slope",
            "slope_ci",
            "spearman_rho",
            "spearman_rho_ci",
            "interaction",
            "interaction_ci",
            "p_value",
            "p_value_holm",
            "reasons",
        )
        for arm, r in primary["arms"].items():
            s = dropped["arms"][arm]
            r["sensitivity"] = {k: s[k] for k in keys} | (
                {"verdict": s["verdict"]} if "verdict" in s else {"label": s["label"]}
            )
            r["sensitivity"]["test"] = test
        return {
            **header,
            "budget": budget or None,
            "batch_sizes": primary["batch_sizes"],
            "seeds": primary["seeds"],
            "arms": primary["arms"],
            "verdict": primary["verdict"],
            "controls": primary["controls"],
            "study_verdict": primary["study_verdict"],
            "study_reasons": primary["study_reasons"],
            "exploratory": primary["exploratory"],
            "looks": primary["looks"],
            "test": test,
            "sensitivity": {
                "test": test,
                "verdict": dropped["verdict"],
                "controls": dropped["controls"],
                "study_verdict": dropped["study_verdict"],
                "study_reasons": dropped["study_reasons"],
            },
        }

    budgets = sorted(df["budget"].unique())
    if len(budgets) <= 1:
        single = one(df, budgets[0] if budgets else "")
        reading = claim_reading(single["verdict"], single["controls"])
        return {**single, "claim_by_budget": {single["budget"] or "": reading}, "budgets": None}
    per = {b: one(df[df["budget"] == b], b) for b in budgets}
    combined = combine_budgets(per, fix_arms, control_arms)
    combined["sensitivity"]["test"] = "fixed" if sequential is None else "sequential"
    return {**header, "test": combined["sensitivity"]["test"], **combined, "budgets": per}
