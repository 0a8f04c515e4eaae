"""Study specs: the YAML a researcher writes, validated once at the boundary into a frozen pydantic model.

Layering, lowest to highest: pydantic defaults → the YAML file → a named preset from the file's
top-level ``presets:`` mapping → ``--set dotted.key=value`` overrides (values parsed as YAML). The result
is a frozen :class:`StudySpec`; :meth:`StudySpec.to_plan` turns it into the plain-Python
:class:`workers.plan.StudyPlan` that ``workers.run_study`` executes.

Every problem is collected into a :class:`SpecError` that carries ``(field path, message, line)``
triples, so the CLI can print all of them at once and exit 2 without a traceback. Paths use dots for
mapping keys *and* list indices (``search.space.2.high``), the same syntax ``--set`` accepts.

Section models (``ModelSpec``, ``DataSpec``, ``TrainingSpec``, ``SearchSpec``, ``ResourcesSpec``,
``TrackingSpec``, ``StorageSpec``) are public with stable names so other study specs can compose
them; :func:`build_plan` builds a ``StudyPlan`` from sections without a ``StudySpec``.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import re
import subprocess
import types
import typing
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from studies.confirm_spec import ConfirmSpec
from studies.spec_urls import (
    ArtifactLocation,
    EndpointURL,
    StoragePath,
    TrackingURI,
    artifact_location_problem,
    endpoint_problem,
    redact_text,
    storage_path_problem,
    tracking_uri_problem,
)
from workers.dotted import PathError, set_path, split_path
from workers.plan import (
    ParamDef,
    SamplerConfig,
    SchedulerConfig,
    StorageConfig,
    StudyPlan,
    TrackingConfig,
)

__all__ = [
    "DATA_TASKS",
    "LN2",
    "MAX_SHOWN_ISSUES",
    "MAX_YAML_BYTES",
    "MAX_YAML_DEPTH",
    "MAX_YAML_NODES",
    "MAX_YAML_WRITTEN",
    "AdaNormSpec",
    "ArtifactLocation",
    "Asha",
    "AutoNormSpec",
    "CategoricalParam",
    "ConvLayerSpec",
    "DataSpec",
    "DyTSpec",
    "EndpointURL",
    "FiLMSpec",
    "FloatParam",
    "FreezeSpec",
    "IntParam",
    "LayerNormSpec",
    "LinearSpec",
    "MLPLayerSpec",
    "ModelSpec",
    "NormSpec",
    "ParamSpec",
    "RMSNormSpec",
    "ResourcesSpec",
    "SamplerSpec",
    "SchedulerSpec",
    "SearchSpec",
    "Seed",
    "SpecError",
    "SpecIssue",
    "StoragePath",
    "StorageSpec",
    "StudySpec",
    "TrackingSpec",
    "TrackingURI",
    "TrainingSpec",
    "TrialSections",
    "build_plan",
    "check_search_space",
    "compile_search",
    "dump_yaml",
    "git_commit",
    "layer_document",
    "load_spec",
    "metric_issues",
    "parse_yaml",
    "read_spec_text",
    "reported_metrics",
    "resolve_storage_path",
    "spec_hash",
    "trial_config",
    "url_field_issues",
    "validate_spec",
]

LN2 = math.log(2.0)
"""Maximum gate entropy for two candidates; ``eps_h`` above it would make every rule trivial."""

_SCALAR = (str, int, float, bool, type(None))


# --------------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SpecIssue:
    """One problem in a spec.

    Attributes:
        path: dotted field path (``model.norm.tau``); ``""`` for the document itself.
        message: what is wrong, in words a researcher can act on.
        line: 1-based YAML line where the offending value was written, when known.
        source: the file (or ``--set ...`` override, or ``--preset``) the value came from.
    """

    path: str
    message: str
    line: int | None = None
    source: str | None = None

    def format(self) -> str:
        where = self.source or ""
        if self.line is not None:
            where = f"{where}:{self.line}" if where else f"line {self.line}"
        head = f"{where}: " if where else ""
        field = self.path or "<document>"
        return f"{head}{field}: {self.message}"


class SpecError(Exception):
    """A spec failed to load or validate; ``issues`` lists every problem found.

    Deliberately not a ``ValueError``: raised from inside a pydantic validator it propagates unchanged
    (pydantic would flatten a ``ValueError`` into one message without paths).
    """

    def __init__(self, issues: Sequence[SpecIssue]) -> None:
        # Credentials never leave through an error: user info and queries of every URL are hidden.
        self.issues: tuple[SpecIssue, ...] = tuple(
            SpecIssue(
                redact_text(i.path),
                redact_text(i.message),
                i.line,
                None if i.source is None else redact_text(i.source),
            )
            for i in issues
        )
        super().__init__(self.format())

    def format(self) -> str:
        n = len(self.issues)
        lines = [f"invalid study spec ({n} error{'s' if n != 1 else ''}):"]
        lines += [f"  {issue.format()}" for issue in self.issues[:MAX_SHOWN_ISSUES]]
        if n > MAX_SHOWN_ISSUES:
            lines.append(f"  ... and {n - MAX_SHOWN_ISSUES} more")
        return "\n".join(lines)


MAX_SHOWN_ISSUES = 200
"""Issues :meth:`SpecError.format` prints (all of them stay in ``issues``)."""


def _path_str(path: Sequence[str | int]) -> str:
    return ".".join(str(p) for p in path)


# --------------------------------------------------------------------------------------------------
# YAML: safe loading with line numbers, duplicate-key and python-tag rejection
# --------------------------------------------------------------------------------------------------

_Path = tuple[str | int, ...]


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
    if tag.startswith("tag:yaml.org,2002:python/") or tag.startswith("!!python"):
        issues.append(
            SpecIssue(
                _path_str(path),
                f"tag {tag.replace('tag:yaml.org,2002:', '!!')!r} is not allowed (specs are plain data)",
                node.start_mark.line + 1,
            )
        )
        return
    if isinstance(node, yaml.ScalarNode):
        if tag == _INT_TAG and len(node.value) > _MAX_NUMBER_CHARS:
            issues.append(
                SpecIssue(
                    _path_str(path),
                    f"a {len(node.value)}-digit integer is not a setting (at most {_MAX_NUMBER_CHARS} digits)",
                    node.start_mark.line + 1,
                )
            )
        elif loader is not None and tag not in ("tag:yaml.org,2002:str", "tag:yaml.org,2002:null"):
            try:
                loader.construct_object(node, deep=True)
            except yaml.MarkedYAMLError as e:
                issues.append(
                    SpecIssue(_path_str(path), f"invalid YAML value: {e.problem}", node.start_mark.line + 1)
                )
            except (ValueError, OverflowError, TypeError) as e:
                issues.append(
                    SpecIssue(
                        _path_str(path),
                        f"invalid {tag.rsplit(':', 1)[-1]} value: {str(e)[:200]}",
                        node.start_mark.line + 1,
                    )
                )
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


# --------------------------------------------------------------------------------------------------
# Field types
# --------------------------------------------------------------------------------------------------

_FROZEN = ConfigDict(extra="forbid", frozen=True)

_INT64_MAX = 2**63 - 1  # larger integers overflow torch, numpy and MLflow's params
PosInt = Annotated[int, Field(strict=True, ge=1, le=_INT64_MAX)]
NonNegInt = Annotated[int, Field(strict=True, ge=0, le=_INT64_MAX)]
PosFloat = Annotated[float, Field(strict=True, gt=0, allow_inf_nan=False)]
NonNegFloat = Annotated[float, Field(strict=True, ge=0, allow_inf_nan=False)]
Fraction = Annotated[float, Field(strict=True, ge=0, lt=1, allow_inf_nan=False)]
Seed = Annotated[int, Field(strict=True, ge=0, lt=2**32)]
"""A random seed: Optuna's samplers and numpy refuse seeds of 2**32 and above."""


