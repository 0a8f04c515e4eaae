"""Statistics of the AutoNorm claims study: paired contrasts, gate-depth slopes, gate collapse, verdicts.

The AutoNorm paper's qualitative claims (docs/science.md), tested on the confirmatory phase of the
claims study (search → confirm → claims):

==== ======================================================= ============== ==========================
id   claim                                                    data           test
==== ======================================================= ============== ==========================
a    RandomSelector ≥ AutoNorm on stationary data             vision         paired, one-sided greater
b    AutoNorm-S > AutoNorm (freezing the gate recovers it)    any            paired, one-sided greater
e    AutoNorm-S vs FrozenLN (reported, not a paper claim)     any            paired, two-sided
c    NLP gates prefer DyT in deep layers                      text           slope of DyT weight > 0
d    vision gates collapse to LN early (H → 0)                vision         first collapse epoch
==== ======================================================= ============== ==========================

Design choices that matter for validity:

* Seeds are the experimental unit. Every arm runs the same confirmatory seeds (same split, data order
  and, where shapes agree, init), so a contrast is the per-seed paired difference ``d_k = a_k − b_k``
  of the final test metric. Its CI is the t-interval over the K seeds (K − 1 df); its p-value is the
  exact sign-flip (paired randomisation) p over all ``2^K`` sign patterns of ``d`` (Monte-Carlo with
  the +1 correction above ``2^20`` patterns), valid without normality.
* Holm's step-down correction runs over the contrasts that are tested on this data ({a, b, e} on
  images, {b, e} on text). The gate claims (c, d) are separate, pre-specified descriptive tests at
  level ``alpha``; ``c`` combines its two sub-layer types as an intersection-union test (supported
  only when both are, p = the larger of the two), which needs no multiplicity correction.
* Failed trials (status not completed, or a non-finite metric) are never silently dropped: they are
  scored at chance (``chance``, e.g. ``1 / num_classes``) and counted; without a chance level they
  are excluded and the claim says so. More than ``max_failure_fraction`` failures in an arm of a
  contrast make it ``inconclusive`` (reason ``failures``). The analysis without failed seeds is
  reported as ``sensitivity``.
* Verdicts: ``supported`` when the (Holm-adjusted, for a/b/e) p < ``alpha`` AND the CI lies in the
  claimed direction; ``refuted`` when the CI lies entirely in the opposite direction; else
  ``inconclusive`` with reasons. A claim that does not apply to the data is ``inconclusive`` with
  reason ``not applicable to <data>``; fewer than ``min_seeds`` seeds, or a design whose smallest
  attainable p cannot pass the (Holm) threshold, gives ``inconclusive`` with reason ``underpowered``.

Everything returned is JSON-able (floats, ints, strings, lists, dicts, ``None`` for "not defined" or
"never"). numpy and scipy only: the confirmatory table may be a pandas DataFrame or any mapping of
column name → sequence. What claims c and d measure in the gate logs (depth slopes, collapse epochs)
is :mod:`studies.kinds.search.gates`; this module turns it into verdicts.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from typing import Any, Literal

import numpy as np

from studies.kinds.search.gates import (
    binom,
    collapse_epochs,
    dyt_depth_slope,
    gate_arrays,
    median_ci,
    seeds_of,
)
from studies.kinds.search.values import check_confidence, float_or_none, seed_key, to_float
from studies.stats import holm, min_sign_flip_p, paired_contrast, t_interval

__all__ = [
    "ARMS",
    "CLAIMS",
    "COMPLETED_STATUSES",
    "CONFIRM_COLUMNS",
    "REPORTED",
    "VERDICTS",
    "applies",
    "arms_needed",
    "autonorm_claims",
    "claimed_sequential",
    "hypothesis_arms",
    "paired_contrast",
]

Alternative = Literal["greater", "less", "two-sided"]
DataKind = Literal["vision", "text"]

#: Arms of the confirmatory phase.
ARMS = ("frozen_ln", "frozen_dyt", "random_selector", "autonorm", "autonorm_s")

#: Columns of ``confirm_table``, one row per confirmatory trial. Only ``arm``, ``seed``, ``status`` and
#: the metric are read; the others identify the trial in reports.
CONFIRM_COLUMNS = (
    "arm",
    "seed",
    "status",
    "test_accuracy",
    "val_accuracy",
    "train_loss",
    "lr",
    "trial_id",
    "mlflow_run_id",
)

#: Statuses of a trial that finished; anything else (``diverged``, ``error``, ...) is a failure.
#: Compared case-insensitively; ``terminated`` is Ray Tune's name for a trial that ran to the end.
COMPLETED_STATUSES = frozenset({"completed", "terminated"})

VERDICTS = ("supported", "refuted", "inconclusive")

#: The claims, as tested (ids are those of docs/science.md; c_attn / c_mlp are c's two sub-layer types).
CLAIMS: dict[str, str] = {
    "a": "RandomSelector is at least as good as unfrozen AutoNorm on stationary (vision) data "
    "(tested: random_selector − autonorm > 0)",
    "b": "Freezing the gate after a warm-up (AutoNorm-S) beats unfrozen AutoNorm (autonorm_s − autonorm > 0)",
    "e": "AutoNorm-S differs from FrozenLN (autonorm_s − frozen_ln, two-sided; reported, not a paper claim)",
    "c": "NLP gates prefer DyT in deep layers: per-seed slope of the final DyT weight vs block index > 0, "
    "for both the pre-attention and the pre-MLP norms",
    "c_attn": "pre-attention norms: slope of the final DyT weight vs block index > 0",
    "c_mlp": "pre-MLP norms: slope of the final DyT weight vs block index > 0",
    "d": "Vision gates collapse to LayerNorm early: the typical layer's gate entropy first falls below eps "
    "with LN weight > 0.5 no later than early_epoch",
}

# (claim, arm a, arm b, alternative) of the paired contrasts; d = a − b of the final metric.
_CONTRASTS: tuple[tuple[str, str, str, Alternative], ...] = (
    ("a", "random_selector", "autonorm", "greater"),
    ("b", "autonorm_s", "autonorm", "greater"),
    ("e", "autonorm_s", "frozen_ln", "two-sided"),
)
#: Contrasts reported, not claimed by the papers: each tested alone at alpha (its Holm p is its p),
#: outside the others' Holm family, and never a reason to run more seeds (PROTOCOL §5).
REPORTED: frozenset[str] = frozenset({"e"})
_APPLIES: dict[str, frozenset[str]] = {
    "a": frozenset({"vision"}),
    "b": frozenset({"vision", "text"}),
    "e": frozenset({"vision", "text"}),
    "c": frozenset({"text"}),
    "c_attn": frozenset({"text"}),
    "c_mlp": frozenset({"text"}),
    "d": frozenset({"vision"}),
}


def applies(claim: str, data_kind: str) -> bool:
    """Whether ``claim`` is tested on ``data_kind`` data (``vision`` or ``text``; ``tabular``: none)."""
    return data_kind in _APPLIES.get(claim, frozenset())


def claimed_sequential(data_kind: str) -> tuple[str, ...]:
    """The hypotheses a sequential claims study must decide on ``data_kind`` data: the claimed
    contrasts (a, b on images; b on text; not :data:`REPORTED`'s e, tested alone and never a reason
    for more seeds) and, on text, claim c's two sub-layer types."""
    tested = [c[0] for c in _CONTRASTS] + ["c_attn", "c_mlp"]
    return tuple(c for c in tested if applies(c, data_kind) and c not in REPORTED)


