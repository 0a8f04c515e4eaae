"""The spec's vocabulary against the core's registries: what validation accepts, the core builds and reports.

Norm, linear, layer, model and data set names; each data set's task; and the metrics ``fit`` reports
per task with their direction (spec validation keeps a torch-free mirror of
``autonorm_core.training.reported_metrics``; a real one-epoch ``fit`` per task checks both).
"""

from __future__ import annotations

import typing
from typing import Any

import pytest
import torch

from autonorm_core.affine import LINEAR_KINDS
from autonorm_core.data import DatasetNotFoundError, Splits, list_datasets, load_dataset
from autonorm_core.models import create_model, list_models
from autonorm_core.models.affine_nets import CNN_LAYERS, MLP_LAYERS
from autonorm_core.norms import list_norms
from autonorm_core.training import TrainConfig, fit
from autonorm_core.training import reported_metrics as core_reported_metrics
from studies.kinds.search.spec import StudySpec
from studies.schema import (
    DATA_TASKS,
    ConvLayerSpec,
    DataSpec,
    LinearSpec,
    MLPLayerSpec,
    ModelSpec,
    NormSpec,
    SpecError,
    metric_issues,
    reported_metrics,
    validate_spec,
)

TASKS = ("classification", "tagging", "regression")
# Keys fit reports that are bookkeeping, not something to select on.
BOOKKEEPING = {"epoch", "lr", "updates", "selector_frozen", "examples_per_s", "tau"}


def _tags(union: Any) -> list[str]:
    """The ``type`` literal of every variant of a discriminated union."""
    variants = typing.get_args(typing.get_args(union)[0])
    return [typing.get_args(v.model_fields["type"].annotation)[0] for v in variants]


def _doc(model: dict[str, Any], data: str = "digits", **extra: Any) -> dict[str, Any]:
    return {
        "name": "registry",
        "model": model,
        "data": {"type": data},
        "training": {"epochs": 2},
        "search": {"space": [{"name": "training.lr", "type": "float", "low": 1e-4, "high": 1e-2}], **extra},
    }


# ---- names --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list_norms())
def test_every_registered_norm_validates_as_model_norm(name: str) -> None:
    spec = validate_spec(
        _doc({"type": "vit_lite", "preset": "tiny", "norm": {"type": name}}), model=StudySpec
    )
    assert spec.model.norm.type == name


def test_every_norm_tag_is_a_registered_norm() -> None:
    assert sorted(_tags(NormSpec)) == list_norms()


def test_linear_tags_are_the_core_linear_kinds() -> None:
    assert sorted(_tags(LinearSpec)) == sorted(LINEAR_KINDS)
    for kind in LINEAR_KINDS:
        spec = validate_spec(
            _doc({"type": "vit_lite", "preset": "tiny", "linear": {"type": kind}}), model=StudySpec
        )
        assert spec.model.linear.type == kind


def test_layer_tags_are_the_core_layer_kinds() -> None:
    # The core has no registry function for layer kinds; its factories' tuples are the contract.
    assert sorted(_tags(MLPLayerSpec)) == sorted(MLP_LAYERS)
    assert sorted(_tags(ConvLayerSpec)) == sorted(CNN_LAYERS)
    for model_type, kinds in (("mlp", MLP_LAYERS), ("cnn", CNN_LAYERS)):
        for kind in kinds:
            spec = validate_spec(
                _doc({"type": model_type, "preset": "tiny", "layer": {"type": kind}}), model=StudySpec
            )
            assert spec.model.layer.type == kind


def test_unknown_norm_is_refused_with_the_registered_names() -> None:
    with pytest.raises(SpecError) as info:
        validate_spec(
            _doc({"type": "vit_lite", "preset": "tiny", "norm": {"type": "batchnorm"}}), model=StudySpec
        )
    (issue,) = info.value.issues
    assert issue.path == "model.norm.type"
    assert all(name in issue.message for name in list_norms())