def _scalar(value: Any) -> Any:
    if not isinstance(value, _SCALAR):
        raise ValueError(
            f"must be a single value (string, number, boolean or null), got {type(value).__name__}"
        )
    return value


Scalar = Annotated[Any, AfterValidator(_scalar)]
"""A YAML scalar: what Optuna accepts as a categorical choice and ``when`` compares against."""


class _Spec(BaseModel):
    model_config = _FROZEN


# ---- norms ---------------------------------------------------------------------------------------

NormName = Literal["dyt", "layernorm", "rmsnorm"]


class LayerNormSpec(_Spec):
    """LayerNorm (FrozenLN baseline)."""

    type: Literal["layernorm"] = "layernorm"
    eps: PosFloat = 1e-5


class RMSNormSpec(_Spec):
    type: Literal["rmsnorm"] = "rmsnorm"
    eps: PosFloat = 1e-6


class DyTSpec(_Spec):
    """Dynamic Tanh; ``alpha_init`` is the one learnable scalar's start (Zhu et al.: 0.5)."""

    type: Literal["dyt"] = "dyt"
    alpha_init: PosFloat = 0.5


class AdaNormSpec(_Spec):
    """AdaNorm (Xu et al. 2019): ``C (1 - k y) y`` with the factor detached."""

    type: Literal["adanorm"] = "adanorm"
    k: Fraction = 0.1
    scale: PosFloat = 2.0  # the paper's C
    eps: PosFloat = 1e-5


class FiLMSpec(_Spec):
    """Self-conditioned FiLM over a LayerNorm without affine; starts as LN (zero-initialised MLP)."""

    type: Literal["film"] = "film"
    eps: PosFloat = 1e-5
    hidden_dim: PosInt | None = None  # None: dim // 2


def _distinct_candidates(cls: Any, v: tuple[str, ...]) -> tuple[str, ...]:
    if len(v) < 2 or len(set(v)) != len(v):
        raise ValueError(f"candidates must be at least two distinct norms, got {list(v)}")
    return v


class AutoNormSpec(_Spec):
    """Gumbel-softmax gate mixing candidate norms per sample (AutoNorm)."""

    type: Literal["autonorm"] = "autonorm"
    candidates: tuple[NormName, ...] = ("dyt", "layernorm")
    tau: Annotated[float, Field(strict=True, gt=0, le=100, allow_inf_nan=False)] = 0.5
    hard: StrictBool = False  # straight-through one-hot samples in training
    eval_mode: Literal["softmax", "argmax", "sample"] = "softmax"
    selector_init: Literal["zeros", "default"] = "zeros"  # zeros: the gate starts at uniform weights
    # (noise after freezing is training.freeze.sample_after_freeze: the fit's freeze rule decides it)
    hidden_dim: PosInt | None = None  # selector MLP width; None: dim // 2
    # once frozen, a batch whose gate weight is at least this for one branch computes only that branch
    fast_path_threshold: Annotated[float, Field(strict=True, gt=0.5, le=1.0)] = 1.0 - 1e-3

    _distinct = field_validator("candidates")(_distinct_candidates)


class RandomSelectorSpec(_Spec):
    """Control: ``w_DyT ~ U(0, 1)`` per sample per forward, no learning."""

    type: Literal["random_selector"] = "random_selector"
    candidates: tuple[NormName, ...] = ("dyt", "layernorm")
    eval_mode: Literal["mean", "sample"] = "mean"  # mean: the expected weights, deterministic

    _distinct = field_validator("candidates")(_distinct_candidates)


class IdentitySpec(_Spec):
    type: Literal["identity"] = "identity"


NormSpec = Annotated[
    LayerNormSpec
    | RMSNormSpec
    | DyTSpec
    | AdaNormSpec
    | FiLMSpec
    | AutoNormSpec
    | RandomSelectorSpec
    | IdentitySpec,
    Field(discriminator="type"),
]


# ---- affine layers ---------------------------------------------------------------------------------


class PlainLinearSpec(_Spec):
    type: Literal["linear"] = "linear"


class PreNormL2Spec(_Spec):
    """``W x/‖x‖ + b``: scale invariant, loses the radius."""

    type: Literal["prenorm_l2"] = "prenorm_l2"


class PreNormRMSSpec(_Spec):
    type: Literal["prenorm_rms"] = "prenorm_rms"


class CorrectedLinearSpec(_Spec):
    """``(W x + β b) / sqrt(‖x‖² + β²)``: removes the affine divergence for one sample."""

    type: Literal["corrected"] = "corrected"
    beta: PosFloat = 1.0


class LinearBatchNormSpec(_Spec):
    type: Literal["linear_batchnorm"] = "linear_batchnorm"


class LinearLayerNormSpec(_Spec):
    type: Literal["linear_layernorm"] = "linear_layernorm"


LinearSpec = Annotated[
    PlainLinearSpec | PreNormL2Spec | PreNormRMSSpec | CorrectedLinearSpec,
    Field(discriminator="type"),
]
"""Linear layers inside transformer blocks (the divergence-fix variant)."""

MLPLayerSpec = Annotated[
    PlainLinearSpec
    | LinearBatchNormSpec
    | LinearLayerNormSpec
    | PreNormL2Spec
    | PreNormRMSSpec
    | CorrectedLinearSpec,
    Field(discriminator="type"),
]
"""Hidden layers of the MLP, including the BatchNorm / LayerNorm controls."""


class ConvSpec(_Spec):
    type: Literal["conv"] = "conv"


class ConvBatchNormSpec(_Spec):
    type: Literal["conv_batchnorm"] = "conv_batchnorm"


class ConvLayerNormSpec(_Spec):
    """Convolution + LayerNorm over each sample's (C, H, W) feature map (GroupNorm with one group)."""

    type: Literal["conv_layernorm"] = "conv_layernorm"


class PatchNormSpec(_Spec):
    """Per-location divergence correction of a convolution (PatchNormConv2d)."""

    type: Literal["patchnorm"] = "patchnorm"
    bias_in_division: StrictBool = True  # (<W, P> + b) / sqrt(|P|^2 + 1), as written in the paper
    patch_scale: StrictBool = False  # extra sqrt(C kh kw) factor
    learnable_gain: StrictBool = False


ConvLayerSpec = Annotated[
    ConvSpec | ConvBatchNormSpec | ConvLayerNormSpec | PatchNormSpec, Field(discriminator="type")
]


# ---- models ------------------------------------------------------------------------------------------


