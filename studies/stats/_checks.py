"""What the statistics submodules share: the lazy SciPy import, the alternatives and the argument checks."""

from __future__ import annotations

from typing import Any, Literal


def _scipy_stats() -> Any:
    """``scipy.stats``, imported on first use: it costs ~0.4 s, and validating or planning a spec
    (which checks power with these functions only when a design is borderline) should not pay it."""
    from scipy import stats

    return stats


Alternative = Literal["less", "greater", "two-sided"]
_ALTERNATIVES = ("less", "greater", "two-sided")


def _check_alpha(alpha: float, name: str = "alpha") -> None:
    if isinstance(alpha, bool) or not (isinstance(alpha, int | float) and 0.0 < alpha < 1.0):
        raise ValueError(f"{name} must lie strictly between 0 and 1, got {alpha!r}")


def _check_alternative(alternative: str) -> None:
    if alternative not in _ALTERNATIVES:
        raise ValueError(f"alternative must be 'less', 'greater' or 'two-sided', got {alternative!r}")


def _check_confidence(confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