def test_model_and_data_tags_are_the_core_registries() -> None:
    assert sorted(_tags(ModelSpec)) == list(list_models())
    assert sorted(_tags(DataSpec)) == list(list_datasets())
    # The generic loaders' task comes from the file (data_task), not from a table.
    assert sorted(DATA_TASKS) == sorted(set(list_datasets()) - {"arrays", "table"})
    assert set(DATA_TASKS.values()) == set(TASKS)


# ---- metrics ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("gated", [False, True])
def test_spec_metric_table_mirrors_the_core(task: str, gated: bool) -> None:
    assert reported_metrics(task, gated=gated) == core_reported_metrics(task, gated=gated)


def test_unknown_task_is_refused_by_both() -> None:
    with pytest.raises(ValueError):
        core_reported_metrics("ranking")
    with pytest.raises(ValueError):
        reported_metrics("ranking")


def _synthetic(task: str, name: str) -> Splits:
    """Tiny random splits shaped like ``name``'s (used when its files are not on this machine)."""
    gen = torch.Generator().manual_seed(0)
    n, t, vocab = 24, 7, 30
    x = torch.randint(2, vocab, (n, t), generator=gen)
    y = torch.randint(0, 5, (n, t) if task == "tagging" else (n,), generator=gen)
    parts = [(x[i::3], y[i::3]) for i in range(3)]
    return Splits(
        name=name,
        train=parts[0],
        val=parts[1],
        test=parts[2],
        task=task,  # type: ignore[arg-type]
        num_classes=5,
        input_shape=(t,),
        vocab_size=vocab,
        classes=tuple("abcde"),
    )


FIT_CASES: list[tuple[str, dict[str, Any]]] = [
    ("digits", {"type": "vit_lite", "preset": "tiny", "patch_size": 4, "norm": {"type": "autonorm"}}),
    ("digits", {"type": "mlp", "preset": "tiny"}),
    ("diabetes", {"type": "mlp", "preset": "tiny"}),
    ("diabetes", {"type": "tabular", "preset": "tiny", "norm": {"type": "autonorm"}}),
    ("ptb_pos_sample", {"type": "text_encoder", "preset": "tiny"}),
    ("pang_lee_polarity", {"type": "text_encoder", "preset": "tiny", "pool": "mean"}),
]


@pytest.mark.parametrize(("data", "model"), FIT_CASES, ids=[f"{d}-{m['type']}" for d, m in FIT_CASES])
def test_fit_reports_exactly_the_metrics_validation_knows(data: str, model: dict[str, Any]) -> None:
    metric, mode = ("val_rmse", "min") if DATA_TASKS[data] == "regression" else ("val_accuracy", "max")
    spec = validate_spec(_doc(model, data, metric=metric, mode=mode), model=StudySpec)
    assert isinstance(spec, StudySpec)
    cfg = spec.base_config()
    try:
        splits = load_dataset(data, seed=0, subset=48)
    except DatasetNotFoundError:
        splits = _synthetic(DATA_TASKS[data], data)
    assert splits.task == DATA_TASKS[data]
    model_cfg = dict(cfg["model"])
    kind, preset = model_cfg.pop("type"), model_cfg.pop("preset")
    torch.manual_seed(0)
    net = create_model(kind, splits, preset=preset, **model_cfg)
    train = TrainConfig.from_dict({**cfg["training"], "epochs": 1, "batch_size": 16})
    result = fit(net, splits, train, seed=0)
    assert result.status == "completed", result.message
    keys = set(result.history[-1])
    gated = model.get("norm", {}).get("type") == "autonorm"
    table = reported_metrics(splits.task, gated=gated)
    selectable = {k for k in keys - BOOKKEEPING if "/layer_" not in k}
    assert selectable == set(table)
    # Every reported validation metric is accepted with its direction, and refused with the other.
    for metric, direction in table.items():
        if metric.startswith("test_"):
            continue
        assert metric_issues(metric, direction, model=spec.model, data=spec.data) == []
        wrong = "min" if direction == "max" else "max"
        (issue,) = metric_issues(metric, wrong, model=spec.model, data=spec.data)
        assert issue.path == "search.mode"
    for layer_key in (k for k in keys if k.startswith("gate_entropy/layer_")):
        assert metric_issues(layer_key, "min", model=spec.model, data=spec.data) == []


