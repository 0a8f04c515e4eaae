"""Designs of the search kind (its AutoNorm claims) that can never decide (see :mod:`studies.decidability`)."""

from __future__ import annotations

from typing import Any

from studies.decidability import Undecidable, fewest_seeds, sequential_undecidable, too_few_seeds

__all__ = ["DesignRefusal", "design_refusals", "undecidable"]


class DesignRefusal(Undecidable):
    """A design that cannot test its claim whatever the seeds: claim b's AutoNorm-S frozen for too
    little of training to differ from AutoNorm, or tuning too thin to tell its noise."""

    def message(self) -> str:
        return (
            f"hypothesis {self.hypothesis!r} cannot be tested by this design: {self.why}. Run it anyway as "
            "exploratory with --allow-exploratory or `exploratory: true`"
        )


def design_refusals(spec: Any) -> list[Undecidable]:
    """The round-5 rules of a claims design (docs/science.md §4.2): claim b's freeze (``confirm.freeze``)
    leaves at least half of training frozen (:data:`~studies.kinds.search.spec.MIN_FROZEN_SHARE`), and
    a tuning that flags its noise (``confirm.lr_tuning.flag_noisy``) runs on at least 2 seeds. A spec
    without ``confirm.freeze`` (stored before it existed) is the design it ran as: not refused here."""
    from studies.kinds.search.spec import MIN_FROZEN_SHARE

    confirm = spec.confirm
    out: list[Undecidable] = []
    if confirm is None or not confirm.run_claims:
        return out
    epochs = int(spec.training.epochs)
    freeze = confirm.freeze
    if freeze is not None and {"autonorm", "autonorm_s"} <= set(confirm.arms):
        share = freeze.frozen_share(epochs)
        if share < MIN_FROZEN_SHARE:
            why = (
                f"confirm.freeze freezes AutoNorm-S's gate at the end of epoch {freeze.epoch(epochs)} of "
                f"{epochs}, so it trains frozen for {share:.0%} of the epochs, less than half: AutoNorm-S "
                "cannot be told from AutoNorm; "
                + (
                    f"freeze by epoch {latest}"
                    if (latest := int(epochs * (1 - MIN_FROZEN_SHARE))) >= 1
                    else "train for at least 2 epochs"
                )
            )
            out.append(DesignRefusal("claim b", "confirm.freeze.t_freeze", 1.0, confirm.alpha, 0, None, why))
    tuning = confirm.lr_tuning
    if tuning is not None and tuning.flag_noisy and len(tuning.seeds) < 2:
        why = (
            f"confirm.lr_tuning runs on {len(tuning.seeds)} seed: no standard error of a learning rate's "
            "score, so tuning noise cannot be told from a better rate; tune on at least 2 seeds"
        )
        out.append(
            DesignRefusal(
                "every claim (lr tuning)", "confirm.lr_tuning.seeds", 1.0, confirm.alpha, 0, None, why
            )
        )
    return out


def undecidable(spec: Any) -> list[Undecidable]:
    """The claims whose design cannot reach a decision: the gates of
    :func:`studies.kinds.search.claims.autonorm_claims` (``confirm.min_seeds``, the smallest sign-flip
    p times the Holm family of the claimed contrasts below ``alpha``; a reported one, e, tested alone),
    checked before the study runs, with :func:`design_refusals`."""
    from studies.kinds.search.claims import _APPLIES, _CONTRASTS, REPORTED
    from studies.kinds.search.spec import data_kind_of
    from studies.stats import min_sign_flip_p as _min_attainable_p

    confirm = spec.confirm
    if confirm is None or not confirm.run_claims:
        return []
    refused = design_refusals(spec)
    kind = confirm.data_kind if confirm.data_kind != "auto" else data_kind_of(spec.data)
    k, alpha, arms = len(confirm.seeds), confirm.alpha, set(confirm.arms)
    family = [c for c in _CONTRASTS if kind in _APPLIES[c[0]]]
    claimed = [c for c in family if c[0] not in REPORTED]  # Holm's family; a reported claim is alone
    out: list[Undecidable] = list(refused)
    if getattr(spec, "sequential", None) is not None:
        groups = [claimed, *([c] for c in family if c[0] in REPORTED)]
        for group in groups:
            names = [f"claim {c}" for c, a, b, _ in group if {a, b} <= arms]
            out += sequential_undecidable(spec, names, alpha) if names else []
        return out

    def add(claim: str, p_of: Any) -> None:
        p = p_of(k)
        reasons = too_few_seeds(k, confirm.min_seeds, "confirm.min_seeds")
        if p >= alpha:
            reasons.append(
                "the sign-flip p"
                + (
                    f" times the Holm family size ({len(claimed)})"
                    if claim in {c[0] for c in claimed}
                    else ""
                )
                + " cannot get below alpha"
            )
        if reasons:
            needed = fewest_seeds(p_of, alpha, confirm.min_seeds)
            out.append(
                Undecidable(f"claim {claim}", "confirm.seeds", p, alpha, k, needed, "; ".join(reasons))
            )

    for claim, arm_a, arm_b, alternative in family:
        size = 1 if claim in REPORTED else len(claimed)
        if {arm_a, arm_b} <= arms:
            add(claim, lambda n, alt=alternative, size=size: _min_attainable_p(n, alt) * size)
    gated = bool(arms & {"autonorm", "autonorm_s"})
    if gated and kind in _APPLIES["c"]:
        add("c", lambda n: _min_attainable_p(n, "greater"))
    if gated and kind in _APPLIES["d"]:
        add("d", lambda n: 0.5**n)
    return out