def hypothesis_arms(claim: str, *, gate_arm: str = "autonorm") -> tuple[str, ...]:
    """The confirmatory arms a claim rests on: a contrast's two arms, the gate claims' gate arm."""
    for name, arm_a, arm_b, _ in _CONTRASTS:
        if name == claim:
            return (arm_a, arm_b)
    if claim in ("c", "c_attn", "c_mlp", "d"):
        return (gate_arm,)
    raise ValueError(f"unknown claim {claim!r}; known: {sorted(CLAIMS)}")


def arms_needed(
    hypotheses: Mapping[str, Mapping[str, Any]],
    arms: Sequence[str],
    *,
    gate_arm: str = "autonorm",
    under_trained: Collection[str] = (),
) -> list[str]:
    """Per-arm stopping (PROTOCOL §5): of ``arms``, those a claimed hypothesis still undecided at
    the last look (``hypotheses``: a look's ``{claim: {decision, reported, ...}}``) rests on. An arm
    whose every claimed hypothesis is decided (rejected or futile) gets no more seeds; decisions are
    final, so it never needs them again. A reported hypothesis needs no arm. Nor does one resting on
    an arm of ``under_trained`` (arms whose training-adequacy check did not pass): it ends
    ``inconclusive`` by rule (:func:`studies.kinds.search.adequacy.gate_claims`) whatever more seeds
    show, so it is as decided as a futile one."""
    needed: set[str] = set()
    for claim, h in hypotheses.items():
        if h.get("reported") or claim in REPORTED or h.get("decision") in ("reject", "futile"):
            continue
        rests_on = hypothesis_arms(claim, gate_arm=gate_arm)
        if any(arm in under_trained for arm in rests_on):
            continue
        needed.update(rests_on)
    return [arm for arm in arms if arm in needed]