class _TransformerSpec(_Spec):
    """Fields shared by the transformer encoders. ``None`` sizes take the preset's value."""

    preset: Literal["paper", "tiny"] = "paper"
    depth: PosInt | None = None
    dim: PosInt | None = None
    heads: PosInt | None = None
    mlp_ratio: PosFloat | None = None
    drop_path: Fraction | None = None
    layerscale_init: NonNegFloat | None = None
    qkv_bias: StrictBool | None = None
    norm: NormSpec = LayerNormSpec()
    final_norm: NormSpec = LayerNormSpec()  # the paper keeps LN after the last block
    linear: LinearSpec = PlainLinearSpec()
    linear_in_attention: StrictBool = False  # also use `linear` for the q/k/v/out projections

    @field_validator("heads")
    @classmethod
    def _heads_divide_dim(cls, v: int | None, info: ValidationInfo) -> int | None:
        dim = info.data.get("dim")
        if v is not None and dim is not None and dim % v:
            raise ValueError(f"heads ({v}) must divide dim ({dim})")
        return v


class ViTLiteSpec(_TransformerSpec):
    """ViT-Lite vision encoder (paper: depth 8, dim 128, heads 4, patch 4)."""

    type: Literal["vit_lite"] = "vit_lite"
    patch_size: PosInt | None = None


class TextEncoderSpec(_TransformerSpec):
    """Text encoder for token tagging and sentence classification (paper: depth 12, dim 128, heads 8)."""

    type: Literal["text_encoder"] = "text_encoder"
    pool: Literal["cls", "mean"] | None = None  # sentence classification: CLS token or token mean


class TabularSpec(_TransformerSpec):
    """Feature-token encoder for tabular regression/classification."""

    type: Literal["tabular"] = "tabular"


class MLPSpec(_Spec):
    """Plain MLP for the batch-size hypothesis; ``hidden`` overrides the preset's widths."""

    type: Literal["mlp"] = "mlp"
    preset: Literal["paper", "tiny"] = "paper"
    hidden: Annotated[tuple[PosInt, ...], Field(min_length=1)] | None = None
    layer: MLPLayerSpec = PlainLinearSpec()
    activation: Literal["relu", "gelu", "tanh"] | None = None
    head_variant: StrictBool | None = None  # the output layer uses `layer` too (not for +BN/+LN)


class CNNSpec(_Spec):
    """Small CNN (the PatchNorm variant of the batch-size hypothesis)."""

    type: Literal["cnn"] = "cnn"
    preset: Literal["paper", "tiny"] = "paper"
    channels: Annotated[tuple[PosInt, ...], Field(min_length=1)] | None = None
    kernel: PosInt | None = None
    layer: ConvLayerSpec = ConvSpec()
    activation: Literal["relu", "gelu", "tanh"] | None = None


ModelSpec = Annotated[
    ViTLiteSpec | TextEncoderSpec | TabularSpec | MLPSpec | CNNSpec,
    Field(discriminator="type"),
]


# ---- data --------------------------------------------------------------------------------------------


class _DataSpec(_Spec):
    subset: PosInt | None = None  # use the first N training examples (CPU smoke runs)
    val_fraction: Annotated[float, Field(strict=True, gt=0, lt=1)] = 0.1  # held out of train for selection


class _RootedDataSpec(_DataSpec):
    data_root: str | None = None  # None: the data set's offline default location


class FashionMNISTSpec(_RootedDataSpec):
    type: Literal["fashion_mnist"] = "fashion_mnist"


class DigitsSpec(_DataSpec):
    """scikit-learn's 8x8 digits (bundled with the package, hence no ``data_root``)."""

    type: Literal["digits"] = "digits"


class DiabetesSpec(_DataSpec):
    type: Literal["diabetes"] = "diabetes"


class PTBPosSampleSpec(_RootedDataSpec):
    type: Literal["ptb_pos_sample"] = "ptb_pos_sample"


class PangLeePolaritySpec(_RootedDataSpec):
    type: Literal["pang_lee_polarity"] = "pang_lee_polarity"


class MNISTSpec(_RootedDataSpec):
    type: Literal["mnist"] = "mnist"


class CIFAR10Spec(_RootedDataSpec):
    type: Literal["cifar10"] = "cifar10"


class CIFAR100Spec(_RootedDataSpec):
    type: Literal["cifar100"] = "cifar100"


class SVHNSpec(_RootedDataSpec):
    type: Literal["svhn"] = "svhn"


class SST2Spec(_RootedDataSpec):
    type: Literal["sst2"] = "sst2"


class PTBPosSpec(_RootedDataSpec):
    type: Literal["ptb_pos"] = "ptb_pos"


DataSpec = Annotated[
    FashionMNISTSpec
    | DigitsSpec
    | DiabetesSpec
    | PTBPosSampleSpec
    | PangLeePolaritySpec
    | MNISTSpec
    | CIFAR10Spec
    | CIFAR100Spec
    | SVHNSpec
    | SST2Spec
    | PTBPosSpec,
    Field(discriminator="type"),
]

_IMAGE_SIDE = {"fashion_mnist": 28, "mnist": 28, "digits": 8, "cifar10": 32, "cifar100": 32, "svhn": 32}
_TEXT = {"ptb_pos_sample", "pang_lee_polarity", "sst2", "ptb_pos"}
_MODEL_DATA = {
    "vit_lite": set(_IMAGE_SIDE),
    "cnn": set(_IMAGE_SIDE),
    "text_encoder": _TEXT,
    "tabular": {"diabetes", "digits"},
    "mlp": {*_IMAGE_SIDE, "diabetes"},
}


# ---- metrics: what a trial reports, and which way is better -------------------------------------------

DATA_TASKS: dict[str, str] = {
    "fashion_mnist": "classification",
    "digits": "classification",
    "diabetes": "regression",
    "ptb_pos_sample": "tagging",
    "pang_lee_polarity": "classification",
    "mnist": "classification",
    "cifar10": "classification",
    "cifar100": "classification",
    "svhn": "classification",
    "sst2": "classification",
    "ptb_pos": "tagging",
}
"""The task of each data set (``autonorm_core.data``'s ``Splits.task``); a contract test keeps them equal."""

_TASK_METRICS: dict[str, dict[str, str]] = {
    task: {
        "train_loss": "min",
        "val_loss": "min",
        "test_loss": "min",
        f"val_{score}": direction,
        f"test_{score}": direction,
    }
    for task, score, direction in (
        ("classification", "accuracy", "max"),
        ("tagging", "accuracy", "max"),
        ("regression", "rmse", "min"),
    )
}
_GATE_METRICS = {"gate_entropy": "min"}
_GATE_LAYER_METRIC = re.compile(r"^gate_entropy/layer_[0-9]{1,4}$")


def reported_metrics(task: str, *, gated: bool = False) -> dict[str, str]:
    """Metric name -> ``"max"`` | ``"min"`` for what ``autonorm_core.training.fit`` reports on ``task``.

    Mirrors ``autonorm_core.training.reported_metrics`` without importing torch (a contract test keeps
    the two equal). ``gated``: the model has AutoNorm layers, which add ``gate_entropy`` (and the
    per-layer ``gate_entropy/layer_<i>``, matched by pattern, not listed).
    """
    if task not in _TASK_METRICS:
        raise ValueError(f"unknown task {task!r}; valid: {', '.join(_TASK_METRICS)}")
    return {**_TASK_METRICS[task], **(_GATE_METRICS if gated else {})}


