"""Generate ``docs/spec-reference.md`` from the pydantic spec models.

    .venv/bin/python scripts/gen_spec_reference.py           # rewrite docs/spec-reference.md
    .venv/bin/python scripts/gen_spec_reference.py --check   # exit 1 if the committed file is stale
    .venv/bin/python scripts/gen_spec_reference.py --stdout  # print instead of writing

The reference walks ``model_fields`` of every registered kind's spec class (``studies.kinds.KINDS``), descending into nested
section models, optional sections, lists of models and discriminated unions (``type: ...``), and
writes one table per top-level section: field path, type, default, description. A description is
the field's ``description`` when it has one, else its attribute docstring, else the ``#`` comment
written on (or directly above) its line in the source. A field that exists only for some variants of
a union says so in the "only when" column. ``tests/test_docs.py`` fails when the committed file
differs from this script's output.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import io
import json
import re
import sys
import textwrap
import tokenize
import types
import typing
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "docs" / "spec-reference.md"


def _specs() -> tuple[tuple[str, str, str, str], ...]:
    """(module, class, heading, what it is) of every shipped kind's spec class (studies.kinds.KIND_MODULES;
    a kind installed from another package documents itself)."""
    from studies.kinds import KIND_MODULES

    out = []
    for kind in (importlib.import_module(module).KIND for module in KIND_MODULES):
        spec_class = kind.spec_class()
        out.append(
            (spec_class.__module__, spec_class.__name__, kind.title or f"{kind.name} studies", kind.summary)
        )
    return tuple(out)


def _alias_modules() -> tuple[str, ...]:
    """Modules whose ``Annotated[A | B | ..., Field(discriminator=...)]`` aliases give unions their
    names: the shared sections, then each kind's spec module."""
    return ("studies.schema", *dict.fromkeys(m for m, _, _, _ in _specs()))


_MAX_DEFAULT_CHARS = 60


# --------------------------------------------------------------------------------------------------
# Types
# --------------------------------------------------------------------------------------------------


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _strip(tp: Any) -> tuple[Any, list[Any]]:
    """``Annotated[X, m...]`` -> ``(X, [m...])`` (nested Annotated flattened)."""
    meta: list[Any] = []
    while typing.get_origin(tp) is Annotated:
        args = typing.get_args(tp)
        tp, meta = args[0], [*meta, *args[1:]]
    return tp, meta


def _union_args(tp: Any) -> list[Any] | None:
    if typing.get_origin(tp) in (Union, types.UnionType):
        return list(typing.get_args(tp))
    return None


def _models_in(tp: Any) -> tuple[list[type[BaseModel]], bool]:
    """The models of a (possibly optional) model or union of models, and whether ``None`` is allowed."""
    tp, _ = _strip(tp)
    args = _union_args(tp)
    if args is None:
        return ([tp], False) if _is_model(tp) else ([], False)
    models: list[type[BaseModel]] = []
    nullable = False
    for a in args:
        a, _ = _strip(a)
        if a is type(None):
            nullable = True
        elif _is_model(a):
            models.append(a)
        else:
            return [], nullable
    return models, nullable


def _list_item(tp: Any) -> Any | None:
    """The item type of ``tuple[X, ...]`` / ``list[X]`` (through Annotated / Optional)."""
    tp, _ = _strip(tp)
    args = _union_args(tp)
    if args is not None:
        items = [_list_item(a) for a in args if _strip(a)[0] is not type(None)]
        return items[0] if len(items) == 1 else None
    origin = typing.get_origin(tp)
    if origin is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return args[0]
        return None
    if origin is list:
        return typing.get_args(tp)[0]
    return None


def _tag(model: type[BaseModel]) -> str | None:
    info = model.model_fields.get("type")
    if info is None:
        return None
    tp, _ = _strip(info.annotation)
    if typing.get_origin(tp) is Literal and len(typing.get_args(tp)) == 1:
        return str(typing.get_args(tp)[0])
    return None


