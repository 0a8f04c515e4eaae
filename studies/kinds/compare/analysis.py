"""Statistics of the compare kind: paired contrasts of arms over seeds, gates, verdicts.

:func:`compare_arms` turns a table of confirmatory trials (one row per arm x seed) into per-arm
summaries, one result per contrast and a study verdict; with the shared fields added by
:func:`studies.kinds.compare.workflow.analyse` it is what a study writes to ``verdict.json``.

The rule (docs/science.md, "The Affine Divergence main table"):

* Seeds are the unit. Every arm runs the same seeds, so a contrast ``arm − reference`` is a set of
  per-seed paired differences ``d`` of the final test metric; its estimate is the mean of ``d``,
  its interval the two-sided t-interval over the seeds (K − 1 df), its p the exact two-sided
  sign-flip p of ``sum(d)`` (:func:`studies.stats.paired_contrast`; Monte-Carlo beyond 20 seeds).
  Holm (:func:`studies.stats.holm`) runs over the spec's contrasts only: an arm in no contrast is
  summarised, never tested.
* Failed trials (not ``completed``, or a non-finite metric) are scored at chance (``failed_value``)
  rather than dropped; without a chance level their seed leaves the pair.
* Gates come first; a contrast that fails one is ``inconclusive`` with the gate as its reason:
  ``lr-at-range-edge`` (either arm's tuned η on its grid's edge), ``failures`` (more than 20 % of
  either arm's trials failed), ``optimisation-limited`` (either arm's median final train loss above
  0.9 x chance loss: the arm did not learn), ``under-trained`` (either arm failed the training-adequacy
  check, :mod:`studies.adequacy`: the reason reads ``under-trained: <arm> reached <x>, +<g> at twice
  the budget``), ``underpowered`` (fewer than ``min_seeds`` paired seeds, or the smallest
  attainable sign-flip p times the number of contrasts not below ``alpha``). A study with an
  under-trained arm says ``not testable at this budget`` among its reasons.
* Then, in this order: ``equivalent`` when the interval lies strictly inside ``(−margin, +margin)``
  (a difference that small does not matter, whether or not it is significant); ``better`` /
  ``worse`` when the Holm-adjusted p is at most ``alpha`` (by the sign of the estimate, oriented by
  ``higher_is_better``); else ``inconclusive``.
* Each contrast's hypothesis (its predicted direction) is ``supported`` when its verdict is the
  predicted one, ``refuted`` when it is the opposite (``better`` for a predicted ``worse`` and vice
  versa), else ``inconclusive``. The study verdict is ``refuted`` when any contrast is refuted,
  ``supported`` when every one is supported, ``equivalent`` when every contrast is decided and a
  predicted difference is ``equivalent`` (inside the margin: the claim is not reproduced, and more
  seeds would not change that), else ``inconclusive``.

Everything is a function of the set of rows, not their order: seeds are sorted, the Monte-Carlo
stream (only beyond 20 seeds) is seeded from ``seed`` and the contrast's name.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from studies.adequacy import failed_cells, study_line
from studies.stats import holm_into, min_sign_flip_p, paired_contrast, t_interval

__all__ = [
    "CONTRAST_VERDICTS",
    "GATES",
    "compare_arms",
    "hypothesis_verdict",
]

CONTRAST_VERDICTS = ("better", "worse", "equivalent", "inconclusive")
GATES = ("lr-at-range-edge", "failures", "optimisation-limited", "under-trained", "underpowered")

_FAILURE_SHARE = 0.2
_NOT_LEARNED = 0.9
_OPPOSITE = {"better": "worse", "worse": "better"}
_REQUIRED = ("arm", "seed", "status")


def hypothesis_verdict(verdict: str, predicted: str) -> str:
    """A contrast's hypothesis: ``supported`` (verdict = predicted), ``refuted`` (its opposite),
    else ``inconclusive``."""
    if verdict == predicted:
        return "supported"
    if verdict == _OPPOSITE.get(predicted):
        return "refuted"
    return "inconclusive"


def _normalize(table: pd.DataFrame, metric: str) -> pd.DataFrame:
    missing = [c for c in (*_REQUIRED, metric) if c not in table.columns]
    if missing:
        raise ValueError(f"trial table lacks column(s) {missing}; required: {[*_REQUIRED, metric]}")
    df = pd.DataFrame(
        {
            "arm": table["arm"].astype(str),
            "seed": table["seed"].astype(str),
            "status": table["status"].astype(str).str.lower(),
            "value": pd.to_numeric(table[metric], errors="coerce").astype(float),
            "train_loss": pd.to_numeric(table["train_loss"], errors="coerce").astype(float)
            if "train_loss" in table.columns
            else np.nan,
            "lr": pd.to_numeric(table["lr"], errors="coerce").astype(float)
            if "lr" in table.columns
            else np.nan,
            "lr_at_edge": table["lr_at_edge"].astype(bool) if "lr_at_edge" in table.columns else False,
        }
    )
    df["ok"] = (df["status"] == "completed") & np.isfinite(df["value"].to_numpy())
    return df


def _arm_summary(
    df: pd.DataFrame, *, failed_value: float | None, chance_loss: float | None, confidence: float
) -> dict[str, Any]:
    """One arm's row of the per-arm table (failures scored at ``failed_value``)."""
    n, n_failed = len(df), int((~df["ok"]).sum())
    scored = _scored(df, failed_value)
    per_seed = scored.groupby(df["seed"]).mean().dropna()
    values = per_seed.to_numpy(dtype=float)
    ci: list[float] | None = None
    if values.size >= 2:
        lo, hi = t_interval(values, confidence)
        ci = [lo, hi]
    losses = df.loc[df["ok"], "train_loss"].to_numpy(dtype=float)
    losses = losses[np.isfinite(losses)]
    median_loss = float(np.median(losses)) if losses.size else None
    lrs = sorted({float(v) for v in df["lr"] if math.isfinite(float(v))})
    gates = []
    if bool(df["lr_at_edge"].any()):
        gates.append("lr-at-range-edge")
    if n and n_failed > _FAILURE_SHARE * n:
        gates.append("failures")
    if chance_loss is not None and median_loss is not None and median_loss > _NOT_LEARNED * chance_loss:
        gates.append("optimisation-limited")
    return {
        "n": n,
        "n_failed": n_failed,
        "n_seeds": int(values.size),
        "mean": float(values.mean()) if values.size else None,
        "ci": ci,
        "sd": float(values.std(ddof=1)) if values.size >= 2 else None,
        "median_train_loss": median_loss,
        "lr": lrs[0] if len(lrs) == 1 else (lrs or None),
        "lr_at_edge": bool(df["lr_at_edge"].any()),
        "gates": gates,
    }


