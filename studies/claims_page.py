"""The results page's opening: one row per claim of the two papers, and one figure of them all.

``docs/results.md`` (:mod:`studies.results`) opens with :func:`claim_lines`: a table of at most eight
columns, one row per claim of the AutoNorm paper ((a)–(d)) and of the Affine Divergence paper (the
batch-size hypothesis and the main table's two rows), each read from whichever stored studies test
it: the verdict, the estimate with its interval in the claim's units, the seeds, whether the arms
learned the task (adequacy, with what they reached against what the paper reports), the scope
against the paper's, and one sentence. :func:`plot_claims` draws every claim's effects with their
intervals on one axis (a forest plot), the ± min-effect band shaded, points coloured by verdict.

A claim no stored study tests says so (``not run``); nothing here decides a verdict: every cell is
read from a ``verdict.json``. A study whose arms were never checked for having learned the task (its
``verdict.json`` has no ``adequacy``: the small-scale studies, stored before the check existed) is
marked ``unchecked``; where a checked study tests the same claim, the claim's verdict and sentence
are the checked studies' and the unchecked verdicts stay beside them, marked. With several studies
in a row, each cell gives each study's part on a line of its own, under the study's name.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "PAPER_CLAIMS",
    "ClaimRow",
    "PaperClaim",
    "Point",
    "claim_lines",
    "claim_rows",
    "interval_text",
    "plot_claims",
    "point",
]

NONE = "—"
#: The smallest effect the page shades as negligible when a study states none (the specs' default).
DEFAULT_MIN_EFFECT = 0.005

Study = tuple[str, Mapping[str, Any]]
"""A stored study: its name and its ``verdict.json``."""


@dataclass(frozen=True)
class Point:
    """One effect on the figure: ``label`` (study and hypothesis), estimate, interval, verdict."""

    label: str
    estimate: float
    low: float | None
    high: float | None
    verdict: str


@dataclass(frozen=True)
class ClaimRow:
    """One row of the per-claim table, every cell text, and the points it puts on the figure."""

    claim: str
    verdict: str
    estimate: str
    seeds: str
    adequacy: str
    scope: str
    reading: str
    points: tuple[Point, ...]


@dataclass(frozen=True)
class PaperClaim:
    """A claim of one of the two papers and where the stored studies test it.

    Attributes:
        label: ``(a)``, ``main table, MLP`` ...
        text: the claim in words.
        unit: what the estimate measures (``accuracy difference`` ...).
        paper: what the paper reached, and on what (its scope), for the adequacy and scope cells.
        decided_by: the hypothesis whose verdict is the claim's (``c``: both sub-layer types;
            ``(study)``: the study verdict of a compound claim); ``None``: each tested hypothesis's.

    Which stored studies test a claim, with which hypotheses, is their kind's to say
    (:meth:`studies.contract.StudyKind.paper_claims`, by ``label``; :func:`tests`), and so is an
    estimand other than a hypothesis's own estimate (:meth:`~studies.contract.StudyKind.claim_estimates`):
    the page names no kind.
    """

    label: str
    text: str
    unit: str
    paper: str
    decided_by: str | None = None

    def tests(self, verdict: Mapping[str, Any]) -> list[tuple[str, str]]:
        """The hypotheses of a stored ``verdict.json`` that test this claim (empty: none), as its
        kind says (:meth:`studies.contract.StudyKind.paper_claims`)."""
        kind = _kind(verdict)
        return list(kind.paper_claims(verdict).get(self.label) or []) if kind is not None else []


def _kind(verdict: Mapping[str, Any]) -> Any:
    """The registered kind a ``verdict.json`` names (``None``: a kind not installed here)."""
    from studies.kinds import KINDS

    return KINDS.get(str(verdict.get("kind")))


#: The papers' claims, in the order the page lists them. ``paper`` quotes the papers' own numbers
#: (AutoNorm: Fashion-MNIST ViT 92.95 %, PTB POS 97.42 %; PROTOCOL §1) or, for the Affine Divergence
#: paper's table, what such models reach on Fashion-MNIST in the literature (small CNNs 91–93 %,
#: MLPs ~89 %).
PAPER_CLAIMS: tuple[PaperClaim, ...] = (
    PaperClaim(
        "(a)",
        "RandomSelector ≥ learned AutoNorm gate on stationary (vision) data",
        "accuracy difference, RandomSelector − AutoNorm",
        "ViT, Fashion-MNIST 92.95 %",
    ),
    PaperClaim(
        "(b)",
        "freezing the gate after a warm-up (AutoNorm-S) beats AutoNorm",
        "accuracy difference, AutoNorm-S − AutoNorm",
        "ViT, Fashion-MNIST 92.95 %; PTB POS tagger 97.42 %",
    ),
    PaperClaim(
        "(c)",
        "NLP gates prefer DyT in deep layers",
        "slope of the DyT weight per block (pre-attention; pre-MLP)",
        "PTB POS tagger 97.42 %",
        decided_by="c",
    ),
    PaperClaim(
        "(d)",
        "vision gates collapse to LayerNorm early",
        "share of layers collapsed by the early epoch",
        "ViT, Fashion-MNIST 92.95 %",
    ),
    PaperClaim(
        "batch size",
        "divergence-corrected layers get worse as batch size grows; BatchNorm, LayerNorm, plain do not",
        "interaction slope per doubling of B, fix − control",
        "no accuracy reported",
        decided_by="(study)",
    ),
    PaperClaim(
        "main table, MLP",
        "the corrected linear layer beats BatchNorm and LayerNorm",
        "accuracy difference, corrected − BN / − LN",
        "MLPs reach ~89 % on Fashion-MNIST",
        decided_by="(study)",
    ),
    PaperClaim(
        "main table, CNN",
        "PatchNorm beats conv+BN and conv+LN; both beat plain conv",
        "accuracy difference, PatchNorm − BN / − LN; BN / LN − plain",
        "small CNNs reach 91–93 % on Fashion-MNIST",
        decided_by="(study)",
    ),
)


def _finite(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(float(v))


def _num(v: Any) -> str:
    return f"{float(v):+.4f}" if _finite(v) else NONE


def point(label: str, est: Any, ci: Any, verdict: str) -> Point | None:
    """A figure point, or ``None`` without a finite estimate (an interval bound may be open)."""
    if not _finite(est):
        return None
    bounds: list[Any] = list(ci) if isinstance(ci, list | tuple) and len(ci) == 2 else [None, None]
    lo, hi = (float(b) if _finite(b) else None for b in bounds)
    return Point(label, float(est), lo, hi, verdict)


def interval_text(est: Any, ci: Any) -> str:
    if not _finite(est):
        return NONE
    if isinstance(ci, list | tuple) and len(ci) == 2 and all(_finite(c) for c in ci):
        return f"{_num(est)} [{_num(ci[0])}, {_num(ci[1])}]"
    return _num(est)


def _shown_verdict(h: Mapping[str, Any], entry: Mapping[str, Any]) -> str:
    """The verdict as the page shows it: an ``equivalent`` contrast as ``equivalent``."""
    if entry.get("verdict") == "equivalent":
        return "equivalent"
    return str(h.get("verdict") or NONE)


def shown_verdict(verdict: Mapping[str, Any], name: str) -> Any:
    """Hypothesis ``name``'s verdict as every listing shows it (this page, the results tables,
    ``report``): ``equivalent`` for a contrast decided inside its margin, whose hypothesis reads
    ``inconclusive``; else the hypothesis's own verdict."""
    if _entry(verdict, name).get("verdict") == "equivalent":
        return "equivalent"
    return ((verdict.get("hypotheses") or {}).get(name) or {}).get("verdict")