def _searched_choices(space: Sequence[Any], name: str) -> list[Any] | None:
    for p in space:
        if p.name == name:
            return list(p.choices) if isinstance(p, CategoricalParam) else [None]
    return None


def _always_gated(model: Any, space: Sequence[Any]) -> bool:
    """Every trial's model has AutoNorm layers (``norm`` or ``final_norm`` is, and stays, autonorm)."""
    for field in ("norm", "final_norm"):
        if getattr(getattr(model, field, None), "type", None) != "autonorm":
            continue
        searched = _searched_choices(space, f"model.{field}.type")
        if searched is None or all(c == "autonorm" for c in searched):
            return True
    return False


def metric_issues(
    metric: str,
    mode: str | None,
    *,
    model: Any,
    data: Any,
    space: Sequence[Any] = (),
    metric_path: str = "search.metric",
    mode_path: str = "search.mode",
    allow_test: bool = False,
) -> list[SpecIssue]:
    """Check that every trial reports ``metric`` and that ``mode`` optimises it the right way.

    Args:
        metric: the metric to select on (or analyse).
        mode: ``"max"`` / ``"min"``; None skips the direction check.
        model, data: the spec's sections (a searched ``data.type`` or ``model.norm.type`` is honoured
            through ``space``: the metric must be reported under every choice).
        metric_path, mode_path: field paths for the messages.
        allow_test: accept ``test_*`` metrics (final analysis, never selection).
    """
    data_types = _searched_choices(space, "data.type") or [data.type]
    tasks = sorted({DATA_TASKS[d] for d in data_types if d in DATA_TASKS})
    if not tasks:
        return []
    gated = _always_gated(model, space)
    tables = [reported_metrics(t, gated=gated) for t in tasks]
    valid = {k: v for k, v in tables[0].items() if all(t.get(k) == v for t in tables[1:])}
    if not allow_test:
        valid = {k: v for k, v in valid.items() if not k.startswith("test_")}
    where = f"{' and '.join(sorted(set(map(str, data_types))))} ({', '.join(tasks)})"
    if metric in valid:
        direction = valid[metric]
    elif gated and _GATE_LAYER_METRIC.match(metric):
        direction = "min"
    else:
        hint = ""
        if metric.startswith("gate_entropy") and not gated:
            hint = " (gate metrics need model.norm.type or model.final_norm.type 'autonorm' in every trial)"
        return [
            SpecIssue(
                metric_path,
                f"{metric!r} is not a metric that trials on {where} report{hint}; valid: {', '.join(sorted(valid))}",
            )
        ]
    if mode is not None and mode != direction:
        better = "higher" if direction == "max" else "lower"
        return [
            SpecIssue(
                mode_path, f"{metric} is better when {better}: mode must be {direction!r}, got {mode!r}"
            )
        ]
    return []


# ---- training ------------------------------------------------------------------------------------------


class FreezeSpec(_Spec):
    """AutoNorm-S: at the end of epoch ``t_freeze`` the rule decides whether to freeze the selector.

    ``freeze_if_high`` is the paper's literal wording (freeze if the gate entropy has NOT fallen below
    ``eps_h``); the other rules are the alternatives a study can compare.
    """

    t_freeze: PosInt = 10
    eps_h: Annotated[float, Field(strict=True, ge=0, le=LN2)] = 0.1
    rule: Literal["freeze_if_high", "freeze_if_low", "always"] = "freeze_if_high"
    sample_after_freeze: StrictBool = False


class TrainingSpec(_Spec):
    """The training loop's settings (defaults as in ``docs/science.md``)."""

    epochs: PosInt = 20
    batch_size: PosInt = 64
    lr: Annotated[float, Field(strict=True, gt=0, le=10, allow_inf_nan=False)] = 1e-3
    optimizer: Literal["adamw", "sgd"] = "adamw"
    momentum: Fraction = 0.0  # sgd only; the divergence derivation assumes none
    weight_decay: NonNegFloat = 1e-4
    schedule: Literal["cosine", "constant"] = "cosine"
    warmup_fraction: Fraction = 0.05
    grad_clip: PosFloat | None = 1.0  # None: no clipping
    label_smoothing: Fraction = 0.1
    freeze: FreezeSpec | None = None  # None: the gate trains throughout (plain AutoNorm)
    lr_scaling: Literal["constant", "linear", "sqrt"] = "constant"  # lr vs batch_size/reference_batch_size
    reference_batch_size: PosInt = 64
    budget: Literal["epochs", "updates"] = "epochs"
    max_updates: PosInt | None = None  # required when budget == "updates"
    eval_batch_size: PosInt = 256
    tau_final: PosFloat | None = None  # anneal AutoNorm's tau to this by the last epoch; None: fixed
    precision: Literal["fp32", "bf16"] = "fp32"
    """``bf16``: every forward (training and evaluation) under bf16 autocast; loss, parameters, gradients
    and optimizer state stay float32. Valid on CPU and CUDA (on most CPUs slower than ``fp32``)."""
    compile: Literal["auto", "on", "off"] = "auto"
    """Run the model's forward through ``torch.compile``: ``auto`` on CUDA only (eager on CPU, where
    compiling does not pay off in a short trial), ``on`` on any device, ``off`` never."""


# --------------------------------------------------------------------------------------------------
# Search space, sampler, scheduler
# --------------------------------------------------------------------------------------------------


class _ParamBase(_Spec):
    name: str = Field(min_length=1)  # dotted path into the trial config, or "seed"
    when: dict[str, Scalar] = {}  # sample only when these earlier parameters have these values


class _RangeParam(_ParamBase):
    # `log` and `step` come before the bounds so the bounds' validators can see them.
    log: StrictBool = False

    @field_validator("low", check_fields=False)
    @classmethod
    def _low_positive_for_log(cls, v: float, info: ValidationInfo) -> float:
        if info.data.get("log") and v <= 0:
            raise ValueError(f"a log-scaled range needs low > 0, got {v}")
        if info.data.get("log") and info.data.get("step") is not None:
            raise ValueError("step cannot be combined with log")
        return v

    @field_validator("high", check_fields=False)
    @classmethod
    def _high_above_low(cls, v: float, info: ValidationInfo) -> float:
        low = info.data.get("low")
        if low is not None and v <= low:
            raise ValueError(f"high ({v}) must be above low ({low})")
        return v


class IntParam(_RangeParam):
    type: Literal["int"] = "int"
    step: PosInt | None = None
    low: Annotated[int, Field(strict=True)]
    high: Annotated[int, Field(strict=True)]


class FloatParam(_RangeParam):
    """Uniform float; ``log: true`` samples log-uniformly (``low`` must then be > 0)."""

    type: Literal["float"] = "float"
    step: PosFloat | None = None
    low: Annotated[float, Field(strict=True, allow_inf_nan=False)]
    high: Annotated[float, Field(strict=True, allow_inf_nan=False)]