def _scored(df: pd.DataFrame, failed_value: float | None) -> pd.Series:
    fill = np.nan if failed_value is None else float(failed_value)
    return df["value"].where(df["ok"], fill)


def compare_arms(
    table: pd.DataFrame,
    *,
    contrasts: Mapping[str, Mapping[str, Any]],
    metric: str = "test_accuracy",
    higher_is_better: bool = True,
    alpha: float = 0.05,
    margin: float = 0.01,
    confidence: float = 0.95,
    min_seeds: int = 5,
    n_mc: int = 99_999,
    seed: int = 0,
    failed_value: float | None = None,
    chance_loss: float | None = None,
    adequacy: Any = None,
) -> dict[str, Any]:
    """Per-arm summaries, per-contrast statistics and verdicts, and the study verdict.

    Args:
        table: one row per confirmatory trial: ``arm``, ``seed``, ``status``, ``<metric>`` and
            optionally ``train_loss``, ``lr``, ``lr_at_edge``.
        contrasts: name -> ``{"arm", "reference", "predicted": "better" | "worse"}``; the Holm family.
        metric / higher_is_better: the final metric per trial and its direction.
        alpha: the family-wise level (Holm over ``contrasts``).
        margin: the equivalence margin (metric units, >= 0).
        confidence: level of the t-intervals.
        min_seeds: fewest paired seeds for a decision.
        n_mc / seed: Monte-Carlo sign patterns beyond 20 seeds, and their seed.
        failed_value: the metric a failed trial scores (chance accuracy); ``None`` drops its seed
            from the pairs it is in.
        chance_loss: ln C; a median final train loss above 0.9 x it is ``optimisation-limited``.
        adequacy: the training-adequacy check per arm (:func:`studies.adequacy.measure`: ``{arm:
            {"passed", "reached", "gain", "reason", ...}}``); an arm whose entry did not pass is
            ``under-trained``. ``None`` or :data:`studies.adequacy.NOT_MEASURED` (or the spec's
            ``analysis.adequacy`` settings, which hold no measurement): nothing measured, no gate.

    Returns:
        ``{"arms": {arm: {...}}, "contrasts": {name: {arm, reference, predicted, estimate, ci,
        p_value, p_value_holm, verdict, reasons, hypothesis, n_seeds, differences, ...}},
        "study_verdict", "study_reasons", "exploratory", "metric", ...}``.
    """
    if margin < 0:
        raise ValueError(f"margin must be >= 0, got {margin}")
    if not contrasts:
        raise ValueError("no contrast to test")
    df = _normalize(table, metric)
    arm_names = sorted(set(df["arm"]))
    in_contrast = {x for c in contrasts.values() for x in (str(c["arm"]), str(c["reference"]))}
    arms: dict[str, dict[str, Any]] = {}
    checks = adequacy if isinstance(adequacy, Mapping) and "check" not in adequacy else None
    for arm in sorted(set(arm_names) | in_contrast):
        rows = df[df["arm"] == arm]
        arms[arm] = {
            "role": "contrast" if arm in in_contrast else "table only",
            **_arm_summary(rows, failed_value=failed_value, chance_loss=chance_loss, confidence=confidence),
        }
        under = failed_cells(checks, [arm])
        if under:
            arms[arm]["gates"].append("under-trained")
            arms[arm]["under_trained"] = under[0]
    family = len(contrasts)
    sign = 1.0 if higher_is_better else -1.0
    results: dict[str, dict[str, Any]] = {}
    for name in sorted(contrasts):
        c = contrasts[name]
        a, r, predicted = str(c["arm"]), str(c["reference"]), str(c.get("predicted", "better"))
        va = _scored(df[df["arm"] == a], failed_value).groupby(df.loc[df["arm"] == a, "seed"]).mean()
        vr = _scored(df[df["arm"] == r], failed_value).groupby(df.loc[df["arm"] == r, "seed"]).mean()
        paired = pd.concat([va.rename("a"), vr.rename("r")], axis=1, join="inner").dropna()
        paired = paired.loc[sorted(paired.index, key=lambda s: (len(s), s))]
        k = len(paired)
        res: dict[str, Any] = {
            "arm": a,
            "reference": r,
            "arms": [a, r],
            "predicted": predicted,
            "n_seeds": k,
            "seeds": [str(s) for s in paired.index],
            "estimate": None,
            "ci": None,
            "p_value": None,
            "p_value_holm": None,
            "differences": [],
            "min_attainable_p": min_sign_flip_p(k, "two-sided") if k else 1.0,
        }
        if k >= 2:
            st = paired_contrast(
                paired["a"].to_numpy(),
                paired["r"].to_numpy(),
                alternative="two-sided",
                confidence=confidence,
                n_mc=n_mc,
                seed=seed + zlib.crc32(name.encode()),
            )
            res.update(
                estimate=st["estimate"],
                ci=st["ci"],
                p_value=st["p_value"],
                differences=st["differences"],
                method=st["method"],
            )
        elif k == 1:
            res["estimate"] = float(paired["a"].iloc[0] - paired["r"].iloc[0])
            res["differences"] = [res["estimate"]]
        gates: list[str] = []
        gate_arms: dict[str, list[str]] = {}
        for gate in GATES[:4]:  # the arm gates: either arm's failing one contaminates the pair
            who = [x for x in (a, r) if gate in arms[x]["gates"]]
            if who:
                gates.append(gate)
                gate_arms[gate] = who
        if k < min_seeds or res["min_attainable_p"] * family >= alpha:
            gates.append("underpowered")
        res["gates"] = gates
        res["gate_arms"] = gate_arms
        res["gate_reasons"] = {
            "under-trained": [arms[x]["under_trained"] for x in gate_arms.get("under-trained", [])]
        }
        results[name] = res

    holm_into(results)
    for res in results.values():
        res["verdict"], res["reasons"] = _verdict(res, alpha=alpha, margin=margin, sign=sign)
        del res["gate_reasons"]  # spelt out in the reasons
        res["hypothesis"] = hypothesis_verdict(res["verdict"], res["predicted"])
    labels = [res["hypothesis"] for res in results.values()]
    if "refuted" in labels:
        study = "refuted"
    elif labels and all(v == "supported" for v in labels):
        study = "supported"
    elif labels and all(
        r["hypothesis"] == "supported" or r["verdict"] == "equivalent" for r in results.values()
    ):
        study = "equivalent"  # every contrast decided; a predicted difference is absent (inside the margin)
    else:
        study = "inconclusive"
    study_reasons = [
        f"{name}: {res['verdict']} (predicted {res['predicted']})"
        + (f" — {'; '.join(res['reasons'])}" if res["reasons"] else "")
        for name, res in results.items()
    ]
    untestable = study_line(
        {x: checks[x] for x in sorted(in_contrast) if checks and x in checks} if checks else None
    )
    if untestable:
        study_reasons.insert(0, untestable)
    return {
        "metric": metric,
        "higher_is_better": bool(higher_is_better),
        "alpha": float(alpha),
        "margin": float(margin),
        "confidence": float(confidence),
        "min_seeds": int(min_seeds),
        "family_size": family,
        "arms": arms,
        "contrasts": results,
        "study_verdict": study,
        "study_reasons": study_reasons,
        "exploratory": any("underpowered" in r["gates"] for r in results.values()),
    }


def _verdict(res: Mapping[str, Any], *, alpha: float, margin: float, sign: float) -> tuple[str, list[str]]:
    """``(verdict, reasons)`` of one contrast, gates first (see the module docstring)."""
    if res["gates"]:
        detail = res.get("gate_reasons") or {}
        return "inconclusive", [r for g in res["gates"] for r in (detail.get(g) or [g])]
    ci, p, est = res["ci"], res["p_value_holm"], res["estimate"]
    if ci is not None and -margin < ci[0] and ci[1] < margin:
        return "equivalent", []
    if p is not None and est is not None and p <= alpha and est != 0:
        return ("better" if sign * est > 0 else "worse"), []
    return "inconclusive", [
        f"undecided: Holm p {_fmt(p)} > alpha {alpha:g} and the interval is not inside ±{margin:g}"
    ]


def _fmt(v: Any) -> str:
    return "n/a" if v is None else f"{float(v):.3g}"
