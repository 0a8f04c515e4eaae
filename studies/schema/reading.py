"""YAML reading: safe loading with line numbers, duplicate-key and python-tag rejection, size limits."""

from __future__ import annotations

import re
from typing import Any

import yaml

from studies.schema.errors import SpecError, SpecIssue, _Path, _path_str

# --------------------------------------------------------------------------------------------------
# YAML: safe loading with line numbers, duplicate-key and python-tag rejection
# --------------------------------------------------------------------------------------------------


# Limits checked while composing, before anything walks the document (let alone an alias's expansion).
MAX_YAML_BYTES = 1024 * 1024
"""A spec (or one ``--set`` value) larger than this is refused unread."""
MAX_YAML_WRITTEN = 20_000
"""Nodes a document may spell out (PyYAML composes ~10,000 a second; a spec has a few hundred)."""
MAX_YAML_NODES = 100_000
"""Nodes a document may hold, counting every use of an alias as a full copy of what it names."""
MAX_YAML_DEPTH = 100
"""Nesting depth of mappings and lists (a spec needs about 6)."""
_MAX_NUMBER_CHARS = 100  # an integer literal longer than this is refused before int() sees it
_INT_TAG = "tag:yaml.org,2002:int"


class _LimitError(Exception):
    def __init__(self, message: str, line: int | None) -> None:
        super().__init__(message)
        self.line = line