class CategoricalParam(_ParamBase):
    type: Literal["categorical"] = "categorical"
    choices: Annotated[tuple[Scalar, ...], Field(min_length=1)]

    @field_validator("choices")
    @classmethod
    def _distinct(cls, v: tuple[Any, ...]) -> tuple[Any, ...]:
        keys = [json.dumps(c) for c in v]
        if len(set(keys)) != len(keys):
            raise ValueError(f"choices must be distinct, got {list(v)}")
        return v


ParamSpec = Annotated[IntParam | FloatParam | CategoricalParam, Field(discriminator="type")]


class TPESpec(_Spec):
    type: Literal["tpe"] = "tpe"
    seed: Seed = 0
    n_startup_trials: PosInt = 10


class RandomSamplerSpec(_Spec):
    type: Literal["random"] = "random"
    seed: Seed = 0


class CmaEsSpec(_Spec):
    type: Literal["cmaes"] = "cmaes"
    seed: Seed = 0
    n_startup_trials: PosInt = 1


class GridSpec(_Spec):
    """Exhaustive grid over the categorical parameters' choices (x seeds), ``num_samples`` repeats."""

    type: Literal["grid"] = "grid"


SamplerSpec = Annotated[TPESpec | RandomSamplerSpec | CmaEsSpec | GridSpec, Field(discriminator="type")]


class FIFOSpec(_Spec):
    type: Literal["fifo"] = "fifo"


class Asha(_Spec):
    """Asynchronous successive halving over epochs (exploration only: stopped trials are PRUNED)."""

    type: Literal["asha"] = "asha"
    grace_period: PosInt = 1
    reduction_factor: Annotated[int, Field(strict=True, ge=2)] = 3


class MedianSpec(_Spec):
    type: Literal["median"] = "median"
    grace_period: PosInt = 1


SchedulerSpec = Annotated[FIFOSpec | Asha | MedianSpec, Field(discriminator="type")]


class SearchSpec(_Spec):
    """What to optimise and how: the space, the sampler, the early-stopping scheduler, the budget."""

    metric: str = Field(default="val_accuracy", min_length=1)
    mode: Literal["min", "max"] = "max"
    space: tuple[ParamSpec, ...] = ()
    sampler: SamplerSpec = TPESpec()
    scheduler: SchedulerSpec = FIFOSpec()
    num_samples: PosInt = 8  # trials (Optuna samplers) or repeats of the grid
    max_concurrent: PosInt = 2  # always passed to Tune: without it Optuna keeps one trial pending

    @field_validator("metric")
    @classmethod
    def _not_test_split(cls, v: str) -> str:
        if v.startswith("test_"):
            raise ValueError(f"{v!r} selects on the test split; use a validation metric (val_...)")
        return v

    @field_validator("mode")
    @classmethod
    def _mode_matches_metric(cls, v: str, info: ValidationInfo) -> str:
        metric = info.data.get("metric") or ""
        if "loss" in metric and v == "max":
            raise ValueError(f"metric {metric!r} is a loss: mode must be 'min'")
        if "accuracy" in metric and v == "min":
            raise ValueError(f"metric {metric!r} is an accuracy: mode must be 'max'")
        return v


# --------------------------------------------------------------------------------------------------
# Resources, tracking, storage
# --------------------------------------------------------------------------------------------------


class ResourcesSpec(_Spec):
    """Per trial. Fractional GPUs share a device (``0.25`` = four trials per GPU)."""

    cpu: NonNegFloat = 1.0
    gpu: NonNegFloat = 0.0

    @field_validator("gpu")
    @classmethod
    def _whole_gpus_above_one(cls, v: float, info: ValidationInfo) -> float:
        if v > 1 and not float(v).is_integer():
            raise ValueError(f"fractions of a GPU must be below 1; above 1 use whole GPUs, got {v}")
        if v == 0 and info.data.get("cpu") == 0:
            raise ValueError("a trial needs some resource: cpu and gpu are both 0")
        return v

    def as_plan(self) -> tuple[tuple[str, float], ...]:
        res: list[tuple[str, float]] = [("cpu", float(self.cpu))]
        if self.gpu:
            res.append(("gpu", float(self.gpu)))
        return tuple(res)


class TrackingSpec(_Spec):
    """MLflow. ``uri`` None: ``$MLFLOW_TRACKING_URI`` if set, else ``sqlite:///<storage>/mlflow.db``."""

    uri: TrackingURI | None = None  # http(s), sqlite:////abs, postgresql, mysql, databricks
    experiment: Annotated[str, Field(min_length=1, max_length=500)] | None = None  # None: the study's name
    artifact_location: ArtifactLocation | None = None  # e.g. s3://bucket/prefix for a new experiment


class StorageSpec(_Spec):
    """How to reach ``storage_path`` when it is ``s3://...``; keys come from the environment only."""

    endpoint_override: EndpointURL | None = None  # S3-compatible server, e.g. http://127.0.0.1:8333
    region: Annotated[str, Field(pattern=r"^[a-z0-9-]{1,64}$")] = "us-east-1"


# --------------------------------------------------------------------------------------------------
# The trial sections and cross-field checks
# --------------------------------------------------------------------------------------------------


def _section_issues(model: Any, data: Any, training: TrainingSpec) -> list[SpecIssue]:
    """Checks that need more than one section; paths are those of the trial config."""
    issues: list[SpecIssue] = []
    allowed = _MODEL_DATA.get(model.type, set())
    if data.type not in allowed:
        issues.append(
            SpecIssue(
                "data.type",
                f"{data.type!r} does not fit model type {model.type!r} (valid: {', '.join(sorted(allowed))})",
            )
        )
    patch = getattr(model, "patch_size", None)
    side = _IMAGE_SIDE.get(data.type)
    if patch is not None and side is not None and side % patch:
        issues.append(
            SpecIssue(
                "model.patch_size",
                f"patch_size {patch} does not divide the {side}x{side} images of {data.type!r}",
            )
        )
    if training.freeze is not None:
        if training.freeze.t_freeze > training.epochs:
            issues.append(
                SpecIssue(
                    "training.freeze.t_freeze",
                    f"t_freeze ({training.freeze.t_freeze}) is after the last epoch ({training.epochs})",
                )
            )
        if getattr(getattr(model, "norm", None), "type", None) != "autonorm":
            issues.append(
                SpecIssue(
                    "training.freeze",
                    "gate freezing needs model.norm.type 'autonorm' (set training.freeze: null otherwise)",
                )
            )
    if training.budget == "updates" and training.max_updates is None:
        issues.append(SpecIssue("training.max_updates", "required when training.budget is 'updates'"))
    if training.budget == "epochs" and training.max_updates is not None:
        issues.append(SpecIssue("training.max_updates", "only used when training.budget is 'updates'"))
    if training.optimizer == "adamw" and training.momentum:
        issues.append(SpecIssue("training.momentum", "momentum is an sgd setting; adamw ignores it"))
    if training.tau_final is not None and getattr(getattr(model, "norm", None), "type", None) != "autonorm":
        issues.append(SpecIssue("training.tau_final", "tau annealing needs model.norm.type 'autonorm'"))
    return issues