# ------------------------------------------------------------------------------- confirm table


def _column(table: Any, name: str) -> np.ndarray:
    try:
        columns = list(table.columns) if hasattr(table, "columns") else list(table)
    except TypeError:
        raise ValueError("confirm_table must be a DataFrame or a mapping of columns") from None
    if name not in columns:
        raise ValueError(
            f"confirm_table is missing column {name!r}; required: arm, seed, status and the metric"
        )
    return np.asarray(table[name])


def _arm_values(table: Any, metric: str) -> dict[str, dict[int | str, tuple[float, bool]]]:
    """arm → seed → (metric value, completed) from the confirmatory table."""
    arms = _column(table, "arm").astype(str)
    seeds = _column(table, "seed")
    statuses = np.char.lower(_column(table, "status").astype(str))
    values = np.array([to_float(v) for v in _column(table, metric)])
    out: dict[str, dict[int | str, tuple[float, bool]]] = {}
    for arm, s, status, value in zip(arms, seeds, statuses, values):
        key = seed_key(s)
        cell = out.setdefault(str(arm), {})
        if key in cell:
            raise ValueError(f"confirm_table has more than one trial for arm {arm!r}, seed {key!r}")
        ok = str(status) in COMPLETED_STATUSES and math.isfinite(value)
        cell[key] = (value, ok)
    return out


def _result(claim: str, **fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "claim": CLAIMS[claim],
        "verdict": "inconclusive",
        "estimate": None,
        "ci": [None, None],
        "p_value": None,
        "p_value_holm": None,
        "n_seeds": 0,
        "reasons": [],
    }
    base.update(fields)
    return base


def _tested(test: Mapping[str, Any], *keys: str, **fields: Any) -> dict[str, Any]:
    """A test's ``estimate``, ``ci``, ``p_value``, ``n_seeds`` and ``keys``, ``fields`` over them."""
    return {**{k: test.get(k) for k in ("estimate", "ci", "p_value", "n_seeds", *keys)}, **fields}


def _direction_verdict(
    p: float | None, ci: Sequence[float | None], alternative: str, alpha: float, reasons: list[str]
) -> str:
    """supported / refuted / inconclusive from a (possibly adjusted) p and a CI, for one direction."""
    lo, hi = ci
    if lo is None or hi is None or p is None:
        reasons.append("no interval")
        return "inconclusive"
    if alternative == "greater":
        in_dir, opposite = lo > 0, hi < 0
    elif alternative == "less":
        in_dir, opposite = hi < 0, lo > 0
    else:  # two-sided: a difference either way; nothing to refute without an equivalence margin
        in_dir, opposite = lo > 0 or hi < 0, False
    if opposite:
        reasons.append("CI lies entirely in the opposite direction")
        return "refuted"
    if p < alpha and in_dir:
        return "supported"
    if p >= alpha:
        reasons.append(f"p = {p:.3g} >= alpha = {alpha:g}")
    if not in_dir:
        reasons.append("CI includes 0")
    return "inconclusive"


