"""The batch-size kind on the results page (:mod:`studies.claims_page`): the estimate cells and
figure points of the paper's batch-size claim, per budget run each fix arm's interaction with its
interval (:meth:`studies.kinds.batchsize.kind.BatchSizeKind.claim_estimates`). Light: no pandas."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["claim_estimates"]


def claim_estimates(verdict: Mapping[str, Any]) -> tuple[list[str], list[Any]]:
    """Per budget run (``verdict["budgets"]``, or the one budget): ``<budget> (<reading>): <arm>
    <interaction> [<ci>]; ...`` and one :class:`studies.claims_page.Point` per fix arm."""
    from studies.claims_page import NONE, interval_text, point

    texts, points = [], []
    budgets = verdict.get("budgets")
    results = budgets if isinstance(budgets, Mapping) and budgets else {"": verdict}
    for budget, result in results.items():
        arms = result.get("arms") if isinstance(result, Mapping) else None
        parts = []
        for arm in (result.get("fix_arms") if isinstance(result, Mapping) else None) or []:
            r = (arms or {}).get(arm) or {}
            est, ci = r.get("interaction"), r.get("interaction_ci")
            parts.append(f"{arm} {interval_text(est, ci)}")
            found = point(
                f"batch size, {budget + ': ' if budget else ''}{arm}", est, ci, str(r.get("verdict") or NONE)
            )
            if found is not None:
                points.append(found)
        reading = (verdict.get("claim_by_budget") or {}).get(budget)
        head = f"{budget}" + (f" ({reading})" if reading else "")
        texts.append(f"{head}: " + "; ".join(parts) if head else "; ".join(parts))
    return texts, points
