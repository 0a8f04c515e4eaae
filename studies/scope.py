"""What a verdict was decided on: its scope.

A ``refuted`` on 1,150 rows of digits with a 64×64 MLP after 5 epochs on a CPU is not a refutation of
a paper that trained on CIFAR-10. Every kind's ``verdict.json`` therefore carries a top-level
``scope``, built here from the confirmatory trials' configs and their results table:

``{"data": {"name", "rows": {"train", "val", "test"}, "fingerprint"},
"model": {"type", "preset", "params", "params_range", "name"}, "budget": {"epochs", "updates"},
"batch_sizes", "seeds", "device", "precision", "metric", "arms": {arm: mean final metric}}``

:func:`scope_line` says it in one line (printed under the verdict by ``run`` and ``report`` and the
report's second line) and :func:`scope_tags` puts it on the study's MLflow run as
``autonorm.scope.data`` / ``.model`` / ``.budget``. Building a scope loads the data set once and
builds each distinct model once, on the CPU: seconds for the shipped presets. A data set that cannot
be loaded here (a results directory read on another machine) leaves ``rows`` and ``fingerprint``
``None`` and the rest as it is.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["SCOPE_TAGS", "execution_lines", "execution_record", "scope_line", "scope_tags", "study_scope"]

#: The study run's tags that carry the scope (one line each).
SCOPE_TAGS = ("autonorm.scope.data", "autonorm.scope.model", "autonorm.scope.budget")

_MODEL_NAMES = {"mlp": "MLP", "cnn": "CNN", "vit_lite": "ViT-Lite", "text_encoder": "text encoder"}


def _one_or_many(values: Iterable[Any]) -> Any:
    """``None`` for no value, the value when all agree, else the sorted distinct values."""
    distinct = sorted({v for v in values if v is not None})
    if not distinct:
        return None
    return distinct[0] if len(distinct) == 1 else distinct


def _rows(splits: Any) -> dict[str, int]:
    return {part: int(getattr(splits, part)[1].shape[0]) for part in ("train", "val", "test")}


def _model_description(model_type: str, preset: str, config: Any) -> str:
    """``MLP 64×64``, ``CNN tiny``, ``ViT-Lite paper``: what a reader calls the model."""
    name = _MODEL_NAMES.get(model_type, model_type)
    hidden = getattr(config, "hidden", None)
    if model_type == "mlp" and hidden:
        return f"{name} {'×'.join(str(int(h)) for h in hidden)}"
    return f"{name} {preset}"


def _seed_first(config: Mapping[str, Any]) -> tuple[int, int, str]:
    """Sort key: integral seeds first, smallest first; then the config's JSON (a total order)."""
    seed = config.get("seed")
    text = json.dumps(config, sort_keys=True, default=str)
    if isinstance(seed, int) and not isinstance(seed, bool):
        return (0, seed, text)
    return (1, 0, text)