def _contrast(
    claim: str,
    arm_a: str,
    arm_b: str,
    alternative: Alternative,
    values: Mapping[str, Mapping[int | str, tuple[float, bool]]],
    *,
    chance: float | None,
    max_failure_fraction: float,
    confidence: float,
    n_mc: int,
    seed: int,
) -> dict[str, Any]:
    """One paired contrast (before Holm); reasons other than the verdict's own are filled in here."""
    reasons: list[str] = []
    missing = [arm for arm in (arm_a, arm_b) if arm not in values]
    if missing:
        return _result(claim, reasons=[f"arm {arm} missing from confirm_table" for arm in missing])
    cells_a, cells_b = values[arm_a], values[arm_b]
    seeds = sorted(set(cells_a) & set(cells_b), key=str)
    unpaired = sorted(set(cells_a) ^ set(cells_b), key=str)
    if unpaired:
        reasons.append(f"seeds without a pair dropped: {unpaired}")
    failed = {
        arm: [s for s in seeds if not cells[s][1]] for arm, cells in ((arm_a, cells_a), (arm_b, cells_b))
    }
    n_failed = {arm: len(f) for arm, f in failed.items()}
    for arm, n in n_failed.items():
        if seeds and n / len(seeds) > max_failure_fraction:
            reasons.append(f"failures: {n} of {len(seeds)} {arm} trials failed")

    def scored(cells: Mapping[int | str, tuple[float, bool]], s: int | str) -> float:
        value, ok = cells[s]
        return value if ok else (chance if chance is not None else math.nan)

    both_ok = [s for s in seeds if cells_a[s][1] and cells_b[s][1]]
    if chance is None and len(both_ok) < len(seeds):
        reasons.append("failed trials excluded (no chance level given to score them)")
        used = both_ok
    else:
        used = seeds
    extra: dict[str, Any] = {"arms": [arm_a, arm_b], "n_failed": n_failed, "seeds": used}
    if len(used) < 2:
        return _result(claim, n_seeds=len(used), reasons=[*reasons, "underpowered"], **extra)
    a = np.array([scored(cells_a, s) for s in used])
    b = np.array([scored(cells_b, s) for s in used])
    test = paired_contrast(a, b, alternative=alternative, confidence=confidence, n_mc=n_mc, seed=seed)
    if used != both_ok and len(both_ok) >= 2:
        sens = paired_contrast(
            [cells_a[s][0] for s in both_ok],
            [cells_b[s][0] for s in both_ok],
            alternative=alternative,
            confidence=confidence,
            n_mc=n_mc,
            seed=seed,
        )
        extra["sensitivity"] = _tested(sens)
    return _result(
        claim,
        reasons=reasons,
        **_tested(test, "differences", "method"),
        alternative=alternative,
        **extra,
    )


