"""A kind's spec rewritten for another run of the same study: more confirmatory seeds (``with_seeds``,
``plan --pilot`` and the decidability check) and the spec of ``extend`` (``extended_spec``)."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = [
    "extended_spec",
    "with_seeds",
]


def _section(doc: dict[str, Any], section: str | None) -> dict[str, Any]:
    if section is None:
        return doc
    inner: dict[str, Any] = doc.setdefault(section, {})
    return inner


def with_seeds(spec: Any, k: int, *, taken: Iterable[int], start: int = 0, section: str | None = None) -> Any:
    """``spec`` with ``k`` confirmatory seeds (``seeds``, or ``<section>.seeds``): the first integers
    from ``start`` not in ``taken``. The document re-validated is what was set (``exclude_unset``): a
    full dump would also carry fields the spec derives itself, which it refuses as input."""
    doc = spec.model_dump(mode="json", exclude_unset=True)
    off = set(taken)
    _section(doc, section)["seeds"] = list(
        itertools.islice((s for s in itertools.count(start) if s not in off), k)
    )
    return type(spec).model_validate(doc)


def extended_spec(
    spec: Any,
    seeds: int,
    verdict: Mapping[str, Any],
    *,
    confirmatory: Sequence[int],
    taken: Iterable[int],
    section: str | None = None,
) -> Any:
    """The spec of ``extend``: the ``confirmatory`` seeds used so far, then ``seeds`` new ones (the
    next integers above those and every seed in ``taken``: the other phases' seeds), the looks made
    so far kept as looks (``spec.sequential``)."""
    from studies.sequential import ExtendRefused

    assert spec.sequential is not None
    used = int(verdict.get("seeds_used") or 0)
    done = [int(look["n_seeds"]) for look in verdict.get("looks") or []]
    if not used or not done:
        raise ExtendRefused("the study's verdict.json records no looks: resume it first, then extend")
    top = max([*confirmatory[:used], *taken]) + 1
    doc = spec.to_document()
    _section(doc, section)["seeds"] = [*confirmatory[:used], *range(top, top + seeds)]
    doc["sequential"] = spec.sequential.extended(done, seeds).model_dump(mode="json")
    return type(spec).model_validate(doc)