def _data_and_models(configs: Sequence[Mapping[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The data set's rows and fingerprint, and the models' type, preset, description and parameter
    counts (each distinct ``model`` section built once on the CPU)."""
    # The data (and, for text, the vocabulary and so the embedding's size) depends on the seed's
    # split: the configs' smallest seed decides, whatever order the trials were read in.
    first = min(configs, key=_seed_first)
    data = dict(first.get("data") or {})
    model = dict(first.get("model") or {})
    data_doc: dict[str, Any] = {"name": str(data.get("type")), "rows": None, "fingerprint": None}
    model_doc: dict[str, Any] = {
        "type": str(model.get("type")),
        "preset": str(model.get("preset", "paper")),
        "params": None,
        "params_range": None,
        "name": _MODEL_NAMES.get(str(model.get("type")), str(model.get("type"))),
    }
    try:
        from studies.calibration import load_trial_data

        splits, _ = load_trial_data(first, "cpu")
    except Exception:  # no data here: the rest of the scope stands
        return data_doc, model_doc
    data_doc["rows"] = _rows(splits)
    try:
        from studies.provenance import data_files, data_fingerprint

        data_doc["fingerprint"] = data_fingerprint(data_files(data))
    except Exception:
        pass
    import torch

    from autonorm_core.models import create_model

    counts: list[int] = []
    described = ""
    for text in sorted({json.dumps(c.get("model") or {}, sort_keys=True, default=str) for c in configs}):
        section = json.loads(text)
        kind, preset = str(section.pop("type")), str(section.pop("preset", "paper"))
        try:
            with torch.random.fork_rng(devices=[]):
                net = create_model(kind, splits, preset=preset, **section)
        except Exception:
            continue
        counts.append(sum(p.numel() for p in net.parameters()))
        described = described or _model_description(kind, preset, getattr(net, "config", None))
    if counts:
        model_doc["params"] = max(counts)
        model_doc["params_range"] = [min(counts), max(counts)]
        model_doc["name"] = described
    return data_doc, model_doc


def _arm_means(table: Any, metric: str) -> dict[str, float]:
    if table is None or not len(table) or "arm" not in table.columns or metric not in table.columns:
        return {}
    means = table.groupby("arm")[metric].mean()
    return {
        str(arm): float(v) for arm, v in sorted(means.items()) if isinstance(v, float) and math.isfinite(v)
    }


def study_scope(
    configs: Sequence[Mapping[str, Any]],
    table: Any,
    *,
    metric: str,
    gpu_hours: float = 0.0,
) -> dict[str, Any]:
    """The ``scope`` of a verdict decided on the trials of ``configs`` (the confirmatory phases'
    trial configs) whose results are ``table`` (one row per trial: ``arm``, ``seed``, ``metric``; a
    DataFrame or a list of dictionaries).

    ``device`` is ``GPU`` when the study spent GPU hours, else ``CPU``; ``seeds`` counts the seeds
    in ``table`` (those used, which a sequential design may stop short of the configs' seeds)."""
    if not configs:
        return {}
    if table is not None and not hasattr(table, "columns"):  # rows as dictionaries
        import pandas as pd

        table = pd.DataFrame(list(table))
    data, model = _data_and_models(configs)
    training = [dict(c.get("training") or {}) for c in configs]
    by_epochs = [t for t in training if t.get("budget", "epochs") == "epochs"]
    seeds = (
        sorted({int(s) for s in table["seed"]})
        if table is not None and len(table) and "seed" in table.columns
        else sorted({int(c["seed"]) for c in configs if "seed" in c})
    )
    return {
        "data": data,
        "model": model,
        "budget": {
            "epochs": _one_or_many(t.get("epochs") for t in by_epochs),
            "updates": _one_or_many(t.get("max_updates") for t in training if t.get("budget") == "updates"),
        },
        "batch_sizes": sorted({int(t["batch_size"]) for t in training if t.get("batch_size") is not None}),
        "seeds": len(seeds),
        "device": "GPU" if isinstance(gpu_hours, int | float) and gpu_hours > 0 else "CPU",
        "precision": str(_one_or_many(t.get("precision", "fp32") for t in training) or "fp32"),
        "metric": metric,
        "arms": _arm_means(table, metric),
    }


def _thousands(n: int) -> str:
    return f"{n / 1000:.0f} k" if n >= 10_000 else f"{n / 1000:.1f} k" if n >= 1000 else str(n)


def _budget_text(budget: Mapping[str, Any]) -> str:
    parts = []
    for key, unit in (("epochs", "epochs"), ("updates", "updates")):
        value = budget.get(key)
        if value is None:
            continue
        text = "/".join(str(v) for v in value) if isinstance(value, list) else str(value)
        parts.append(f"{text} {unit.removesuffix('s') if value == 1 else unit}")
    return " or ".join(parts) if parts else "budget unknown"


def _data_text(data: Mapping[str, Any]) -> str:
    rows = data.get("rows") or {}
    train = rows.get("train")
    return f"{data.get('name')}, {train:,} train rows" if isinstance(train, int) else str(data.get("name"))


def _model_text(model: Mapping[str, Any]) -> str:
    lo_hi = model.get("params_range")
    if isinstance(lo_hi, list) and len(lo_hi) == 2:
        lo, hi = (_thousands(int(x)) for x in lo_hi)
        count = lo if lo == hi else f"{lo.removesuffix(' k')}–{hi}"
        return f"{model.get('name')} ({count} params)"
    return str(model.get("name"))


def scope_line(scope: Mapping[str, Any] | None) -> str:
    """One line: ``on digits, 1,150 train rows, MLP 64×64 (5.1 k params), 5 epochs, batch sizes
    8/16/32, 10 seeds, CPU fp32; mean test_accuracy per arm 0.91–0.96`` (empty without a scope).
    The range is of the arms' means over their trials (``scope["arms"]``), not of single trials."""
    if not scope:
        return ""
    seeds = scope.get("seeds")
    text = (
        f"on {_data_text(scope.get('data') or {})}, {_model_text(scope.get('model') or {})}, "
        f"{_budget_text(scope.get('budget') or {})}, batch sizes "
        f"{'/'.join(str(b) for b in scope.get('batch_sizes') or []) or '?'}, "
        f"{seeds} seed{'' if seeds == 1 else 's'}, {scope.get('device')} {scope.get('precision')}"
    )
    arms = [v for v in (scope.get("arms") or {}).values() if isinstance(v, int | float)]
    if len(arms) == 1:
        text += f"; mean {scope.get('metric')} of the one arm {arms[0]:.2f}"
    elif arms:
        text += f"; mean {scope.get('metric')} per arm {min(arms):.2f}–{max(arms):.2f}"
    return text


def scope_tags(scope: Mapping[str, Any] | None) -> dict[str, str]:
    """The study run's ``autonorm.scope.*`` tags (none without a scope)."""
    if not scope:
        return {}
    data, model, budget = (scope.get(k) or {} for k in ("data", "model", "budget"))
    return dict(
        zip(
            SCOPE_TAGS,
            (
                _data_text(data)
                + (f" (sha256 {str(data['fingerprint'])[:12]})" if data.get("fingerprint") else ""),
                _model_text(model),
                _budget_text(budget),
            ),
            strict=True,
        )
    )


# ---------------------------------------------------------------------------------------- execution


def execution_record(stack: Any, arm_configs: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """``verdict.json``'s ``execution``: how the trials were trained. ``stack`` is the spec's
    ``execution.stack`` (``auto``, ``off`` or N); ``arm_configs`` one trial config per arm.

    ``{"stack": "auto", "not_stacked": {arm: reason}}``: under a stacking mode, the arms whose members
    train as separate fits in their group's process (:func:`autonorm_core.stacking.stackable`'s
    reason, the one ``fit_stacked`` falls back on; ``plan`` lists the same). Empty under ``off``."""
    mode = str(stack)
    if mode == "off":
        return {"stack": mode, "not_stacked": {}}
    from autonorm_core.stacking import stackable

    reasons: dict[str, str] = {}
    for arm, config in arm_configs.items():
        ok, why = stackable(dict(config))
        if not ok:
            reasons[str(arm)] = why or "no stacked form"
    return {"stack": mode, "not_stacked": reasons}


def execution_lines(record: Mapping[str, Any] | None) -> list[str]:
    """The report's lines for an :func:`execution_record` (none for a verdict written without one)."""
    if not record:
        return []
    mode = str(record.get("stack"))
    if mode == "off":
        return ["training: one process per trial (execution.stack: off)"]
    lines = [f"training: each cell's members stacked in one process (execution.stack: {mode})"]
    lines += [f"not stacked: {arm}: {why}" for arm, why in sorted((record.get("not_stacked") or {}).items())]
    return lines