def _gate_depth_claims(
    logs: Mapping[int | str, Sequence[Mapping[str, Any]]],
    *,
    gate_arm: str,
    min_seeds: int,
    alpha: float,
    confidence: float,
    n_mc: int,
    seed: int,
) -> dict[str, dict[str, Any]]:
    """Claims c_attn, c_mlp and their summary c from the final epoch's DyT weights."""
    per_type: dict[str, dict[int | str, np.ndarray]] = {"c_attn": {}, "c_mlp": {}}
    dropped: list[int | str] = []
    n_blocks = None
    for s, rows in logs.items():
        dyt = gate_arrays(rows)["dyt"]
        if dyt.shape[0] == 0 or dyt.shape[1] < 2:
            dropped.append(s)
            continue
        final = dyt[-1]
        # Layers in module order: block b's pre-attention norm is 2b, its pre-MLP norm 2b + 1; an odd
        # count means the final encoder norm is a gate too, which belongs to neither type.
        blocks = final.size // 2
        if not np.isfinite(final[: 2 * blocks]).all():
            dropped.append(s)
            continue
        n_blocks = blocks if n_blocks is None else n_blocks
        if blocks != n_blocks:
            raise ValueError(f"gate logs of arm {gate_arm!r}: seeds differ in depth ({blocks} vs {n_blocks})")
        per_type["c_attn"][s] = final[0 : 2 * blocks : 2]
        per_type["c_mlp"][s] = final[1 : 2 * blocks : 2]
    common = [f"gate arm {gate_arm}"] + (
        [f"seeds without final gate weights dropped: {dropped}"] if dropped else []
    )
    out: dict[str, dict[str, Any]] = {}
    slopes: dict[str, dict[int | str, float]] = {}
    for claim, weights in per_type.items():
        reasons = list(common)
        k = len(weights)
        if n_blocks is None or n_blocks < 2 or k < 2:
            out[claim] = _result(
                claim, n_seeds=k, reasons=[*reasons, "underpowered", "fewer than 2 blocks or seeds"]
            )
            continue
        res = dyt_depth_slope(weights, confidence=confidence, n_mc=n_mc, seed=seed)
        slopes[claim] = res["slopes"]
        if k < min_seeds or min_sign_flip_p(k, "greater") >= alpha:
            reasons.append("underpowered")
            verdict = "inconclusive"
        else:
            verdict = _direction_verdict(res["p_value"], res["ci"], "greater", alpha, reasons)
        out[claim] = _result(
            claim, verdict=verdict, reasons=reasons, **_tested(res, "slopes", "n_blocks", n_seeds=k)
        )
    # Summary c: intersection-union test of both sub-layer types.
    subs = [out["c_attn"], out["c_mlp"]]
    verdicts = [r["verdict"] for r in subs]
    reasons = [
        f"{name}: {r['verdict']}" + (f" ({'; '.join(r['reasons'][1:])})" if r["reasons"][1:] else "")
        for name, r in zip(("c_attn", "c_mlp"), subs)
    ]
    if all(v == "supported" for v in verdicts):
        verdict, reasons = "supported", []
    elif "refuted" in verdicts and "supported" not in verdicts:
        verdict = "refuted"
    else:
        verdict = "inconclusive"
    summary = _result("c", verdict=verdict, reasons=[f"gate arm {gate_arm}", *reasons])
    if len(slopes) == 2:
        shared = [s for s in slopes["c_attn"] if s in slopes["c_mlp"]]
        if len(shared) >= 2:
            mean_slope = np.array([(slopes["c_attn"][s] + slopes["c_mlp"][s]) / 2 for s in shared])
            lo, hi = t_interval(mean_slope, confidence)
            summary.update(estimate=float(mean_slope.mean()), ci=[lo, hi], n_seeds=len(shared))
        ps = [r["p_value"] for r in subs]
        summary["p_value"] = max(ps) if all(p is not None for p in ps) else None
    return {"c": summary, **out}