class TrialSections(_Spec):
    """What one trial receives: the spec's model, data and training sections plus a seed.

    Validating a candidate trial config against this model is how the search space is checked:
    every value a parameter can take is written into the base config and re-validated.
    """

    model: ModelSpec
    data: DataSpec
    training: TrainingSpec = TrainingSpec()
    seed: Seed = 0

    @model_validator(mode="after")
    def _cross(self) -> TrialSections:
        issues = _section_issues(self.model, self.data, self.training)
        if issues:
            raise SpecError(issues)
        return self

    def trial_config(self) -> dict[str, Any]:
        """The plain dict workers hand to a trial (see ``workers/plan.py``)."""
        return trial_config(self.model, self.data, self.training, self.seed)


def _type_first(obj: Any) -> Any:
    """Put each variant's ``type`` first, so a resolved spec reads like the YAML people write."""
    if isinstance(obj, dict):
        head = {"type": obj["type"]} if "type" in obj else {}
        return {**head, **{k: _type_first(v) for k, v in obj.items() if k != "type"}}
    if isinstance(obj, list):
        return [_type_first(v) for v in obj]
    return obj


def trial_config(model: Any, data: Any, training: TrainingSpec, seed: int) -> dict[str, Any]:
    """Trial config from sections; ``None`` model sizes are dropped so the preset's values apply."""
    return {
        "model": model.model_dump(mode="json", exclude_none=True),
        "data": data.model_dump(mode="json"),
        "training": training.model_dump(mode="json"),
        "seed": seed,
    }


_TRIAL_ROOTS = ("model", "data", "training")


def check_search_space(
    space: Sequence[IntParam | FloatParam | CategoricalParam],
    base_config: Mapping[str, Any],
    *,
    sampler: str = "tpe",
    seeds: Sequence[int] = (0,),
    prefix: str = "search.space",
) -> list[SpecIssue]:
    """Check that every parameter addresses a real field and that each of its values gives a valid trial.

    For each parameter, its ``when`` conditions and then each representative value (``low``, ``high``,
    every choice; for an integer range every value in between too, or a sample of a wide one) are
    written into ``base_config`` at the parameter's path with :func:`workers.dotted.set_path`, exactly
    as trials will do, and the result is validated as :class:`TrialSections`. A value that fails names the parameter
    (``search.space.3.high``) and the trial-config field it broke.

    Args:
        space: the parameters, in sampling order.
        base_config: the trial config every trial starts from.
        sampler: ``grid`` needs categorical parameters without conditions.
        seeds: the study's seeds (a searched ``seed`` parameter must not also be fixed by several).
        prefix: path of the space in the spec, for messages.
    """
    issues: list[SpecIssue] = []
    names: dict[str, int] = {}
    taken: dict[str, list[Any]] = {}
    for i, p in enumerate(space):
        where = f"{prefix}.{i}"
        if p.name in names:
            issues.append(
                SpecIssue(f"{where}.name", f"{p.name!r} is already searched by {prefix}.{names[p.name]}")
            )
            continue
        root = p.name.split(".", 1)[0]
        if p.name != "seed" and (root not in _TRIAL_ROOTS or "." not in p.name):
            issues.append(
                SpecIssue(
                    f"{where}.name",
                    f"{p.name!r} must be 'seed' or a dotted path below model., data. or training.",
                )
            )
            continue
        for cond_name, cond_value in p.when.items():
            if cond_name not in names:
                issues.append(
                    SpecIssue(
                        f"{where}.when.{cond_name}",
                        "a condition must name a parameter listed before this one",
                    )
                )
                continue
            cond = space[names[cond_name]]
            if isinstance(cond, CategoricalParam) and cond_value not in cond.choices:
                issues.append(
                    SpecIssue(
                        f"{where}.when.{cond_name}",
                        f"{cond_value!r} is not one of {cond_name}'s choices {list(cond.choices)}; "
                        "the parameter would never be sampled",
                    )
                )
        names[p.name] = i
        if sampler == "grid":
            if not isinstance(p, CategoricalParam):
                issues.append(SpecIssue(f"{where}.type", "the grid sampler needs categorical parameters"))
            if p.when:
                issues.append(SpecIssue(f"{where}.when", "the grid sampler does not support conditions"))
        if p.name == "seed" and len(seeds) > 1:
            issues.append(SpecIssue(f"{where}.name", "seed is both searched and fixed by 'seeds'"))
        values: list[tuple[str, Any]]
        interior: list[Any] = []
        if isinstance(p, CategoricalParam):
            values = [(f"choices.{j}", c) for j, c in enumerate(p.choices)]
        elif isinstance(p, IntParam):
            grid = _int_values(p)
            values = [("low", grid[0]), ("high", grid[-1])]
            interior = grid[1:-1]
        else:
            values = [("low", p.low), ("high", p.high)]
        taken[p.name] = [v for _, v in values] + interior
        path_ok = True
        n_before = len(issues)
        for field, value in values:
            problems_or_err = _try_value(base_config, p, value)
            if isinstance(problems_or_err, PathError):
                issues.append(
                    SpecIssue(f"{where}.name", f"{p.name!r} does not address a field: {problems_or_err}")
                )
                path_ok = False
                break
            problems = problems_or_err
            section = p.name.rsplit(".", 1)[0]
            leftovers = [
                pr.path.rsplit(".", 1)[1]
                for pr in problems
                if p.name.endswith(".type")
                and pr.path.startswith(section + ".")
                and "unknown field" in pr.message
            ]
            if leftovers and len(leftovers) == len(problems):
                # Workers set only the `type` key, so the base variant's own fields stay behind.
                issues.append(
                    SpecIssue(
                        f"{where}.{field}",
                        f"{p.name}={value!r} keeps the base {section}'s fields {', '.join(leftovers)}, "
                        f"which type {value!r} does not have; start from a base {section} whose fields "
                        "every searched type accepts (e.g. only `type`)",
                    )
                )
                continue
            for prob in problems:
                issues.append(
                    SpecIssue(
                        f"{where}.{field}",
                        f"{p.name}={value!r} gives an invalid trial: {prob.path}: {prob.message}",
                    )
                )
            if problems and all(
                pr.path.startswith(p.name) and "unknown field" in pr.message for pr in problems
            ):
                path_ok = False
                break  # the path itself is wrong; one message is enough
        if path_ok and interior and len(issues) == n_before:
            # The endpoints passed or failed above; a value between them can still fail on its own
            # (heads=3 with dim 64, patch_size=3 on 8x8 images).
            failed: list[tuple[Any, SpecIssue]] = []
            for value in interior:
                result = _try_value(base_config, p, value)
                if isinstance(result, list) and result:
                    failed.append((value, result[0]))
            if failed:
                value, prob = failed[0]
                others = [v for v, _ in failed[1:]]
                also = f" (also {', '.join(map(str, others))})" if others else ""
                issues.append(
                    SpecIssue(
                        where,
                        f"{p.name}={value!r}{also}, inside [{values[0][1]}, {values[-1][1]}], gives an invalid trial: "
                        f"{prob.path}: {prob.message}; narrow the range or list valid values as categorical",
                    )
                )
    issues += _freeze_within_epochs(space, names, taken, prefix)
    return issues


