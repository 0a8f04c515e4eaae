"""Dotted paths into nested configs: the one implementation used by spec validation and by trials.

A path is ``"model.norm.tau"``; a component that is a whole number indexes a list
(``"model.hidden.0"``). Validation (``studies``) and the trial (``workers.trainable``) both go through
:func:`set_path`, so a path that validates is a path a trial can apply. Ray-free and torch-free.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["ROOT", "PathError", "format_path", "get_path", "set_path", "split_path", "with_values"]

Part = str | int

ROOT = "@"
"""A parameter named ``@`` holds a partial config merged at the root, leaf by leaf: a grid axis whose
points set several coupled values at once (an arm and the learning rate tuned for it)."""


class PathError(KeyError):
    """A dotted path that does not fit the document (a value where a section is needed, a bad index)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


def split_path(dotted: str | Sequence[Part]) -> tuple[Part, ...]:
    """``"a.b.0"`` -> ``("a", "b", 0)``; a tuple is returned unchanged."""
    if not isinstance(dotted, str):
        return tuple(dotted)
    return tuple(int(p) if p.lstrip("-").isdigit() else p for p in dotted.split("."))


def format_path(path: Sequence[Part]) -> str:
    """``("a", "b", 0)`` -> ``"a.b.0"`` (``"<root>"`` for the empty path)."""
    return ".".join(str(p) for p in path) or "<root>"


def _index(part: Part, seq: list[Any], path: Sequence[Part]) -> int:
    try:
        idx = int(part)
    except ValueError:
        raise PathError(f"{format_path(path)}: {format_path(path[:-1])} is a list; use an index") from None
    if not -len(seq) <= idx < len(seq):
        raise PathError(f"{format_path(path)}: index {idx} out of range (the list has {len(seq)} items)")
    return idx


def get_path(doc: Any, dotted: str | Sequence[Part], default: Any = None) -> Any:
    """The value at ``dotted``, or ``default`` when any component is missing.

    A flat key equal to the whole dotted string (how Tune stores a sampled parameter) wins.
    """
    if isinstance(dotted, str) and isinstance(doc, Mapping) and dotted in doc:
        return doc[dotted]
    cur = doc
    for part in split_path(dotted):
        if isinstance(cur, list) and isinstance(part, int) and -len(cur) <= part < len(cur):
            cur = cur[part]
        elif isinstance(cur, Mapping) and str(part) in cur:
            cur = cur[str(part)]
        else:
            return default
    return cur


def set_path(doc: dict[str, Any], dotted: str | Sequence[Part], value: Any) -> None:
    """Write ``value`` at ``dotted`` in place, creating missing mappings (never lists).

    Raises:
        PathError: a component is a single value where a section is needed, or a bad list index.
    """
    path = split_path(dotted)
    cur: Any = doc
    for i, part in enumerate(path[:-1]):
        if isinstance(cur, list):
            cur = cur[_index(part, cur, path[: i + 1])]
            continue
        if not isinstance(cur, dict):
            raise PathError(f"cannot set {format_path(path)}: {format_path(path[:i])} is a single value")
        key = str(part)
        if cur.get(key) is None:
            cur[key] = {}
        cur = cur[key]
    last = path[-1]
    if isinstance(cur, list):
        cur[_index(last, cur, path)] = value
    elif isinstance(cur, dict):
        cur[str(last)] = value
    else:
        raise PathError(f"cannot set {format_path(path)}: {format_path(path[:-1])} is a single value")


def _leaves(params: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    items: list[tuple[str, Any]] = []
    for key, value in params.items():
        if key == ROOT and not prefix and isinstance(value, Mapping):
            items.extend(_leaves(value))
            continue
        path = f"{prefix}{key}"
        if isinstance(value, Mapping):
            items.extend(_leaves(value, prefix=f"{path}."))
        else:
            items.append((path, value))
    return items


def with_values(base: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of ``base`` with every dotted-path parameter applied.

    Nested mappings in ``params`` (Tune's unflattening of ``a/b`` keys, or a grid axis whose values
    are ``{batch_size, lr}`` pairs) are applied leaf by leaf.
    """
    out = copy.deepcopy(dict(base))
    for path, value in _leaves(params):
        set_path(out, path, value)
    return out
