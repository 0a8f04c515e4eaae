"""Loading: layering (file, preset, ``--set``), provenance of every value, pydantic errors turned into
:class:`SpecIssue` with field paths and YAML lines."""

from __future__ import annotations

import copy
import os
import types
import typing
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Union

from pydantic import (
    BaseModel,
    ValidationError,
)

from studies.schema.errors import _SCALAR, SpecError, SpecIssue, _Path, _path_str
from studies.schema.reading import MAX_YAML_BYTES, _parse_value, parse_yaml
from studies.schema.urls import (
    artifact_location_problem,
    endpoint_problem,
    storage_path_problem,
    tracking_uri_problem,
)
from workers.dotted import PathError, set_path, split_path

# --------------------------------------------------------------------------------------------------
# Loading: layering, provenance, pydantic errors → SpecIssues
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Origin:
    source: str | None
    line: int | None


def _deep_merge(base: Any, top: Any) -> Any:
    """Mappings merge key by key; anything else (lists included) is replaced."""
    if isinstance(base, dict) and isinstance(top, dict):
        out = dict(base)
        for k, v in top.items():
            out[k] = _deep_merge(base[k], v) if k in base else copy.deepcopy(v)
        return out
    return copy.deepcopy(top)


def _replaced_paths(top: Any, path: _Path = ()) -> Iterator[_Path]:
    """Paths whose whole subtree a merge of ``top`` replaces (non-mapping values)."""
    if isinstance(top, dict):
        for k, v in top.items():
            yield from _replaced_paths(v, (*path, k))
    else:
        yield path


def _lookup_origin(origins: Mapping[_Path, _Origin], path: _Path) -> _Origin | None:
    for n in range(len(path), -1, -1):
        if path[:n] in origins:
            return origins[path[:n]]
    return None


def _unwrap(tp: Any) -> list[Any]:
    """The concrete candidate types behind Annotated / Optional / Union."""
    origin = typing.get_origin(tp)
    if origin is Annotated:
        return _unwrap(typing.get_args(tp)[0])
    if origin is Union or origin is types.UnionType:
        out: list[Any] = []
        for a in typing.get_args(tp):
            out += _unwrap(a)
        return out
    if tp is type(None):
        return []
    return [tp]


def _model_at(root: type[BaseModel], path: Sequence[str | int], data: Any) -> type[BaseModel] | None:
    """The pydantic model class that validates the mapping at ``path`` of ``data`` (for hints)."""
    tp: Any = root
    cur = data
    for key in path:
        cands = _unwrap(tp)
        if isinstance(key, int):
            seqs = [c for c in cands if typing.get_origin(c) in (tuple, list)]
            if not seqs or not isinstance(cur, list) or key >= len(cur):
                return None
            tp, cur = typing.get_args(seqs[0])[0], cur[key]
            continue
        cls = _pick(cands, cur)
        if not (isinstance(cls, type) and issubclass(cls, BaseModel)) or key not in cls.model_fields:
            return None
        tp = cls.model_fields[key].annotation
        cur = cur.get(key) if isinstance(cur, dict) else None
    cls = _pick(_unwrap(tp), cur)
    return cls if isinstance(cls, type) and issubclass(cls, BaseModel) else None


def _pick(cands: list[Any], value: Any) -> Any:
    models = [c for c in cands if isinstance(c, type) and issubclass(c, BaseModel)]
    if not models:
        return cands[0] if len(cands) == 1 else None
    if len(models) == 1:
        return models[0]
    tag = value.get("type") if isinstance(value, dict) else None
    for m in models:
        field = m.model_fields.get("type")
        if field is not None and tag in typing.get_args(field.annotation):
            return m
    return None


def _tags_of(cls: type[BaseModel] | None) -> list[str]:
    return [] if cls is None else sorted(cls.model_fields)


_SHOW_INPUT = {
    "greater_than",
    "greater_than_equal",
    "less_than",
    "less_than_equal",
    "literal_error",
    "int_type",
    "int_parsing",
    "int_from_float",
    "float_type",
    "float_parsing",
    "bool_type",
    "string_type",
    "string_pattern_mismatch",
    "finite_number",
}