_DENSE_INT_RANGE = 64
"""Integer ranges with at most this many values are checked value by value."""
_INT_SAMPLE = 16


def _int_values(p: IntParam) -> list[int]:
    """The values an int parameter can take: all of them when there are at most :data:`_DENSE_INT_RANGE`,
    else both endpoints and :data:`_INT_SAMPLE` evenly spaced ones (a sample: a value rejected only
    between two sampled points of a wide range goes unnoticed until a trial draws it)."""
    step = p.step or 1
    count = (p.high - p.low) // step + 1
    if count <= _DENSE_INT_RANGE:
        return [p.low + k * step for k in range(count)]
    picks = {0, count - 1, *(round(i * (count - 1) / (_INT_SAMPLE + 1)) for i in range(1, _INT_SAMPLE + 1))}
    return [p.low + k * step for k in sorted(picks)]


def _try_value(base_config: Mapping[str, Any], p: Any, value: Any) -> list[SpecIssue] | PathError:
    cfg = copy.deepcopy(dict(base_config))
    try:
        for cond_name, cond_value in p.when.items():
            set_path(cfg, cond_name, cond_value)
        set_path(cfg, p.name, value)
    except PathError as e:
        return e
    return _trial_issues(cfg)


def _freeze_within_epochs(
    space: Sequence[Any], names: Mapping[str, int], taken: Mapping[str, list[Any]], prefix: str
) -> list[SpecIssue]:
    """A searched t_freeze must stay within every epochs value the search can pair it with."""
    tf, ep = "training.freeze.t_freeze", "training.epochs"
    if tf not in names or ep not in names:
        return []  # a fixed side is checked against each value of the other when it is written in
    tfs = [v for v in taken.get(tf, []) if isinstance(v, int) and not isinstance(v, bool)]
    eps = [v for v in taken.get(ep, []) if isinstance(v, int) and not isinstance(v, bool)]
    if not tfs or not eps or max(tfs) <= min(eps):
        return []
    p = space[names[tf]]
    field = "high" if not isinstance(p, CategoricalParam) else "choices"
    return [
        SpecIssue(
            f"{prefix}.{names[tf]}.{field}",
            f"{tf} can be {max(tfs)} while {ep} can be {min(eps)}: such a trial ends before its "
            "freeze epoch and silently never freezes the gate; keep t_freeze at most the smallest epochs",
        )
    ]


def _trial_issues(cfg: Mapping[str, Any]) -> list[SpecIssue]:
    try:
        TrialSections.model_validate(cfg)
    except SpecError as e:
        return list(e.issues)
    except ValidationError as e:
        return _pydantic_issues(e, cfg, TrialSections)
    return []


# --------------------------------------------------------------------------------------------------
# The study spec
# --------------------------------------------------------------------------------------------------


def _confirm_issues(spec: Any) -> list[SpecIssue]:
    """The claims study needs an AutoNorm search and seeds that no earlier phase used."""
    confirm = spec.confirm
    if confirm is None:
        return []
    issues = []
    norm = getattr(spec.model, "norm", None)
    if getattr(norm, "type", None) != "autonorm":
        issues.append(
            SpecIssue(
                "confirm", "the AutoNorm claims need model.norm.type 'autonorm' (set confirm: null otherwise)"
            )
        )
    used = sorted(set(confirm.seeds) & set(spec.seeds))
    if used:
        issues.append(
            SpecIssue("confirm.seeds", f"seeds {used} are search seeds; the confirmation needs fresh ones")
        )
    if confirm.lr_tuning is not None:
        used = sorted(set(confirm.lr_tuning.seeds) & set(spec.seeds))
        if used:
            issues.append(
                SpecIssue("confirm.lr_tuning.seeds", f"seeds {used} are search seeds; tune on held-out ones")
            )
    return issues


class StudySpec(_Spec):
    """One study: what to train, what to search, where it runs and where results go."""

    kind: Literal["search"] = "search"  # the batch-size study says "batchsize"
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")  # Tune dir + MLflow experiment
    description: str = ""
    hypothesis: str | None = None
    model: ModelSpec
    data: DataSpec
    training: TrainingSpec = TrainingSpec()
    search: SearchSpec = SearchSpec()
    resources: ResourcesSpec = ResourcesSpec()
    retries: NonNegInt = 2  # FailureConfig(max_failures)
    seeds: Annotated[tuple[Seed, ...], Field(min_length=1)] = (0,)
    tracking: TrackingSpec = TrackingSpec()
    storage_path: StoragePath = "runs"  # local dir (relative: to the cwd), file:///abs or s3://bucket/prefix
    storage: StorageSpec = StorageSpec()
    confirm: ConfirmSpec | None = None  # the AutoNorm claims after the search; None: search only

    @model_validator(mode="after")
    def _cross(self) -> StudySpec:
        issues = list(_section_issues(self.model, self.data, self.training))
        issues += _confirm_issues(self)
        if len(set(self.seeds)) != len(self.seeds):
            issues.append(SpecIssue("seeds", f"seeds must be distinct, got {list(self.seeds)}"))
        if len(self.seeds) > 1 and self.search.sampler.type != "grid":
            issues.append(
                SpecIssue(
                    "seeds",
                    "several seeds need the grid sampler; an optimiser searching over seeds fits noise",
                )
            )
        sched = self.search.scheduler
        if not isinstance(sched, FIFOSpec) and sched.grace_period > self.training.epochs:
            issues.append(
                SpecIssue(
                    "search.scheduler.grace_period",
                    f"grace_period ({sched.grace_period}) exceeds training.epochs ({self.training.epochs})",
                )
            )
        if self.search.sampler.type != "grid" and not self.search.space:
            issues.append(SpecIssue("search.space", f"sampler {self.search.sampler.type!r} needs parameters"))
        issues += metric_issues(
            self.search.metric, self.search.mode, model=self.model, data=self.data, space=self.search.space
        )
        if not issues:
            issues += check_search_space(
                self.search.space,
                self.base_config(),
                sampler=self.search.sampler.type,
                seeds=self.seeds,
            )
        if issues:
            raise SpecError(issues)
        return self

    def base_config(self) -> dict[str, Any]:
        """The trial config every trial starts from (first seed)."""
        return trial_config(self.model, self.data, self.training, self.seeds[0])

    def to_document(self) -> dict[str, Any]:
        """The resolved spec as plain data (what ``spec.yaml`` next to the results holds)."""
        doc: dict[str, Any] = _type_first(self.model_dump(mode="json"))
        return doc

    def to_yaml(self) -> str:
        return dump_yaml(self.to_document())

    def hash(self) -> str:
        return spec_hash(self.to_document())

    def to_plan(self, *, environ: Mapping[str, str] | None = None) -> StudyPlan:
        """The plan ``workers.run_study`` executes.

        Args:
            environ: environment to read ``MLFLOW_TRACKING_URI`` (and the git commit override) from;
                ``os.environ`` by default.
        """
        return build_plan(
            name=self.name,
            base_config=self.base_config(),
            search=self.search,
            seeds=self.seeds,
            resources=self.resources,
            retries=self.retries,
            storage_path=self.storage_path,
            storage=self.storage,
            tracking=self.tracking,
            document=self.to_document(),
            description=self.description,
            hypothesis=self.hypothesis,
            environ=environ,
        )