def _entry(verdict: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    for section in ("contrasts", "claims"):
        block = verdict.get(section)
        if isinstance(block, Mapping) and isinstance(block.get(name), Mapping):
            return block[name]
    return {}


def _adequacy(verdict: Mapping[str, Any]) -> str:
    adequacy = verdict.get("adequacy")
    if isinstance(adequacy, Mapping) and adequacy:
        entries = [e for e in adequacy.values() if isinstance(e, Mapping)]
        passed = sum(1 for e in entries if e.get("passed"))
        reached = [float(e["reached"]) for e in entries if _finite(e.get("reached"))]
        span = f", reached {min(reached):.3f}–{max(reached):.3f}" if reached else ""
        return f"{passed}/{len(entries)} passed{span}"
    scope = verdict.get("scope") if isinstance(verdict.get("scope"), Mapping) else {}
    means = [float(v) for v in ((scope or {}).get("arms") or {}).values() if _finite(v)]
    span = f"arm means {min(means):.2f}–{max(means):.2f}; " if means else ""
    return f"{span}not measured"


def _seeds(verdict: Mapping[str, Any]) -> str:
    for value in (
        verdict.get("seeds_used"),
        ((verdict.get("scope") or {}) if isinstance(verdict.get("scope"), Mapping) else {}).get("seeds"),
    ):
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
    return NONE


#: How a study whose arms were never checked for having learned the task is marked (see the module).
SMALL_SCALE = "unchecked"
#: Between two studies' parts of one cell: a line break in the rendered table.
STUDY_BREAK = "<br>"


def small_scale(verdict: Mapping[str, Any]) -> bool:
    """Whether a study's arms were never checked for having learned the task (no ``adequacy``)."""
    adequacy = verdict.get("adequacy")
    return not (isinstance(adequacy, Mapping) and adequacy)


def _reading(claim: PaperClaim, verdicts: Sequence[str], *, checked: bool = True) -> str:
    if not verdicts:
        return "not run: no stored study tests it"
    if all(v == "supported" for v in verdicts):
        said = "the stored studies support it at their scope"
    elif any(v == "refuted" for v in verdicts) and not any(v == "supported" for v in verdicts):
        said = "not reproduced: refuted at the stored studies' scope"
    elif any(v == "budget-dependent" for v in verdicts):
        said = "holds under one budget and fails under the other"
    elif any(v == "equivalent" for v in verdicts) and not any(v == "supported" for v in verdicts):
        said = "not reproduced: the predicted differences are absent (equivalent within the margin) at the stored studies' scope"
    else:
        said = "open: the stored studies do not decide it"
    return said if checked else f"{said} (adequacy {SMALL_SCALE})"


def _distinct(values: Sequence[str]) -> list[str]:
    return sorted(set(values), key=list(values).index)


def claim_rows(studies: Sequence[Study], *, scope_text: Callable[[Any], str]) -> list[ClaimRow]:
    """One :class:`ClaimRow` per :data:`PAPER_CLAIMS` entry, from the stored studies' verdicts;
    ``scope_text`` writes a verdict's ``scope`` in a few words (the page's own)."""
    rows = []
    for claim in PAPER_CLAIMS:
        verdicts: list[str] = []
        estimates, points, seeds, adequacy, scopes = [], [], [], [], []
        small: list[str] = []  # the unchecked studies' verdicts, when a checked study tests it too
        testing = [(s, v) for s, v in studies if claim.tests(v)]
        checked = any(not small_scale(v) for _, v in testing)
        for study, verdict in testing:
            tested = claim.tests(verdict)
            marked = small_scale(verdict)
            mark = f" ({SMALL_SCALE})" if marked else ""
            prefix = f"`{study}`{mark}: " if len(testing) > 1 else ""
            said: list[str] = []  # this study's verdicts
            if claim.decided_by == "(study)":
                said.append(str(verdict.get("study_verdict") or NONE))
            elif claim.decided_by is not None:
                decided = (verdict.get("hypotheses") or {}).get(claim.decided_by) or {}
                said.append(_shown_verdict(decided, _entry(verdict, claim.decided_by)))
            own = _kind(verdict).claim_estimates(claim.label, study, verdict)
            if own is not None:  # the kind's own estimand (the batch-size kind's interactions)
                texts, pts = own
                estimates.append(prefix + " | ".join(texts))
                points += pts
                if claim.decided_by is None:  # each of its points' verdicts
                    said += [p.verdict for p in pts]
            else:
                texts = []
                for name, short in tested:
                    h = (verdict.get("hypotheses") or {}).get(name) or {}
                    entry = _entry(verdict, name)
                    shown = _shown_verdict(h, entry)
                    if claim.decided_by is None:
                        said.append(shown)
                    est = h.get("estimate", entry.get("estimate"))
                    ci = h.get("ci", entry.get("ci"))
                    texts.append(f"{short} {interval_text(est, ci)}")
                    found = point(f"{claim.label}: {short}", est, ci, shown)
                    if found is not None:
                        points.append(found)
                estimates.append(prefix + "; ".join(texts))
            (small if checked and marked else verdicts).extend(said)
            seeds.append(prefix + _seeds(verdict))
            adequacy.append(prefix + _adequacy(verdict))
            scopes.append(prefix + scope_text(verdict.get("scope")))
        listed = _distinct(verdicts) + [f"{v} ({SMALL_SCALE})" for v in _distinct(small)]
        if testing and not checked:
            listed = [f"{v} ({SMALL_SCALE})" for v in _distinct(verdicts)]
        rows.append(
            ClaimRow(
                claim=f"{claim.label} {claim.text} ({claim.unit})",
                verdict="; ".join(listed) if listed else "not run",
                estimate=STUDY_BREAK.join(estimates) or NONE,
                seeds=STUDY_BREAK.join(seeds) or NONE,
                adequacy=(STUDY_BREAK.join(adequacy) or NONE) + f" (paper: {claim.paper})",
                scope=STUDY_BREAK.join(scopes) or NONE,
                reading=_reading(claim, verdicts, checked=checked or not testing),
                points=tuple(points),
            )
        )
    return rows


CLAIM_COLUMNS = (
    "claim",
    "verdict",
    "estimate [95% CI]",
    "seeds",
    "adequacy (paper)",
    "scope",
    "in one sentence",
)


def claim_lines(rows: Sequence[ClaimRow]) -> list[str]:
    """The per-claim table as Markdown lines (seven columns)."""

    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    out = ["| " + " | ".join(CLAIM_COLUMNS) + " |", "|" + "---|" * len(CLAIM_COLUMNS)]
    for r in rows:
        cells = (r.claim, r.verdict, r.estimate, r.seeds, r.adequacy, r.scope, r.reading)
        out.append("| " + " | ".join(cell(c) for c in cells) + " |")
    return out


_COLOURS = {
    "supported": "tab:green",
    "better": "tab:green",
    "refuted": "tab:red",
    "worse": "tab:red",
    "equivalent": "tab:blue",
    "inconclusive": "tab:gray",
}


def plot_claims(
    rows: Sequence[ClaimRow], path: Path, *, min_effect: float = DEFAULT_MIN_EFFECT
) -> Path | None:
    """Every claim's effects with their intervals on one axis (a forest plot), the ± ``min_effect``
    band shaded, points coloured by verdict; ``None`` when no claim has an estimate. Deterministic:
    the same rows give the same bytes."""
    points = [(r, p) for r in rows for p in r.points]
    if not points:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.3 * len(points)))
    ax.axvspan(-min_effect, min_effect, color="0.9", zorder=0, label=f"±{min_effect:g} (negligible)")
    ax.axvline(0.0, color="black", lw=0.8)
    labels = []
    for y, (_, p) in enumerate(reversed(points)):
        colour = _COLOURS.get(p.verdict, "tab:orange")
        if p.low is not None and p.high is not None:
            ax.plot([p.low, p.high], [y, y], color=colour, lw=2)
        ax.plot([p.estimate], [y], "o", color=colour, ms=5)
        labels.append(p.label)
    ax.set_yticks(range(len(labels)), labels, fontsize=7)
    ax.set_xlabel(
        "effect in the claim's units\n(accuracy difference; DyT slope per block; slope per doubling of B)"
    )
    ax.set_title(
        "Each claim: estimate and 95% interval\n(green supported, red refuted, blue equivalent, grey open)"
    )
    ax.legend(loc="lower right", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)
    return path