def _pydantic_issues(err: ValidationError, data: Any, root: type[BaseModel]) -> list[SpecIssue]:
    """Pydantic errors → issues with dotted paths (discriminator tags removed, hints added)."""
    issues: list[SpecIssue] = []
    for e in err.errors(include_url=False):
        path: list[str | int] = []
        cur = data
        for part in e["loc"]:
            if (isinstance(part, int) and isinstance(cur, list) and part < len(cur)) or (
                isinstance(part, str) and isinstance(cur, dict) and part in cur
            ):
                path.append(part)
                cur = cur[part]  # type: ignore[index]  # int for lists, str for dicts, checked above
            elif isinstance(cur, dict) and cur.get("type") == part:
                continue  # the discriminator tag pydantic inserts into the location
            elif isinstance(part, str) and ("[" in part or part in {"function-after", "function-before"}):
                continue
            else:
                path.append(part)
                cur = None
        kind = e["type"]
        msg = e["msg"]
        if kind == "extra_forbidden":
            parent = _model_at(root, path[:-1], data)
            owner = (
                f" for type {parent.model_fields['type'].default!r}"
                if parent and "type" in parent.model_fields
                else ""
            )
            valid = ", ".join(f for f in _tags_of(parent))
            msg = f"unknown field{owner}" + (f" (valid: {valid})" if valid else "")
        elif kind in ("union_tag_invalid", "union_tag_not_found"):
            ctx = e.get("ctx") or {}
            expected = ctx.get("expected_tags", "")
            if kind == "union_tag_invalid":
                msg = f"unknown type {ctx.get('tag')!r} (valid: {expected})"
            else:
                msg = f"missing 'type' (valid: {expected})" if expected else "missing 'type'"
                if not isinstance(cur, dict):
                    msg = f"expected a mapping with a 'type' field, got {type(cur).__name__}"
                    issues.append(SpecIssue(_path_str(path), msg))
                    continue
            path.append("type")
        elif kind == "missing":
            msg = "required field is missing"
        elif kind in _SHOW_INPUT and isinstance(e.get("input"), _SCALAR):
            shown = repr(e["input"])
            msg = f"{msg} (got {shown if len(shown) <= 120 else shown[:100] + '...'})"
        elif kind.startswith("value_error"):
            msg = msg.removeprefix("Value error, ")
        elif kind == "model_attributes_type" or kind == "model_type":
            msg = f"expected a mapping, got {type(cur).__name__}"
        issues.append(SpecIssue(_path_str(path), msg))
    return issues


_URL_FIELDS: tuple[tuple[tuple[str, ...], Any], ...] = (
    (("storage_path",), storage_path_problem),
    (("tracking", "uri"), tracking_uri_problem),
    (("tracking", "artifact_location"), artifact_location_problem),
    (("storage", "endpoint_override"), endpoint_problem),
)


def url_field_issues(document: Mapping[str, Any]) -> list[SpecIssue]:
    """Problems of the URL-like fields of any study document (``storage_path``, ``tracking.uri``,
    ``tracking.artifact_location``, ``storage.endpoint_override``); never echoes credentials."""
    issues: list[SpecIssue] = []
    for path, check in _URL_FIELDS:
        cur: Any = document
        for part in path:
            cur = cur.get(part) if isinstance(cur, Mapping) else None
        if isinstance(cur, str):
            problem = check(cur)
            if problem is not None:
                issues.append(SpecIssue(".".join(path), problem))
    return issues


def validate_spec(
    document: Mapping[str, Any],
    *,
    model: type[BaseModel],
    origins: Mapping[_Path, tuple[str | None, int | None]] | None = None,
) -> Any:
    """Validate a plain document against ``model``, turning every failure into one :class:`SpecError`.

    Args:
        document: the merged spec document.
        model: the spec class (a kind's :meth:`~studies.contract.StudyKind.spec_class`).
        origins: ``path -> (source, line)`` used to attach YAML lines to issues.
    """
    # Every study kind's URL-like fields go through the one validator, whatever its model declares.
    url_issues = url_field_issues(document)
    try:
        result = model.model_validate(document)
    except SpecError as e:
        issues = list(e.issues)
    except ValidationError as e:
        issues = _pydantic_issues(e, document, model)
    else:
        if not url_issues:
            return result
        issues = []
    seen = {i.path for i in issues}
    issues += [u for u in url_issues if u.path not in seen]
    origin_map = {k: _Origin(*v) for k, v in (origins or {}).items()}
    located = []
    for issue in issues:
        where = _lookup_origin(origin_map, split_path(issue.path) if issue.path else ())
        located.append(
            SpecIssue(
                issue.path,
                issue.message,
                issue.line if issue.line is not None else (where.line if where else None),
                issue.source or (where.source if where else None),
            )
        )
    raise SpecError(located)


def read_spec_text(path: str | os.PathLike[str]) -> str:
    """A spec file's text; unreadable, oversized or non-UTF-8 files are a :class:`SpecError` (with the line)."""
    source = str(path)
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_YAML_BYTES + 1)
    except OSError as e:
        raise SpecError([SpecIssue("", f"cannot read the spec: {e.strerror or e}", None, source)]) from None
    if len(raw) > MAX_YAML_BYTES:
        raise SpecError([SpecIssue("", f"the file is larger than {MAX_YAML_BYTES} bytes", None, source)])
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise SpecError(
            [
                SpecIssue(
                    "", f"cannot read the spec: not UTF-8 text (byte {e.start}; binary data?)", line, source
                )
            ]
        ) from None


