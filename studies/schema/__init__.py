"""Study specs: the YAML a researcher writes, validated once at the boundary into a frozen pydantic model.

The shared machinery every study kind uses, one job per module:

* :mod:`studies.schema.errors` — :class:`SpecIssue` / :class:`SpecError` (field path, message, YAML line);
* :mod:`studies.schema.reading` — safe YAML reading with line numbers and limits;
* :mod:`studies.schema.sections` — the shared sections (model, data, training, search space, resources,
  tracking, storage) a kind's spec class composes;
* :mod:`studies.schema.space` — search-space checks against the trial sections;
* :mod:`studies.schema.plan` — a :class:`workers.plan.StudyPlan` from sections, provenance tags;
* :mod:`studies.schema.arms` — what the kinds with layer arms share (:class:`~studies.schema.arms.ArmStudySpec`);
* :mod:`studies.schema.loading` — layering (defaults → file → preset → ``--set``) and validation;
* :mod:`studies.schema.urls` — the URL-like fields (storage path, tracking URI, endpoints), redaction.

Layering, lowest to highest: pydantic defaults → the YAML file → a named preset from the file's
top-level ``presets:`` mapping → ``--set dotted.key=value`` overrides (values parsed as YAML). Every
problem is collected into one :class:`SpecError`, so the CLI prints all of them and exits 2 without a
traceback. Paths use dots for mapping keys *and* list indices (``search.space.2.high``), the same
syntax ``--set`` accepts.

A kind's spec class lives in its own folder (``studies/kinds/<kind>/spec.py``); the kinds sit above
this package.
"""

from __future__ import annotations

from studies.schema.errors import (
    MAX_SHOWN_ISSUES,
    SpecError,
    SpecIssue,
)
from studies.schema.execution import ExecutionSpec
from studies.schema.loading import (
    layer_document,
    load_spec,
    read_spec_text,
    stored_defaults_missing,
    url_field_issues,
    validate_spec,
)
from studies.schema.metrics import metric_issues, reported_metrics
from studies.schema.plan import (
    build_plan,
    compile_search,
    git_commit,
    plan_settings,
    resolve_storage_path,
    spec_hash,
)
from studies.schema.reading import (
    MAX_YAML_BYTES,
    MAX_YAML_DEPTH,
    MAX_YAML_NODES,
    MAX_YAML_WRITTEN,
    dump_yaml,
    parse_yaml,
)
from studies.schema.sampling import (
    Asha,
    CategoricalParam,
    FIFOSpec,
    FloatParam,
    GridSpec,
    IntParam,
    ParamSpec,
    SamplerSpec,
    SchedulerSpec,
    SearchSpec,
    TPESpec,
)
from studies.schema.sections import (
    DATA_TASKS,
    LN2,
    AdaNormSpec,
    ArraysDataSpec,
    AutoNormSpec,
    CNNSpec,
    ConvLayerSpec,
    CorrectedLinearSpec,
    DataSpec,
    DyTSpec,
    FiLMSpec,
    FreezeSpec,
    LayerNormSpec,
    LinearSpec,
    MLPLayerSpec,
    MLPSpec,
    ModelSpec,
    NonNegInt,
    NormSpec,
    PosFloat,
    PosInt,
    ResourcesSpec,
    RMSNormSpec,
    Seed,
    StorageSpec,
    TableDataSpec,
    TrackingSpec,
    TrainingSpec,
    TrialSections,
    ViTLiteSpec,
    data_classes,
    data_task,
    trial_config,
)
from studies.schema.space import (
    check_search_space,
)
from studies.schema.urls import (
    ArtifactLocation,
    EndpointURL,
    StoragePath,
    TrackingURI,
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
    "ArraysDataSpec",
    "ArtifactLocation",
    "Asha",
    "AutoNormSpec",
    "CNNSpec",
    "CategoricalParam",
    "ConvLayerSpec",
    "CorrectedLinearSpec",
    "DataSpec",
    "DyTSpec",
    "EndpointURL",
    "ExecutionSpec",
    "FIFOSpec",
    "FiLMSpec",
    "FloatParam",
    "FreezeSpec",
    "GridSpec",
    "IntParam",
    "LayerNormSpec",
    "LinearSpec",
    "MLPLayerSpec",
    "MLPSpec",
    "ModelSpec",
    "NonNegInt",
    "NormSpec",
    "ParamSpec",
    "PosFloat",
    "PosInt",
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
    "TPESpec",
    "TableDataSpec",
    "TrackingSpec",
    "TrackingURI",
    "TrainingSpec",
    "TrialSections",
    "ViTLiteSpec",
    "build_plan",
    "check_search_space",
    "compile_search",
    "data_classes",
    "data_task",
    "dump_yaml",
    "git_commit",
    "layer_document",
    "load_spec",
    "metric_issues",
    "parse_yaml",
    "plan_settings",
    "read_spec_text",
    "reported_metrics",
    "resolve_storage_path",
    "spec_hash",
    "stored_defaults_missing",
    "trial_config",
    "url_field_issues",
    "validate_spec",
]