# --------------------------------------------------------------------------------------------------
# Plan building
# --------------------------------------------------------------------------------------------------

_REPO_ROOT = Path(__file__).resolve().parents[1]
_VERSIONED = ("autonorm-studies", "torch", "ray", "optuna", "mlflow", "pydantic", "numpy")


def spec_hash(document: Mapping[str, Any]) -> str:
    """SHA-256 of the canonical JSON of a resolved spec (key order does not matter)."""
    return hashlib.sha256(json.dumps(document, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def git_commit(environ: Mapping[str, str]) -> str:
    # A Ray job's uploaded working dir has no .git: `autonorm-study submit` passes the commit along.
    if environ.get("AUTONORM_GIT_COMMIT"):
        return environ["AUTONORM_GIT_COMMIT"]
    try:
        out = subprocess.run(
            ["git", "-C", str(_REPO_ROOT), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown"


def _versions() -> list[tuple[str, str]]:
    tags = []
    for pkg in _VERSIONED:
        try:
            tags.append((f"autonorm.version.{pkg}", metadata.version(pkg)))
        except metadata.PackageNotFoundError:
            continue
    return tags


def _is_uri(path: str) -> bool:
    return re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*://", path) is not None


def resolve_storage_path(storage_path: str) -> str:
    """URIs unchanged; local paths made absolute against the current directory (Tune needs that)."""
    if _is_uri(storage_path):
        return storage_path
    return str(Path(storage_path).expanduser().resolve())


def compile_search(
    search: SearchSpec, seeds: Sequence[int]
) -> tuple[tuple[ParamDef, ...], tuple[tuple[str, tuple[Any, ...]], ...]]:
    """The search section as plan dimensions: ``(space, grid)``; exactly one of them is non-empty."""
    if search.sampler.type == "grid":
        grid = [(p.name, tuple(p.choices)) for p in search.space if isinstance(p, CategoricalParam)]
        if len(seeds) > 1:
            grid.append(("seed", tuple(seeds)))
        return (), tuple(grid)
    space = []
    for p in search.space:
        when = tuple(p.when.items())
        if isinstance(p, CategoricalParam):
            space.append(ParamDef(name=p.name, type="categorical", choices=tuple(p.choices), when=when))
        else:
            space.append(
                ParamDef(
                    name=p.name,
                    type=p.type,
                    low=p.low,
                    high=p.high,
                    log=p.log,
                    step=p.step,
                    when=when,
                )
            )
    return tuple(space), ()


def build_plan(
    *,
    name: str,
    base_config: Mapping[str, Any],
    search: SearchSpec,
    document: Mapping[str, Any],
    seeds: Sequence[int] = (0,),
    resources: ResourcesSpec | None = None,
    retries: int = 2,
    storage_path: str = "runs",
    storage: StorageSpec | None = None,
    tracking: TrackingSpec | None = None,
    description: str = "",
    hypothesis: str | None = None,
    extra_tags: Sequence[tuple[str, str]] = (),
    extra_params: Sequence[tuple[str, str]] = (),
    extra_artifacts: Sequence[tuple[str, str]] = (),
    environ: Mapping[str, str] | None = None,
) -> StudyPlan:
    """A :class:`StudyPlan` from validated sections (shared by every study spec).

    Args:
        name: study name: Tune experiment directory and default MLflow experiment.
        base_config: the trial config every trial starts from.
        search: metric/mode, space, sampler, scheduler and budget.
        document: the resolved spec as plain data; hashed, and logged as ``spec.yaml``.
        seeds: several seeds become a grid axis (grid sampler only).
        storage_path: local (made absolute here) or ``s3://`` URI.
        tracking: ``uri`` wins; else ``$MLFLOW_TRACKING_URI``; else None (workers' sqlite default).
        environ: environment to read from (``os.environ`` by default).
    """
    env = os.environ if environ is None else environ
    resources = resources or ResourcesSpec()
    storage = storage or StorageSpec()
    tracking = tracking or TrackingSpec()
    space, grid = compile_search(search, seeds)
    sampler = search.sampler
    scheduler = search.scheduler
    tags: list[tuple[str, str]] = [
        ("autonorm.spec_hash", spec_hash(document)),
        ("autonorm.git_commit", git_commit(env)),
        *_versions(),
    ]
    if description:
        tags.append(("mlflow.note.content", description))
    if hypothesis:
        tags.append(("autonorm.hypothesis", hypothesis))
    tags += list(extra_tags)
    params = [
        ("sampler", sampler.type),
        ("scheduler", scheduler.type),
        ("metric", search.metric),
        ("mode", search.mode),
        *extra_params,
    ]
    return StudyPlan(
        name=name,
        base_config=copy.deepcopy(dict(base_config)),
        space=space,
        grid=grid,
        sampler=SamplerConfig(
            type=sampler.type,
            seed=getattr(sampler, "seed", 0),
            n_startup_trials=getattr(sampler, "n_startup_trials", 10),
        ),
        scheduler=SchedulerConfig(
            type=scheduler.type,
            grace_period=getattr(scheduler, "grace_period", 1),
            reduction_factor=getattr(scheduler, "reduction_factor", 3),
        ),
        metric=search.metric,
        mode=search.mode,
        num_samples=search.num_samples,
        max_concurrent=search.max_concurrent,
        resources=resources.as_plan(),
        retries=retries,
        storage=StorageConfig(
            path=resolve_storage_path(storage_path),
            endpoint_override=storage.endpoint_override,
            region=storage.region,
        ),
        tracking=TrackingConfig(
            uri=tracking.uri or env.get("MLFLOW_TRACKING_URI") or None,
            experiment=tracking.experiment or name,
            artifact_location=tracking.artifact_location,
        ),
        tags=tuple(tags),
        params=tuple(params),
        artifacts=(("spec.yaml", dump_yaml(dict(document))), *extra_artifacts),
    )


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
    model: type[BaseModel] = StudySpec,
    origins: Mapping[_Path, tuple[str | None, int | None]] | None = None,
) -> Any:
    """Validate a plain document against ``model``, turning every failure into one :class:`SpecError`.

    Args:
        document: the merged spec document.
        model: the spec class (``StudySpec`` or another study's spec composed of these sections).
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


def load_spec(
    path: str | os.PathLike[str],
    overrides: Sequence[str] = (),
    preset: str | None = None,
    *,
    model: type[BaseModel] = StudySpec,
) -> Any:
    """Load, layer and validate a study spec.

    Args:
        path: the YAML file.
        overrides: ``dotted.key=value`` strings, applied last (values are YAML: ``3``, ``1e-3``,
            ``[1, 2]``, ``{type: layernorm}``, ``null``).
        preset: name of an entry of the file's top-level ``presets:`` mapping, merged over the file.
        model: the spec class to validate against (``StudySpec`` unless a study composes its own).

    Raises:
        SpecError: with every problem found, each with its field path and YAML line where known.
    """
    doc, origins = layer_document(path, overrides=overrides, preset=preset)
    return validate_spec(doc, model=model, origins=origins)