def _collapse_claim(
    logs: Mapping[int | str, Sequence[Mapping[str, Any]]],
    *,
    gate_arm: str,
    eps: float,
    early_epoch: int | None,
    min_seeds: int,
    alpha: float,
    confidence: float,
) -> dict[str, Any]:
    """Claim d: the per-seed median (over layers) collapse epoch is at most ``early_epoch``."""
    reasons = [f"gate arm {gate_arm}"]
    arrays = {s: gate_arrays(rows) for s, rows in logs.items()}
    arrays = {s: a for s, a in arrays.items() if a["entropy"].size}
    if len(arrays) < 2:
        return _result("d", n_seeds=len(arrays), reasons=[*reasons, "underpowered"])
    n_epochs = max(a["entropy"].shape[0] for a in arrays.values())
    n_layers = max(a["entropy"].shape[1] for a in arrays.values())

    def padded(x: np.ndarray) -> np.ndarray:  # a trial that stopped early: later epochs never collapse
        out = np.full((n_epochs, n_layers), math.nan)
        out[: x.shape[0], : x.shape[1]] = x
        return out

    summary = collapse_epochs(
        {s: padded(a["entropy"]) for s, a in arrays.items()},
        {s: padded(a["ln"]) for s, a in arrays.items()},
        eps=eps,
        confidence=confidence,
    )
    early = early_epoch if early_epoch is not None else max(1, n_epochs // 2)
    stat = np.array([math.inf if v is None else v for v in summary["per_seed_median"].values()])
    k = stat.size
    n_early = int((stat <= early).sum())
    p = float(binom().sf(n_early - 1, k, 0.5))  # sign test, H1: median collapse epoch <= early
    lo, hi, coverage = median_ci(stat, confidence)
    ci = [float_or_none(lo), float_or_none(hi)]
    if k < min_seeds or 0.5**k >= alpha:
        reasons.append("underpowered")
        verdict = "inconclusive"
    elif ci[0] is None or ci[0] > early:  # even the lower bound collapses late, or never
        verdict = "refuted"
        reasons.append(f"CI lies entirely after epoch {early}")
    elif p < alpha and ci[1] is not None and ci[1] <= early:
        verdict = "supported"
    else:
        verdict = "inconclusive"
        if p >= alpha:
            reasons.append(f"p = {p:.3g} >= alpha = {alpha:g}")
        if ci[1] is None or ci[1] > early:
            reasons.append(f"CI reaches beyond epoch {early}")
    return _result(
        "d",
        verdict=verdict,
        estimate=float_or_none(np.median(stat)),
        ci=ci,
        p_value=p,
        n_seeds=k,
        reasons=reasons,
        early_epoch=early,
        n_early=n_early,
        ci_coverage=coverage,
        eps=eps,
        per_seed_median=summary["per_seed_median"],
        layers=summary["layers"],
    )


def autonorm_claims(
    confirm_table: Any,
    gate_logs: Mapping[tuple[str, Any], Sequence[Mapping[str, Any]]],
    *,
    data_kind: DataKind,
    min_seeds: int = 5,
    alpha: float = 0.05,
    eps: float = 0.1,
    confidence: float = 0.95,
    metric: str = "test_accuracy",
    chance: float | None = None,
    max_failure_fraction: float = 0.2,
    gate_arm: str = "autonorm",
    early_epoch: int | None = None,
    n_mc: int = 99_999,
    seed: int = 0,
    sequential: Mapping[str, Any] | None = None,
) -> dict[str, dict[str, Any]]:
    """Verdicts on the AutoNorm claims a–e from the confirmatory phase; the ``verdict.json`` content.

    Args:
        confirm_table: one row per confirmatory trial, a pandas DataFrame (or mapping of columns) with
            :data:`CONFIRM_COLUMNS`: ``arm`` (one of :data:`ARMS`), ``seed``, ``status``
            (``completed`` / ``terminated`` count as finished; ``diverged``, ``error``, ... are
            failures), ``test_accuracy`` (the final test metric compared), ``val_accuracy``,
            ``train_loss``, ``lr``, ``trial_id``, ``mlflow_run_id``. One trial per (arm, seed).
        gate_logs: ``(arm, seed) → per-epoch result rows`` of the gated arms (at least ``gate_arm``),
            i.e. the trial's per-epoch Tune results / ``FitResult.history`` in epoch order. Each row
            holds ``epoch`` and, per gate layer ``i`` in module order (block b's pre-attention norm is
            layer 2b, its pre-MLP norm 2b + 1; an extra last layer is a gated final norm),
            ``gate_entropy/layer_<i>`` (noise-free validation gate entropy, natural log) and
            ``dyt_weight/layer_<i>`` (mean validation DyT probability). The LN weight is
            ``ln_weight/layer_<i>`` when logged, else ``1 − dyt_weight`` (candidates dyt, layernorm).
        data_kind: ``"vision"`` (stationary images) or ``"text"``; decides which claims apply.
        min_seeds: fewer paired seeds → ``inconclusive`` (``underpowered``).
        alpha: significance level; contrasts a and b are Holm-adjusted over the family tested here;
            e (:data:`REPORTED`) is tested alone at ``alpha`` (its ``p_value_holm`` is its ``p_value``).
        eps: gate-entropy threshold of claim d.
        confidence: level of every CI.
        metric: column of ``confirm_table`` compared by the contrasts.
        chance: score of a failed trial (e.g. ``1 / num_classes``); ``None`` excludes failed trials.
        max_failure_fraction: above this share of failed trials in an arm → ``inconclusive``.
        gate_arm: arm whose gates claims c and d describe (unfrozen AutoNorm).
        early_epoch: claim d's "early": collapse no later than this epoch; ``None`` means half of the
            logged epochs.
        n_mc: Monte-Carlo sign patterns above 2^20 (more than 20 seeds).
        seed: seeds the Monte-Carlo draws.
        sequential: a sequential design (``{"looks", "seed_order", "min_effect", "prior_scale"}``,
            the protocol's §4): the contrasts' per-seed differences (Holm over a, b as above) and
            claim c's per-seed depth slopes (each sub-layer type at ``alpha`` on its own, as above)
            are tested anytime-validly at every look the data reach, in ``seed_order``; their
            sequential p and confidence sequence replace the fixed-design ones (kept in
            ``fixed_design``), a futile claim is ``refuted`` (``effect below min_effect``), and the
            looks are returned under the key ``"_looks"`` (the caller pops it).

    Returns:
        ``{claim_id: {"claim", "verdict", "estimate", "ci", "p_value", "p_value_holm", "n_seeds",
        "reasons", ...details}}`` for ids ``a``, ``b``, ``c``, ``c_attn``, ``c_mlp``, ``d``, ``e``.
        ``p_value_holm`` is ``None`` outside the Holm family (c, d and untested contrasts); ``c``'s
        estimate is the mean over seeds of the two sub-layer types' average slope and its p-value the
        larger of theirs.

    Raises:
        ValueError: bad options, a missing column, two trials for one (arm, seed).
    """
    if data_kind not in ("vision", "text"):
        raise ValueError(f"data_kind must be 'vision' or 'text', got {data_kind!r}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    if min_seeds < 2:
        raise ValueError(f"min_seeds must be at least 2, got {min_seeds}")
    check_confidence(confidence)
    values = _arm_values(confirm_table, metric)
    results: dict[str, dict[str, Any]] = {}
    not_applicable = f"not applicable to {data_kind}"

    # Paired contrasts a, b, e and Holm over those tested on this data.
    family = [c for c in _CONTRASTS if data_kind in _APPLIES[c[0]]]
    for claim, arm_a, arm_b, alternative in _CONTRASTS:
        if data_kind not in _APPLIES[claim]:
            results[claim] = _result(claim, reasons=[not_applicable])
            continue
        results[claim] = _contrast(
            claim,
            arm_a,
            arm_b,
            alternative,
            values,
            chance=chance,
            max_failure_fraction=max_failure_fraction,
            confidence=confidence,
            n_mc=n_mc,
            seed=seed,
        )
    # Holm over the claimed contrasts; a reported one (e) is tested alone at alpha (PROTOCOL §5).
    tested = {
        c[0]: results[c[0]]["p_value"]
        for c in family
        if results[c[0]]["p_value"] is not None and c[0] not in REPORTED
    }
    adjusted: dict[str, float | None] = dict(holm(tested)) if tested else {}
    adjusted.update({c[0]: results[c[0]]["p_value"] for c in family if c[0] in REPORTED})
    claimed = [c for c in family if c[0] not in REPORTED]
    for claim, _, _, alternative in family:
        res = results[claim]
        reasons = res["reasons"]
        res["p_value_holm"] = adjusted.get(claim)
        k = res["n_seeds"]
        if res["p_value"] is None:
            continue
        size = 1 if claim in REPORTED else len(claimed)
        if k < min_seeds or min_sign_flip_p(k, alternative) * size >= alpha:
            if "underpowered" not in reasons:
                reasons.append("underpowered")
            res["verdict"] = "inconclusive"
            continue
        verdict = _direction_verdict(res["p_value_holm"], res["ci"], alternative, alpha, reasons)
        if any(r.startswith("failures") for r in reasons) and verdict != "inconclusive":
            verdict = "inconclusive"
        res["verdict"] = verdict
        if claim == "e" and res["estimate"] is not None:
            res["direction"] = "autonorm_s better" if res["estimate"] > 0 else "autonorm_s worse"

    # Gate claims.
    logs = seeds_of(gate_logs, gate_arm)
    if data_kind == "text":
        results.update(
            _gate_depth_claims(
                logs,
                gate_arm=gate_arm,
                min_seeds=min_seeds,
                alpha=alpha,
                confidence=confidence,
                n_mc=n_mc,
                seed=seed,
            )
        )
    else:
        for claim in ("c", "c_attn", "c_mlp"):
            results[claim] = _result(claim, reasons=[not_applicable])
    if data_kind == "vision":
        results["d"] = _collapse_claim(
            logs,
            gate_arm=gate_arm,
            eps=eps,
            early_epoch=early_epoch,
            min_seeds=min_seeds,
            alpha=alpha,
            confidence=confidence,
        )
    else:
        results["d"] = _result("d", reasons=[not_applicable])
    out = {claim: results[claim] for claim in ("a", "b", "c", "c_attn", "c_mlp", "d", "e")}
    if sequential is not None:
        out["_looks"] = _sequential_claims(  # type: ignore[assignment]
            out, family=[c[0] for c in family], sequential=sequential, alpha=alpha, min_seeds=min_seeds
        )
    return out


#: Reasons a fixed-design verdict adds on its own; a sequential verdict replaces them with its own.
_VERDICT_REASONS = ("p = ", "CI includes 0", "CI lies entirely", "no interval", "underpowered")


def _sequential_claims(
    results: dict[str, dict[str, Any]],
    *,
    family: Sequence[str],
    sequential: Mapping[str, Any],
    alpha: float,
    min_seeds: int,
) -> list[dict[str, Any]]:
    """The sequential layer over the fixed-design results (in place); returns the looks."""
    from studies.stats import sequential_looks

    order = [seed_key(s) for s in sequential["seed_order"]]
    alternatives = {c[0]: c[3] for c in _CONTRASTS}
    alternatives.update(c_attn="greater", c_mlp="greater")

    def per_seed(claim: str) -> list[float] | None:
        res = results[claim]
        if res.get("slopes"):
            by_seed = {seed_key(k): float(v) for k, v in res["slopes"].items()}
        elif res.get("differences") is not None:
            by_seed = {seed_key(k): float(v) for k, v in zip(res["seeds"], res["differences"])}
        else:
            return None
        return [by_seed[s] for s in order if s in by_seed]

    common: dict[str, Any] = {
        "looks": list(sequential["looks"]),
        "alpha": alpha,
        "min_effect": sequential.get("min_effect"),
        "prior_scale": float(sequential.get("prior_scale", 1.0)),
        "stop_early": False,
    }
    # Holm over the contrasts (the fixed design's family); each sub-layer type of c at alpha alone.
    groups = [list(family)] + [[c] for c in ("c_attn", "c_mlp") if results[c].get("slopes")]
    merged: list[dict[str, Any]] = []
    for group in groups:
        values = {c: per_seed(c) for c in group}
        if not any(values.values()):
            continue
        looks = sequential_looks(
            values,
            alternatives={c: alternatives[c] for c in group},
            reported=[c for c in group if c in REPORTED],
            **common,
        )
        for j, look in enumerate(looks):
            if j == len(merged):
                merged.append({"n_seeds": look["n_seeds"], "hypotheses": {}})
            merged[j]["hypotheses"].update(look["hypotheses"])
    if not merged:
        return []
    for claim, h in merged[-1]["hypotheses"].items():
        res = results[claim]
        res["fixed_design"] = {k: res.get(k) for k in ("p_value", "p_value_holm", "ci")}
        ci = [v if isinstance(v, float) and math.isfinite(v) else None for v in h["ci"]]
        p = h["p_value_holm"] if claim in family else h["p_value"]
        reasons = [r for r in res.get("reasons") or [] if not str(r).startswith(_VERDICT_REASONS)]
        res.update(p_value=h["p_value"], p_value_holm=h["p_value_holm"] if claim in family else None, ci=ci)
        res["sequential"] = h["decision"]
        if h["n"] < min_seeds:
            verdict = "inconclusive"
            reasons.append("underpowered")
        elif h["decision"] == "futile":
            verdict = "refuted"
            reasons.append("effect below min_effect")
        else:
            verdict = _direction_verdict(p, ci, alternatives[claim], alpha, reasons)
        if any(str(r).startswith("failures") for r in reasons) and verdict != "inconclusive":
            verdict = "inconclusive"
        res["verdict"], res["reasons"] = verdict, reasons
    if "c_attn" in merged[-1]["hypotheses"] or "c_mlp" in merged[-1]["hypotheses"]:
        subs = [results["c_attn"]["verdict"], results["c_mlp"]["verdict"]]
        c = results["c"]
        if all(v == "supported" for v in subs):
            c["verdict"] = "supported"
        elif "refuted" in subs and "supported" not in subs:
            c["verdict"] = "refuted"
        else:
            c["verdict"] = "inconclusive"
        ps = [results[x]["p_value"] for x in ("c_attn", "c_mlp")]
        c["p_value"] = max(ps) if all(v is not None for v in ps) else None
    for look in merged:  # strict JSON: an unbounded interval (too few seeds) has None bounds
        for h in look["hypotheses"].values():
            h["ci"] = [v if isinstance(v, float) and math.isfinite(v) else None for v in h["ci"]]
    return merged