def _union_names() -> dict[frozenset[type], str]:
    names: dict[frozenset[type], str] = {}
    for mod_name in _alias_modules():
        mod = importlib.import_module(mod_name)
        for name, value in sorted(vars(mod).items()):
            if name.startswith("_") or typing.get_origin(value) is not Annotated:
                continue
            models, _ = _models_in(value)
            if len(models) > 1:
                names.setdefault(frozenset(models), name)
    return names


def _number(v: Any) -> str:
    return json.dumps(v) if isinstance(v, bool) else repr(v)


def _bound(v: Any) -> str:
    return f"{v:.6g}" if isinstance(v, float) else _number(v)


def _constraints(meta: Sequence[Any]) -> list[str]:
    out: list[str] = []
    for m in meta:
        if isinstance(m, FieldInfo):
            out += _constraints(m.metadata)
            continue
        if isinstance(m, annotated_types.Ge):
            out.append(f"≥ {_bound(m.ge)}")
        elif isinstance(m, annotated_types.Gt):
            out.append(f"> {_bound(m.gt)}")
        elif isinstance(m, annotated_types.Le):
            out.append(f"≤ {_bound(m.le)}")
        elif isinstance(m, annotated_types.Lt):
            out.append(f"< {_bound(m.lt)}")
        elif isinstance(m, annotated_types.MinLen) and m.min_length:
            out.append(f"at least {m.min_length}")
        elif isinstance(m, annotated_types.MaxLen):
            out.append(f"at most {m.max_length}")
        elif getattr(m, "pattern", None):
            out.append(f"pattern `{m.pattern}`")
    return out


def _with(base: str, cons: list[str]) -> str:
    return f"{base} ({', '.join(cons)})" if cons else base


_SIMPLE = {int: "int", float: "float", str: "string", bool: "bool", type(None): "null", Any: "scalar"}


def type_str(tp: Any, meta: Sequence[Any] = (), names: dict[frozenset[type], str] | None = None) -> str:
    """A readable type: ``int (≥ 1)``, ``"a" | "b"``, ``list of int``, ``NormSpec: one of ...``."""
    names = names or {}
    tp, inner = _strip(tp)
    meta = [*meta, *inner]
    models, nullable = _models_in(tp)
    if len(models) > 1:
        name = names.get(frozenset(models))
        base = f"{name} (variant by `type`)" if name else "section (variant by `type`)"
        return base + (" | null" if nullable else "")
    if len(models) == 1:
        return "section" + (" | null" if nullable else "")
    args = _union_args(tp)
    if args is not None:
        return " | ".join(type_str(a, (), names) for a in args)
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(f'"{a}"' if isinstance(a, str) else _number(a) for a in typing.get_args(tp))
    item = _list_item(tp)
    if item is not None:
        return _with(f"list of {type_str(item, (), names)}", _constraints(meta))
    if origin is dict:
        key, value = typing.get_args(tp)
        return f"mapping {type_str(key, (), names)} → {type_str(value, (), names)}"
    return _with(_SIMPLE.get(tp, getattr(tp, "__name__", str(tp))), _constraints(meta))


# --------------------------------------------------------------------------------------------------
# Defaults and descriptions
# --------------------------------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return value


def default_str(info: FieldInfo) -> str:
    if info.default is PydanticUndefined and info.default_factory is None:
        return "**required**"
    value = info.default if info.default_factory is None else info.default_factory()  # type: ignore[call-arg]
    if isinstance(value, BaseModel):
        tag = _tag(type(value))
        if tag is not None:
            return f"`{{type: {tag}}}`"
        return "see below"
    value = _plain(value)
    if value is None:
        return "`null`"
    if isinstance(value, str):
        text = value if len(value) <= _MAX_DEFAULT_CHARS else value[: _MAX_DEFAULT_CHARS - 1] + "…"
        return f'`"{text}"`'
    if isinstance(value, bool | int | float):
        return f"`{_number(value)}`"
    text = json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
    if len(text) > _MAX_DEFAULT_CHARS:
        text = text[: _MAX_DEFAULT_CHARS - 1] + "…"
    return f"`{text}`"