class _SpecLoader(yaml.SafeLoader):
    """``SafeLoader`` that reads ``1e-3`` as a float and refuses oversized or over-deep documents.

    PyYAML implements YAML 1.1, where a float needs a dot: ``lr: 1e-3`` would silently be a string.
    Composition counts nodes and depth as it goes, so a 5,000-deep flow list stops at level
    :data:`MAX_YAML_DEPTH` instead of ending in a ``RecursionError``.
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._nodes = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        mark = self.peek_event().start_mark
        self._nodes += 1
        if self._nodes > MAX_YAML_WRITTEN:
            raise _LimitError(f"more than {MAX_YAML_WRITTEN} values; a spec has a few hundred", mark.line + 1)
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise _LimitError(
                    f"nested more than {MAX_YAML_DEPTH} levels deep; a spec needs a handful", mark.line + 1
                )
            node: yaml.Node | None = super().compose_node(parent, index)
            return node
        finally:
            self._depth -= 1


_SpecLoader.yaml_implicit_resolvers = {
    k: [r for r in v if r[0] != "tag:yaml.org,2002:float"]
    for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_SpecLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
        |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


def _expanded_size(root: yaml.Node) -> int:
    """Nodes of the document with every alias expanded, without expanding anything.

    Each node's size is computed once (aliases share node objects), so an alias bomb costs as much as
    its text. A node that contains itself (``&a [*a]``) raises :class:`_LimitError`.
    """
    sizes: dict[int, int] = {}
    open_: set[int] = set()
    # Iterative post-order walk over the (shared) node graph.
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if key in sizes:
            continue
        children: list[yaml.Node] = []
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                children += [k, v]
        elif isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        if done:
            open_.discard(key)
            sizes[key] = min(1 + sum(sizes[id(c)] for c in children), MAX_YAML_NODES + 1)
            continue
        if key in open_:
            raise _LimitError("an alias refers to the collection it is part of", node.start_mark.line + 1)
        open_.add(key)
        stack.append((node, True))
        for c in children:
            if id(c) in open_:
                raise _LimitError("an alias refers to the collection it is part of", c.start_mark.line + 1)
            if id(c) not in sizes:
                stack.append((c, False))
    return sizes[id(root)]


def _compose(text: str, source: str | None) -> tuple[_SpecLoader | None, yaml.Node | None]:
    """Compose one YAML document under the limits; every failure is a :class:`SpecError` with a line."""

    def fail(message: str, line: int | None) -> SpecError:
        return SpecError([SpecIssue("", message, line, source)])

    if len(text) > MAX_YAML_BYTES:
        raise fail(f"the spec is {len(text)} characters long; at most {MAX_YAML_BYTES} are read", None)
    try:
        loader = _SpecLoader(text)
    except yaml.reader.ReaderError as e:
        line = text.count("\n", 0, e.position) + 1
        char = f"U+{e.character:04X}" if isinstance(e.character, int) else repr(e.character)
        raise fail(
            f"malformed YAML: character {char} is not allowed in a spec (binary data?)", line
        ) from None
    try:
        node = loader.get_single_node()
        if node is not None:
            size = _expanded_size(node)
            if size > MAX_YAML_NODES:
                raise _LimitError(
                    f"with its aliases expanded the document holds more than {MAX_YAML_NODES} values "
                    "(an alias of a collection copies all of it each time it is used)",
                    node.start_mark.line + 1,
                )
    except _LimitError as e:
        loader.dispose()
        raise fail(f"refused YAML: {e}", e.line) from None
    except yaml.MarkedYAMLError as e:
        loader.dispose()
        mark = e.problem_mark or e.context_mark
        where = mark.line + 1 if mark is not None else None
        msg = " ".join(str(x) for x in (e.context, e.problem) if x)
        raise fail(f"malformed YAML: {msg}", where) from None
    except yaml.reader.ReaderError as e:
        loader.dispose()
        line = text.count("\n", 0, e.position) + 1
        raise fail(f"malformed YAML: {e.reason}", line) from None
    except (yaml.YAMLError, RecursionError, MemoryError, ValueError) as e:
        loader.dispose()
        raise fail(f"malformed YAML: {type(e).__name__}: {str(e)[:200]}", None) from None
    return loader, node


def _walk_nodes(
    node: yaml.Node,
    path: _Path,
    lines: dict[_Path, int],
    issues: list[SpecIssue],
    loader: yaml.constructor.BaseConstructor | None = None,
) -> None:
    """Record the line of every key/item and reject what the safe constructor would mis-handle.

    With ``loader``, every scalar that is not a plain string is constructed here (and cached in the
    loader), so a bad value (``2001-13-45``, ``!!binary ***``) is reported with its path and line.
    """
    tag = node.tag or ""

    def issue(message: str) -> None:
        issues.append(SpecIssue(_path_str(path), message, node.start_mark.line + 1))

    if tag.startswith("tag:yaml.org,2002:python/") or tag.startswith("!!python"):
        issue(f"tag {tag.replace('tag:yaml.org,2002:', '!!')!r} is not allowed (specs are plain data)")
        return
    if isinstance(node, yaml.ScalarNode):
        if tag == _INT_TAG and len(node.value) > _MAX_NUMBER_CHARS:
            issue(f"a {len(node.value)}-digit integer is not a setting (at most {_MAX_NUMBER_CHARS} digits)")
        elif loader is not None and tag not in ("tag:yaml.org,2002:str", "tag:yaml.org,2002:null"):
            try:
                loader.construct_object(node, deep=True)
            except yaml.MarkedYAMLError as e:
                issue(f"invalid YAML value: {e.problem}")
            except (ValueError, OverflowError, TypeError) as e:
                issue(f"invalid {tag.rsplit(':', 1)[-1]} value: {str(e)[:200]}")
        return
    if isinstance(node, yaml.MappingNode):
        seen: dict[Any, int] = {}
        for key_node, value_node in node.value:
            line = key_node.start_mark.line + 1
            if key_node.tag == "tag:yaml.org,2002:merge":
                _walk_nodes(value_node, path, lines, issues, loader)
                continue
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag != "tag:yaml.org,2002:str":
                shown = repr(key_node.value) if isinstance(key_node, yaml.ScalarNode) else "a collection"
                issues.append(
                    SpecIssue(
                        _path_str(path) or "<document>",
                        f"mapping keys must be plain strings, got {shown[:60]} (quote it)",
                        line,
                    )
                )
                continue
            key = key_node.value
            if key in seen:
                issues.append(
                    SpecIssue(
                        _path_str((*path, key)),
                        f"duplicate key {key!r} (first defined on line {seen[key]})",
                        line,
                    )
                )
                continue
            seen[key] = line
            lines[(*path, key)] = line
            _walk_nodes(value_node, (*path, key), lines, issues, loader)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            lines[(*path, i)] = item.start_mark.line + 1
            _walk_nodes(item, (*path, i), lines, issues, loader)


def _construct(loader: _SpecLoader, node: yaml.Node, source: str | None) -> Any:
    try:
        return loader.construct_document(node)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark is not None else None
        raise SpecError([SpecIssue("", f"invalid YAML value: {e.problem}", line, source)]) from None
    except (yaml.YAMLError, ValueError, TypeError, OverflowError, RecursionError) as e:
        line = node.start_mark.line + 1
        raise SpecError(
            [SpecIssue("", f"invalid YAML value: {type(e).__name__}: {str(e)[:200]}", line, source)]
        ) from None


def parse_yaml(text: str, *, source: str | None = None) -> tuple[dict[str, Any], dict[_Path, int]]:
    """Parse one YAML mapping document safely.

    Args:
        text: the YAML text.
        source: file name used in error messages.

    Returns:
        The document as plain data and a map ``path -> 1-based line`` for every key and list item.

    Raises:
        SpecError: malformed YAML, several documents, a non-mapping document, duplicate keys,
            non-string keys, ``!!python/...`` tags, control characters, or a document past the
            limits (:data:`MAX_YAML_BYTES`, :data:`MAX_YAML_NODES` with aliases expanded,
            :data:`MAX_YAML_DEPTH`).
    """
    loader, node = _compose(text, source)
    assert loader is not None
    try:
        if node is None:
            raise SpecError([SpecIssue("", "the spec is empty; expected a mapping of sections", 1, source)])
        if not isinstance(node, yaml.MappingNode):
            kind = "a list" if isinstance(node, yaml.SequenceNode) else "a single value"
            raise SpecError(
                [
                    SpecIssue(
                        "",
                        f"the spec must be a mapping of sections (name:, model:, ...), got {kind}",
                        node.start_mark.line + 1,
                        source,
                    )
                ]
            )
        lines: dict[_Path, int] = {}
        issues: list[SpecIssue] = []
        _walk_nodes(node, (), lines, issues, loader)
        if issues:
            raise SpecError([SpecIssue(i.path, i.message, i.line, source) for i in issues])
        data = _construct(loader, node, source)
    finally:
        loader.dispose()
    return data, lines


def _parse_value(text: str, source: str | None = None) -> Any:
    """Parse a ``--set`` value as YAML (``3`` → int, ``1e-3`` → float, ``[1, 2]`` → list), under the limits."""
    loader, node = _compose(text, source)
    assert loader is not None
    try:
        if node is None:
            return None
        issues: list[SpecIssue] = []
        _walk_nodes(node, (), {}, issues, loader)
        if issues:
            raise SpecError([SpecIssue(i.path, i.message, i.line, source) for i in issues])
        return _construct(loader, node, source)
    finally:
        loader.dispose()


def dump_yaml(data: Any) -> str:
    """Plain block-style YAML, key order kept (the resolved spec written next to the results)."""
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False, allow_unicode=True)