def layer_document(
    path: str | os.PathLike[str],
    *,
    overrides: Sequence[str] = (),
    preset: str | None = None,
) -> tuple[dict[str, Any], dict[_Path, tuple[str | None, int | None]]]:
    """Read a spec file and apply a preset and ``--set`` overrides, tracking where each value came from.

    Returns:
        The merged document (``presets`` removed) and ``path -> (source, line)`` provenance.
    """
    source = str(path)
    text = read_spec_text(path)
    doc, lines = parse_yaml(text, source=source)
    origins: dict[_Path, tuple[str | None, int | None]] = {p: (source, ln) for p, ln in lines.items()}
    presets = doc.pop("presets", None) or {}
    if not isinstance(presets, dict) or not all(isinstance(v, dict) for v in presets.values()):
        raise SpecError(
            [SpecIssue("presets", "must map preset names to partial specs", lines.get(("presets",)), source)]
        )
    if preset is not None:
        if preset not in presets:
            valid = ", ".join(sorted(presets)) or "none defined"
            raise SpecError(
                [SpecIssue("presets", f"unknown preset {preset!r} (valid: {valid})", None, source)]
            )
        top = presets[preset]
        if "presets" in top:
            raise SpecError(
                [
                    SpecIssue(
                        f"presets.{preset}.presets",
                        "presets cannot nest",
                        lines.get(("presets", preset)),
                        source,
                    )
                ]
            )
        nested = {k: v for k, v in top.items() if "." not in k}
        dotted = {k: v for k, v in top.items() if "." in k}
        replaced = [*_replaced_paths(nested), *(split_path(k) for k in dotted)]
        for rp in replaced:
            for k in [k for k in origins if k[: len(rp)] == rp]:
                del origins[k]
        where = f"{source} (preset {preset})"
        for p, ln in lines.items():
            if p[:2] == ("presets", preset) and len(p) > 2:
                head = p[2]
                head_path = split_path(head) if isinstance(head, str) and "." in head else (head,)
                origins[(*head_path, *p[3:])] = (where, ln)
        doc = _deep_merge(doc, nested)
        for k, v in dotted.items():
            try:
                set_path(doc, split_path(k), copy.deepcopy(v))
            except PathError as e:
                raise SpecError([SpecIssue(k, str(e), lines.get(("presets", preset, k)), where)]) from None
    for ov in overrides:
        key, sep, raw = ov.partition("=")
        key = key.strip()
        if not sep or not key or any(not part for part in key.split(".")):
            raise SpecError(
                [SpecIssue(key, "an override must look like dotted.key=value", None, f"--set {ov}")]
            )
        try:
            value = _parse_value(raw, f"--set {ov}")
        except SpecError as e:
            raise SpecError(
                [
                    SpecIssue(
                        ".".join(filter(None, (key, i.path))),
                        f"cannot parse the value: {i.message}",
                        None,
                        i.source,
                    )
                    for i in e.issues
                ]
            ) from None
        kp = split_path(key)
        try:
            set_path(doc, kp, value)
        except PathError as e:
            raise SpecError([SpecIssue(key, str(e), None, f"--set {ov}")]) from None
        for k in [k for k in origins if k[: len(kp)] == kp]:
            del origins[k]
        origins[kp] = (f"--set {ov}", None)
    return doc, origins


def stored_defaults_missing(document: Mapping[str, Any], model: type[BaseModel]) -> dict[str, Any]:
    """What a stored spec document (a study's ``study_spec.yaml``, written by an earlier version)
    lacks of the fields added since whose default would change the study: ``model.stored_defaults``
    (dotted path -> the value a study stored without the field ran as), for each path whose section
    the document holds but whose field it does not (a section that is null or absent is left alone)."""
    missing: dict[str, Any] = {}
    for path, value in (getattr(model, "stored_defaults", None) or {}).items():
        *parents, leaf = path.split(".")
        node: Any = document
        for key in parents:
            node = node.get(key) if isinstance(node, Mapping) else None
        if isinstance(node, Mapping) and leaf not in node:
            missing[path] = value
    return missing


def load_spec(
    path: str | os.PathLike[str],
    overrides: Sequence[str] = (),
    preset: str | None = None,
    *,
    model: type[BaseModel],
    stored: bool = False,
) -> Any:
    """Load, layer and validate a study spec (:func:`studies.kinds.load_study` finds ``model`` from
    the file's ``kind:``).

    Args:
        path: the YAML file.
        overrides: ``dotted.key=value`` strings, applied last (values are YAML: ``3``, ``1e-3``,
            ``[1, 2]``, ``{type: layernorm}``, ``null``).
        preset: name of an entry of the file's top-level ``presets:`` mapping, merged over the file.
        model: the spec class to validate against.
        stored: the file is a study's stored spec: a field added since it was written (and not set
            by ``overrides``) takes the value the study ran with (:func:`stored_defaults_missing`),
            not today's default.

    Raises:
        SpecError: with every problem found, each with its field path and YAML line where known.
    """
    doc, origins = layer_document(path, overrides=overrides, preset=preset)
    if stored:
        for key, value in stored_defaults_missing(doc, model).items():
            set_path(doc, split_path(key), copy.deepcopy(value))
    return validate_spec(doc, model=model, origins=origins)