_COMMENTS: dict[type, dict[str, str]] = {}
_TOOL_COMMENT = re.compile(r"^(type:|noqa|pragma|fmt:)")


def _source_notes(cls: type) -> dict[str, str]:
    """Field name -> attribute docstring, trailing comment or comment block directly above."""
    if cls in _COMMENTS:
        return _COMMENTS[cls]
    notes: dict[str, str] = {}
    try:
        lines, _ = inspect.getsourcelines(cls)
    except (OSError, TypeError):
        _COMMENTS[cls] = notes
        return notes
    source = textwrap.dedent("".join(lines))
    comments: dict[int, tuple[str, bool]] = {}  # line -> (text, alone on its line)
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            alone = not tok.line[: tok.start[1]].strip()
            comments[tok.start[0]] = (tok.string.lstrip("#").strip(), alone)
    body = ast.parse(source).body[0]
    assert isinstance(body, ast.ClassDef)  # getsourcelines of a class starts at its def
    stmts = body.body
    for i, stmt in enumerate(stmts):
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        name = stmt.target.id
        nxt = stmts[i + 1] if i + 1 < len(stmts) else None
        if (
            isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            notes[name] = " ".join(nxt.value.value.split())
            continue
        end = stmt.end_lineno or stmt.lineno
        trailing = [
            comments[n][0]
            for n in range(stmt.lineno, end + 1)
            if n in comments and not _TOOL_COMMENT.match(comments[n][0])
        ]
        if trailing:
            notes[name] = " ".join(trailing)
            continue
        above: list[str] = []
        n = stmt.lineno - 1
        while n in comments and comments[n][1]:
            above.insert(0, comments[n][0])
            n -= 1
        if above:
            notes[name] = " ".join(above)
    _COMMENTS[cls] = notes
    return notes


def description(cls: type[BaseModel], name: str, info: FieldInfo) -> str:
    if info.description:
        return " ".join(info.description.split())
    for klass in cls.__mro__:
        if not (isinstance(klass, type) and issubclass(klass, BaseModel)):
            continue
        if name in inspect.get_annotations(klass):
            note = _source_notes(klass).get(name)
            if note:
                return note
    return ""


def docstring(cls: type) -> str:
    """The first paragraph of a class docstring, on one line."""
    doc = cls.__dict__.get("__doc__")
    if not doc:
        return ""
    return _clean(" ".join(inspect.cleandoc(doc).split("\n\n")[0].split()))


# --------------------------------------------------------------------------------------------------
# Walking the models
# --------------------------------------------------------------------------------------------------

Condition = tuple[tuple[str, str], ...]  # ((union path, tag), ...)


@dataclass
class Row:
    path: str
    type: str
    default: str
    description: str
    conditions: list[Condition] = field(default_factory=list)


def walk(
    cls: type[BaseModel],
    prefix: str,
    names: dict[frozenset[type], str],
    unions: dict[str, list[str]],
    condition: Condition = (),
) -> Iterator[Row]:
    """Rows for every field of ``cls`` below ``prefix``, depth first, in declaration order.

    ``unions`` collects ``union path -> variant tags`` for every discriminated union met on the way.
    """
    for name, info in cls.model_fields.items():
        path = f"{prefix}.{name}" if prefix else name
        tp = info.annotation
        desc = description(cls, name, info)
        if name == "type" and condition and condition[-1][0] == prefix:
            continue  # a variant's tag: the union's own row lists them all
        yield Row(path, type_str(tp, info.metadata, names), default_str(info), desc, [condition])
        yield from _walk_type(tp, path, names, unions, condition)


def _walk_type(
    tp: Any, path: str, names: dict[frozenset[type], str], unions: dict[str, list[str]], condition: Condition
) -> Iterator[Row]:
    item = _list_item(tp)
    if item is not None:
        models, _ = _models_in(item)
        path = f"{path}.<i>"
        if not models:
            return
    else:
        models, _ = _models_in(tp)
    if len(models) == 1:
        yield from walk(models[0], path, names, unions, condition)
    elif len(models) > 1:
        tags = [_tag(m) or m.__name__ for m in models]
        yield Row(
            f"{path}.type",
            " | ".join(f'"{t}"' for t in tags),
            "—",
            "required in the mapping: picks the variant; rows marked *only when* belong to the variants named",
            [condition],
        )
        for model in models:
            tag = _tag(model) or model.__name__
            tags = unions.setdefault(path, [])
            if tag not in tags:
                tags.append(tag)
            yield from walk(model, path, names, unions, (*condition, (path, tag)))


def merge(rows: Sequence[Row]) -> list[Row]:
    """One row per (path, type, default, description); the variants it holds for are collected."""
    out: dict[tuple[str, str, str, str], Row] = {}
    for r in rows:
        key = (r.path, r.type, r.default, r.description)
        if key in out:
            out[key].conditions += [c for c in r.conditions if c not in out[key].conditions]
        else:
            out[key] = Row(r.path, r.type, r.default, r.description, list(r.conditions))
    return list(out.values())


def condition_str(row: Row, all_tags: dict[str, list[str]]) -> str:
    """``model.type: vit_lite, tabular; model.norm.type: autonorm``, leaving out unions fully covered."""
    if any(not c for c in row.conditions):
        return ""
    by_union: dict[str, list[str]] = {}
    for cond in row.conditions:
        for union_path, tag in cond:
            tags = by_union.setdefault(union_path, [])
            if tag not in tags:
                tags.append(tag)
    parts = []
    for union_path, tags in by_union.items():
        if sorted(tags) == sorted(all_tags.get(union_path, [])):
            continue
        ordered = [t for t in all_tags.get(union_path, tags) if t in tags]
        parts.append(f"`{union_path}.type`: {', '.join(ordered)}")
    return "; ".join(parts)


# --------------------------------------------------------------------------------------------------
# Rendering
# --------------------------------------------------------------------------------------------------


# Docstrings and comments in the code may point at internal notes by file name; the published
# reference points at the docs that replace them.
_INTERNAL_NOTES = re.compile(r"\b(?:PROTOCOL|DESIGN)\.md(?: ?§ ?\d+)?")


def _docs_for(match: re.Match[str]) -> str:
    return "docs/science.md" if match.group(0).startswith("P") else "docs/architecture.md"


def _clean(text: str) -> str:
    text = re.sub(r":(?:class|func|meth|mod|data|attr):`~?([^`]+)`", r"`\1`", text)  # reST roles
    text = re.sub(r"``([^`]+)``", r"`\1`", text)  # reST literals -> Markdown
    return _INTERNAL_NOTES.sub(_docs_for, text)


def _cell(text: str) -> str:
    text = _clean(text)
    return text.replace("|", "\\|").replace("\n", " ")


def _anchor(text: str) -> str:
    return re.sub(r"[^a-z0-9 -]", "", text.lower()).replace(" ", "-")


def _section_table(rows: list[Row], all_tags: dict[str, list[str]]) -> list[str]:
    conditional = any(condition_str(r, all_tags) for r in rows)
    head = ["field", "type", "default"] + (["only when"] if conditional else []) + ["description"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [f"`{r.path}`", _cell(r.type), _cell(r.default)]
        if conditional:
            cells.append(_cell(condition_str(r, all_tags)))
        cells.append(_cell(r.description))
        out.append("| " + " | ".join(cells) + " |")
    return out


@dataclass
class KindRows:
    """One kind's spec class walked: its rows per top-level field, its unions, what it sets itself."""

    module: str
    class_name: str
    heading: str
    about: str
    cls: type[BaseModel]
    sections: dict[str, tuple[FieldInfo, list[Row]]]  # top-level field -> (its info, its rows)
    unions: dict[str, list[str]]
    set_by_study: dict[str, str]


def _kind_rows(module: str, class_name: str, heading: str, about: str) -> KindRows:
    cls = getattr(importlib.import_module(module), class_name)
    unions: dict[str, list[str]] = {}
    # Fields the kind sets itself are refused when given: not something a user can set, so not listed.
    set_by_study = dict(getattr(importlib.import_module(module), "SET_BY_STUDY", {}))
    rows_all = [r for r in walk(cls, "", _union_names(), unions) if r.path not in set_by_study]
    sections = {
        name: (info, merge([r for r in rows_all if r.path == name or r.path.startswith(name + ".")]))
        for name, info in cls.model_fields.items()
    }
    return KindRows(module, class_name, heading, about, cls, sections, unions, set_by_study)


def _key(r: Row) -> tuple[str, str, str, str]:
    return (r.path, r.type, r.default, r.description)


def _section_intro(info: FieldInfo) -> list[str]:
    models, _ = _models_in(info.annotation)
    item = _list_item(info.annotation)
    if item is not None:
        models, _ = _models_in(item)
    if len(models) == 1 and docstring(models[0]):
        return [docstring(models[0]), ""]
    if len(models) > 1:
        variants = ", ".join(f"`{_tag(m)}`" + (f" ({docstring(m)})" if docstring(m) else "") for m in models)
        return [f"Variants, chosen by `type`: {variants}.", ""]
    return []


def _tags_below(unions: dict[str, list[str]], name: str) -> dict[str, list[str]]:
    return {p: t for p, t in unions.items() if p == name or p.startswith(name + ".")}


def render_kind(
    kind: KindRows, shared: set[tuple[str, str, str, str]], shared_sections: set[str]
) -> list[str]:
    """A kind's own fields first (top-level, then its own sections), then where it departs from the
    shared sections (other defaults; fields it sets itself)."""
    out = [f"## {kind.heading}: `{kind.module}.{kind.class_name}`", "", kind.about]
    doc = docstring(kind.cls)
    if doc:
        out += ["", doc]
    top = [
        r
        for name, (_, rows) in kind.sections.items()
        if len(rows) == 1
        for r in rows
        if _key(r) not in shared
    ]
    if top:
        out += ["", "### Top-level fields", ""]
        out += _section_table(top, {})
    own = [n for n, (_, rows) in kind.sections.items() if len(rows) > 1 and n not in shared_sections]
    for name in own:
        info, rows = kind.sections[name]
        out += ["", f"### `{name}`", "", *_section_intro(info)]
        out += _section_table(rows, _tags_below(kind.unions, name))
    for name in (n for n in kind.sections if n in shared_sections):
        _, rows = kind.sections[name]
        differ = [r for r in rows if _key(r) not in shared]
        refused = {p: why for p, why in kind.set_by_study.items() if p.split(".")[0] == name}
        if not differ and not refused:
            continue
        out += ["", f"### `{name}` in this kind", ""]
        out += [f"As the shared [`{name}`](#{_anchor(name)}) section, except:", ""]
        if differ:
            out += _section_table(differ, _tags_below(kind.unions, name))
        if refused:
            out += ["", "Set by the study itself, so refused when given:", ""]
            out += [f"- `{p}`: {_clean(why)}" for p, why in refused.items()]
    return out


def render_shared(
    kinds: Sequence[KindRows],
    shared: set[tuple[str, str, str, str]],
    top_names: Sequence[str],
    section_names: Sequence[str],
) -> list[str]:
    out = [
        "## Shared sections",
        "",
        "The sections every kind composes, listed once; a kind's own defaults and the fields it sets itself",
        "are under its heading above.",
    ]
    top: list[Row] = []
    for name in top_names:
        for kind in kinds:
            if name in kind.sections and len(kind.sections[name][1]) == 1:
                top += [
                    r
                    for r in kind.sections[name][1]
                    if _key(r) in shared and _key(r) not in {_key(t) for t in top}
                ]
                break
    if top:
        out += ["", "### Shared top-level fields", ""]
        out += _section_table(top, {})
    for name in section_names:
        having = [k for k in kinds if name in k.sections and len(k.sections[name][1]) > 1]
        info, _ = having[0].sections[name]
        # the shared rows of every kind with the section (two kinds may share rows a third lacks)
        rows: list[Row] = []
        unions: dict[str, list[str]] = {}
        for kind in having:
            rows += [
                r
                for r in kind.sections[name][1]
                if _key(r) in shared and _key(r) not in {_key(t) for t in rows}
            ]
            unions = {**_tags_below(kind.unions, name), **unions}
        out += ["", f"### `{name}`", "", *_section_intro(info)]
        out += _section_table(rows, unions)
    return out


def render() -> str:
    """The whole of ``docs/spec-reference.md``."""
    kinds = [_kind_rows(*spec) for spec in _specs()]
    # A row is shared when more than one kind has it and every kind that has its path has this very
    # row (type, default, text) among its rows for that path (union variants give a path several rows).
    keys = [{_key(r) for _, rows in k.sections.values() for r in rows} for k in kinds]
    paths = [{key[0] for key in ks} for ks in keys]
    shared = {
        key
        for key in set().union(*keys)
        if sum(key in ks for ks in keys) > 1 and all(key in ks for ks, ps in zip(keys, paths) if key[0] in ps)
    }
    shared_sections = [
        name
        for name in dict.fromkeys(n for k in kinds for n in k.sections)
        if sum(name in k.sections and len(k.sections[name][1]) > 1 for k in kinds) > 1
    ]
    out = [
        "# Spec reference",
        "",
        "<!-- GENERATED by scripts/gen_spec_reference.py from the pydantic spec models; do not edit. -->",
        "<!-- Regenerate: .venv/bin/python scripts/gen_spec_reference.py -->",
        "",
        "Every study is a YAML file validated once by pydantic; unknown keys are errors, and every",
        "error names its field path and YAML line (`autonorm-study validate SPEC`). Values are layered:",
        "model defaults → the YAML file → a named preset from the file's `presets:` mapping",
        "(`--preset NAME`) → `--set dotted.path=value` overrides, whose values are parsed as YAML.",
        "",
        "How to read the tables: a path such as `model.norm.tau` is also what `--set` and a search",
        "parameter's `name` use; `<i>` stands for a list index (`search.space.0.low`). A field whose",
        "type says *variant by `type`* is a discriminated union: its `type` key picks the variant,",
        "and rows with an *only when* entry exist for those variants only. *section* is a",
        "nested mapping whose own fields follow; `null` means the field may be left empty.",
        "Each kind lists its own fields first; the sections kinds share (model, data, training, ...)",
        "follow once, under [Shared sections](#shared-sections). Only what a user can set is listed.",
        "",
        "Contents: "
        + ", ".join(f"[{k.heading}](#{_anchor(f'{k.heading} {k.module}{k.class_name}')})" for k in kinds)
        + ", [Shared sections](#shared-sections).",
    ]
    for kind in kinds:
        out += ["", *render_kind(kind, shared, set(shared_sections))]
    shared_top = [n for n in dict.fromkeys(n for k in kinds for n in k.sections) if n not in shared_sections]
    out += ["", *render_shared(kinds, shared, shared_top, shared_sections)]
    return "\n".join(out) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="exit 1 when the committed file is stale")
    mode.add_argument("--stdout", action="store_true", help="print the reference instead of writing it")
    args = parser.parse_args(argv)
    text = render()
    if args.stdout:
        sys.stdout.write(text)
        return 0
    if args.check:
        current = OUTPUT.read_text(encoding="utf-8") if OUTPUT.exists() else ""
        if current != text:
            print(f"{OUTPUT.relative_to(ROOT)} is stale: run scripts/gen_spec_reference.py", file=sys.stderr)
            return 1
        return 0
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUTPUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    raise SystemExit(main())