@pytest.mark.parametrize(
    ("data", "model", "metric", "mode", "path", "fragment"),
    [
        ("digits", {"type": "mlp"}, "val_acuracy", "max", "search.metric", "valid: train_loss, val_accuracy"),
        ("diabetes", {"type": "mlp"}, "val_accuracy", "max", "search.metric", "diabetes (regression)"),
        ("diabetes", {"type": "mlp"}, "val_rmse", "max", "search.mode", "mode must be 'min'"),
        ("digits", {"type": "mlp"}, "gate_entropy", "min", "search.metric", "gate metrics need"),
        (
            "digits",
            {"type": "vit_lite", "norm": {"type": "dyt"}},
            "gate_entropy/layer_0",
            "min",
            "search.metric",
            "gate",
        ),
        ("ptb_pos_sample", {"type": "text_encoder"}, "val_rmse", "min", "search.metric", "(tagging)"),
    ],
)
def test_wrong_metric_is_refused_naming_the_field(
    data: str, model: dict[str, Any], metric: str, mode: str, path: str, fragment: str
) -> None:
    with pytest.raises(SpecError) as info:
        validate_spec(_doc({**model, "preset": "tiny"}, data, metric=metric, mode=mode), model=StudySpec)
    matching = [i for i in info.value.issues if i.path == path and fragment in i.message]
    assert matching, info.value.format()


def test_gate_metric_needs_autonorm_in_every_trial() -> None:
    gated = _doc(
        {"type": "vit_lite", "preset": "tiny", "norm": {"type": "autonorm"}},
        metric="gate_entropy",
        mode="min",
    )
    assert validate_spec(gated, model=StudySpec).search.metric == "gate_entropy"
    gated["search"]["space"].append(
        {"name": "model.norm.type", "type": "categorical", "choices": ["autonorm", "dyt"]}
    )
    with pytest.raises(SpecError) as info:
        validate_spec(gated, model=StudySpec)
    assert any(i.path == "search.metric" for i in info.value.issues)


def test_searched_data_set_needs_the_metric_under_every_choice() -> None:
    doc = _doc({"type": "mlp", "preset": "tiny"}, metric="val_accuracy", mode="max")
    doc["search"]["space"].append(
        {"name": "data.type", "type": "categorical", "choices": ["digits", "diabetes"]}
    )
    with pytest.raises(SpecError) as info:
        validate_spec(doc, model=StudySpec)
    assert any(i.path == "search.metric" and "diabetes and digits" in i.message for i in info.value.issues)


def test_spec_and_core_training_defaults_agree() -> None:
    """One source per setting: every field the spec and the core config share has one default."""
    import dataclasses

    from autonorm_core.training import GateFreeze, TrainConfig
    from studies.schema import FreezeSpec, TrainingSpec

    for spec_cls, core_cls in ((TrainingSpec, TrainConfig), (FreezeSpec, GateFreeze)):
        core = {
            f.name: f.default for f in dataclasses.fields(core_cls) if f.default is not dataclasses.MISSING
        }
        shared = set(core) & set(spec_cls.model_fields)
        assert shared, spec_cls
        for name in sorted(shared):
            if name == "freeze":
                continue  # a nested section, compared as FreezeSpec vs GateFreeze
            assert spec_cls.model_fields[name].default == core[name], f"{spec_cls.__name__}.{name}"


def test_noise_after_freezing_has_one_setting() -> None:
    from studies.schema import AutoNormSpec, FreezeSpec

    assert "sample_after_freeze" not in AutoNormSpec.model_fields
    assert "sample_after_freeze" in FreezeSpec.model_fields
