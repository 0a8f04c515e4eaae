"""Study specs: layering, line-numbered errors, the broken-spec corpus, search-space checks, plans."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from studies import schema as spec_mod
from studies.kinds import load_study
from studies.kinds.search.spec import StudySpec
from studies.schema import (
    LN2,
    SpecError,
    SpecIssue,
    TrialSections,
    check_search_space,
    load_spec,
    parse_yaml,
    spec_hash,
    validate_spec,
)
from studies.schema import space as spec_space
from tests.studies.broken_cases import BrokenCase, load_cases
from workers.dotted import set_path

SHIPPED = Path(__file__).resolve().parents[2] / "studies" / "specs" / "autonorm_search.yaml"
CASES = load_cases()

MINIMAL = """\
name: mini
model: {type: vit_lite, preset: tiny, norm: {type: autonorm}}
data: {type: digits}
training: {epochs: 4}
search:
  space:
    - {name: training.lr, type: float, low: 1e-4, high: 1e-2, log: true}
"""


def _write(tmp_path: Path, text: str, name: str = "spec.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _issues(path: Path, overrides: tuple[str, ...] = (), preset: str | None = None) -> list[SpecIssue]:
    with pytest.raises(SpecError) as info:
        load_spec(path, overrides, preset=preset, model=StudySpec)  # the corpus is of search specs
    return list(info.value.issues)


# ---- the broken-spec corpus ------------------------------------------------------------------------


def test_corpus_is_large_enough() -> None:
    assert len(CASES) >= 30
    assert len({c.expect_path for c in CASES}) >= 25  # many different fields, not one error 30 times


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_broken_spec_reports_field_path(case: BrokenCase) -> None:
    issues = _issues(case.path, case.overrides, case.preset)
    want = "" if case.expect_path == "<document>" else case.expect_path
    matching = [i for i in issues if i.path == want and case.expect_message in i.message]
    assert matching, f"expected {case.expect_path}: {case.expect_message!r}, got {issues}"
    issue = matching[0]
    if case.expect_line is not None:
        assert issue.line == case.expect_line
    if case.expect_source is not None:
        assert issue.source == case.expect_source
    formatted = issue.format()
    assert (case.expect_path if want else "<document>") in formatted


def test_all_field_errors_are_reported_at_once(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        """\
name: many
model: {type: vit_lite, norm: {type: autonorm, tau: -1}}
data: {type: digits, val_fraction: 2}
training: {lr: 0, epochs: 0}
resources: {gpu: -0.5}
""",
    )
    paths = {i.path: i.line for i in _issues(path)}
    assert paths == {
        "model.norm.tau": 2,
        "data.val_fraction": 3,
        "training.lr": 4,
        "training.epochs": 4,
        "resources.gpu": 5,
    }


# ---- YAML ------------------------------------------------------------------------------------------


def test_parse_yaml_line_map_covers_nested_keys_and_list_items() -> None:
    doc, lines = parse_yaml("a:\n  b: 1\n  c:\n    - x\n    - {d: 2}\n")
    assert doc == {"a": {"b": 1, "c": ["x", {"d": 2}]}}
    assert lines[("a",)] == 1
    assert lines[("a", "b")] == 2
    assert lines[("a", "c", 0)] == 4
    assert lines[("a", "c", 1, "d")] == 5


def test_exponent_without_dot_is_a_float() -> None:
    # PyYAML's YAML 1.1 resolver reads `1e-3` as a string; a spec must read it as a number.
    doc, _ = parse_yaml("a: 1e-3\nb: -2E+2\nc: 1.5\nd: '1e-3'\ne: 10\n")
    assert doc == {"a": 1e-3, "b": -200.0, "c": 1.5, "d": "1e-3", "e": 10}
    assert isinstance(doc["e"], int)


def test_python_tags_never_execute(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    path = _write(tmp_path, f'name: !!python/object/apply:os.system ["touch {marker}"]\n')
    issues = _issues(path)
    assert issues[0].path == "name"
    assert not marker.exists()


def test_unreadable_file_is_a_spec_error(tmp_path: Path) -> None:
    issues = _issues(tmp_path / "missing.yaml")
    assert "cannot read the spec" in issues[0].message


# ---- layering -------------------------------------------------------------------------------------


LAYERED = MINIMAL.replace("training: {epochs: 4}", "training: {epochs: 20}") + (
    "presets:\n  quick:\n    training: {epochs: 3}\n    search.space.0.high: 0.05\n"
)


def test_layering_defaults_yaml_preset_set(tmp_path: Path) -> None:
    path = _write(tmp_path, LAYERED)
    plain = load_study(path)
    assert plain.training.epochs == 20  # YAML over default (20 happens to be the default too: check another)
    assert plain.training.batch_size == 64  # default, not in the YAML
    quick = load_study(path, preset="quick")
    assert quick.training.epochs == 3  # preset over YAML
    assert quick.search.space[0].high == 0.05  # a dotted preset key edits one list item
    assert quick.search.space[0].low == 1e-4  # ... and leaves its siblings alone
    top = load_study(path, ["training.epochs=7", "training.batch_size=32"], preset="quick")
    assert (top.training.epochs, top.training.batch_size) == (7, 32)  # --set over preset


def test_set_values_are_yaml(tmp_path: Path) -> None:
    path = _write(tmp_path, MINIMAL)
    spec = load_study(
        path,
        [
            "model.norm={type: layernorm}",
            "training.lr=3e-4",
            "training.grad_clip=null",
            "search.space.0.high=0.1",
            "storage_path=/data/runs",
        ],
    )
    assert spec.model.norm.type == "layernorm"
    assert spec.training.lr == pytest.approx(3e-4)
    assert spec.training.grad_clip is None
    assert spec.search.space[0].high == pytest.approx(0.1)
    assert spec.storage_path == "/data/runs"


def test_set_error_is_attributed_to_the_override(tmp_path: Path) -> None:
    path = _write(tmp_path, MINIMAL)
    issues = _issues(path, ("training.epochs=0",))
    assert issues[0].path == "training.epochs"
    assert issues[0].source == "--set training.epochs=0"
    assert issues[0].line is None


def test_preset_error_points_at_the_preset_line(tmp_path: Path) -> None:
    path = _write(tmp_path, MINIMAL + "presets:\n  bad:\n    training:\n      lr: -1\n")
    issue = _issues(path, preset="bad")[0]
    assert (issue.path, issue.line) == ("training.lr", 11)
    assert issue.source is not None and "(preset bad)" in issue.source


def test_malformed_override_is_rejected(tmp_path: Path) -> None:
    path = _write(tmp_path, MINIMAL)
    for bad in ("training.epochs", "=3", "training..epochs=3"):
        issues = _issues(path, (bad,))
        assert "dotted.key=value" in issues[0].message


# ---- the shipped spec --------------------------------------------------------------------------------


def test_shipped_spec_searches_what_the_protocol_names() -> None:
    spec = load_study(SHIPPED)
    params = {p.name: p for p in spec.search.space}
    t = params["training.freeze.t_freeze"]
    assert (t.type, t.low, t.high) == ("int", 1, spec.training.epochs)
    eps = params["training.freeze.eps_h"]
    assert eps.low == 0 and LN2 - 0.01 < eps.high <= LN2
    tau = params["model.norm.tau"]
    assert (tau.low, tau.high, tau.log) == (0.1, 5.0, True)
    assert set(params["training.freeze.rule"].choices) == {"freeze_if_high", "freeze_if_low", "always"}
    assert set(params["model.linear.type"].choices) == {"linear", "prenorm_l2", "prenorm_rms", "corrected"}
    assert params["model.linear.beta"].when == {"model.linear.type": "corrected"}
    assert params["training.lr"].log
    assert spec.search.sampler.type == "tpe"
    assert spec.model.norm.type == "autonorm"


def test_smoke_preset_is_small() -> None:
    spec = load_study(SHIPPED, preset="smoke")
    assert spec.model.type == "vit_lite" and spec.model.preset == "tiny"
    assert spec.data.type == "digits"
    assert spec.training.epochs <= 5
    assert 4 <= spec.search.num_samples <= 6
    assert spec.search.max_concurrent == 2
    assert spec.resources.gpu == 0
    t = next(p for p in spec.search.space if p.name == "training.freeze.t_freeze")
    assert t.high == spec.training.epochs  # still 1..epochs after the preset shrank epochs


def _sample_trial(spec: StudySpec, rng: random.Random) -> dict[str, Any]:
    """What workers do: sample each active parameter in order and write it at its dotted path."""
    cfg = spec.base_config()
    values: dict[str, Any] = {}
    for p in spec.search.space:
        if any(values.get(k) != v for k, v in p.when.items()):
            continue
        if p.type == "categorical":
            v = rng.choice(p.choices)
        elif p.log:
            v = math.exp(rng.uniform(math.log(p.low), math.log(p.high)))
        else:
            v = rng.uniform(p.low, p.high)
        if p.type == "int":
            v = min(int(p.high), max(int(p.low), round(v)))
        values[p.name] = v
        set_path(cfg, p.name, v)
    return cfg


@pytest.mark.parametrize("preset", [None, "smoke"])
def test_every_sampled_trial_of_the_shipped_space_is_valid(preset: str | None) -> None:
    spec = load_study(SHIPPED, preset=preset)
    rng = random.Random(0)
    seen_types = set()
    for _ in range(200):
        cfg = _sample_trial(spec, rng)
        sections = TrialSections.model_validate(cfg)
        assert isinstance(sections.model, spec_mod.ViTLiteSpec)
        seen_types.add(sections.model.linear.type)
        assert ("beta" in cfg["model"]["linear"]) == (cfg["model"]["linear"]["type"] == "corrected")
    assert seen_types == {"linear", "prenorm_l2", "prenorm_rms", "corrected"}


# ---- search-space checks ----------------------------------------------------------------------------


def test_conditional_parameter_is_checked_under_its_condition(tmp_path: Path) -> None:
    base = MINIMAL.replace(
        "    - {name: training.lr, type: float, low: 1e-4, high: 1e-2, log: true}\n",
        "    - {name: model.linear.type, type: categorical, choices: [linear, corrected]}\n"
        "    - {name: model.linear.beta, type: float, low: 0.1, high: 4.0, when: {model.linear.type: corrected}}\n",
    )
    spec = load_study(_write(tmp_path, base))
    assert spec.search.space[1].when == {"model.linear.type": "corrected"}
    # beta itself is range-checked with the condition applied: 0 is not a valid beta
    issues = _issues(_write(tmp_path, base.replace("low: 0.1, high: 4.0", "low: 0.0, high: 4.0"), "b.yaml"))
    assert [i.path for i in issues] == ["search.space.1.low"]
    assert "model.linear.beta" in issues[0].message


def test_base_with_variant_fields_cannot_switch_variant(tmp_path: Path) -> None:
    # workers set model.linear.type on the base dict; a base `corrected` keeps its beta → invalid `linear`
    text = MINIMAL.replace(
        "norm: {type: autonorm}}", "norm: {type: autonorm}, linear: {type: corrected, beta: 2}}"
    )
    text = text.replace(
        "    - {name: training.lr, type: float, low: 1e-4, high: 1e-2, log: true}\n",
        "    - {name: model.linear.type, type: categorical, choices: [corrected, linear]}\n",
    )
    issues = _issues(_write(tmp_path, text))
    assert [i.path for i in issues] == ["search.space.0.choices.1"]
    assert "keeps the base model.linear's fields beta, which type 'linear' does not have" in issues[0].message


def test_switching_a_resolved_norm_variant_names_every_leftover_field(tmp_path: Path) -> None:
    text = MINIMAL.replace("training: {epochs: 4}", "training: {epochs: 4}").replace(
        "    - {name: training.lr, type: float, low: 1e-4, high: 1e-2, log: true}\n",
        "    - {name: model.norm.type, type: categorical, choices: [autonorm, layernorm]}\n",
    )
    issues = _issues(_write(tmp_path, text))
    assert [i.path for i in issues] == ["search.space.0.choices.1"]  # one issue per choice, not per field
    for name in ("candidates", "tau", "hard", "eval_mode"):
        assert name in issues[0].message


def test_check_search_space_is_reusable_with_sections() -> None:
    spec = load_study(SHIPPED, preset="smoke")
    base = spec.base_config()
    good = check_search_space(spec.search.space, base)
    assert good == []
    bad_base = {**base, "training": {**base["training"], "epochs": 2}}
    issues = check_search_space(spec.search.space, bad_base, prefix="custom")
    assert [i.path for i in issues] == ["custom.0.high"]  # t_freeze up to 3 but only 2 epochs


def test_seed_is_a_valid_search_name() -> None:
    spec = load_study(SHIPPED, preset="smoke")
    from studies.schema import CategoricalParam

    assert check_search_space([CategoricalParam(name="seed", choices=(0, 1))], spec.base_config()) == []
    issues = check_search_space([CategoricalParam(name="seed", choices=(-1,))], spec.base_config())
    assert issues and issues[0].path == "search.space.0.choices.0"


# ---- the model ---------------------------------------------------------------------------------------


def test_spec_is_frozen() -> None:
    spec = load_study(SHIPPED)
    with pytest.raises(ValidationError):
        spec.training.lr = 1.0  # type: ignore[misc]


def test_variants_carry_only_their_own_fields() -> None:
    spec = load_study(SHIPPED)
    linear = spec.model.linear
    assert set(type(linear).model_fields) == {"type"}
    from studies.schema import CorrectedLinearSpec

    assert set(CorrectedLinearSpec.model_fields) == {"type", "beta"}


def test_resolved_yaml_round_trips(tmp_path: Path) -> None:
    spec = load_study(SHIPPED, preset="smoke")
    again = load_study(_write(tmp_path, spec.to_yaml()))
    assert again == spec
    assert again.hash() == spec.hash()


def test_spec_hash_ignores_key_order_and_tracks_values() -> None:
    a = {"x": 1, "y": {"b": 2, "a": 3}}
    b = {"y": {"a": 3, "b": 2}, "x": 1}
    assert spec_hash(a) == spec_hash(b)
    assert spec_hash(a) != spec_hash({**a, "x": 2})


def test_validate_spec_accepts_documents() -> None:
    doc, _ = parse_yaml(MINIMAL)
    spec = validate_spec(doc, model=StudySpec)
    assert isinstance(spec, StudySpec) and spec.name == "mini"
    with pytest.raises(SpecError) as info:
        validate_spec({**doc, "retries": -3}, model=StudySpec)
    assert info.value.issues[0].path == "retries"


# ---- to_plan -----------------------------------------------------------------------------------------


def test_plan_fields_follow_the_spec(tmp_path: Path) -> None:
    spec = load_study(
        SHIPPED, preset="smoke", overrides=[f"storage_path={tmp_path}/runs", "resources.gpu=0.25"]
    )
    plan = spec.to_plan(environ={"AUTONORM_GIT_COMMIT": "abc123"})
    assert plan.name == "autonorm_search"
    assert plan.metric == "val_accuracy" and plan.mode == "max"
    assert plan.num_samples == spec.search.num_samples and plan.max_concurrent == 2
    assert dict(plan.resources) == {"cpu": 1.0, "gpu": 0.25}
    assert plan.retries == spec.retries
    assert plan.storage.path == f"{tmp_path}/runs"
    assert plan.base_config["model"]["norm"]["type"] == "autonorm"
    assert "depth" not in plan.base_config["model"]  # unset sizes leave the preset's value
    assert plan.base_config["seed"] == 0
    beta = next(p for p in plan.space if p.name == "model.linear.beta")
    assert beta.when == (("model.linear.type", "corrected"),) and beta.log
    tags = dict(plan.tags)
    assert tags["autonorm.spec_hash"] == spec.hash()
    assert tags["autonorm.git_commit"] == "abc123"
    assert "autonorm.version.ray" in tags and "autonorm.version.pydantic" in tags
    artifacts = dict(plan.artifacts)
    again = load_study(_write(tmp_path, artifacts["spec.yaml"]))
    assert again.hash() == spec.hash()


def test_tracking_uri_precedence(tmp_path: Path) -> None:
    spec = load_study(SHIPPED, preset="smoke")
    assert spec.to_plan(environ={}).tracking.uri is None  # workers' sqlite default
    assert spec.to_plan(environ={"MLFLOW_TRACKING_URI": "http://127.0.0.1:5999"}).tracking.uri == (
        "http://127.0.0.1:5999"
    )
    explicit = load_study(SHIPPED, ["tracking.uri=http://mlflow:5000"], preset="smoke")
    plan = explicit.to_plan(environ={"MLFLOW_TRACKING_URI": "http://127.0.0.1:5999"})
    assert plan.tracking.uri == "http://mlflow:5000"
    assert plan.tracking.experiment == "autonorm_search"


def test_relative_storage_becomes_absolute_and_uris_stay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    spec = load_study(SHIPPED, preset="smoke")
    assert spec.to_plan(environ={}).storage.path == str(tmp_path / "runs")
    s3 = load_study(SHIPPED, ["storage_path=s3://bucket/studies"], preset="smoke")
    assert s3.to_plan(environ={}).storage.path == "s3://bucket/studies"


def test_grid_sampler_compiles_to_grid_with_seed_axis(tmp_path: Path) -> None:
    text = MINIMAL.replace(
        "search:\n  space:\n    - {name: training.lr, type: float, low: 1e-4, high: 1e-2, log: true}\n",
        "seeds: [0, 1, 2]\nsearch:\n  sampler: {type: grid}\n  num_samples: 1\n  space:\n"
        "    - {name: model.linear.type, type: categorical, choices: [linear, prenorm_l2]}\n"
        "    - {name: training.batch_size, type: categorical, choices: [32, 64]}\n",
    )
    plan = load_study(_write(tmp_path, text)).to_plan(environ={})
    assert plan.space == ()
    assert dict(plan.grid) == {
        "model.linear.type": ("linear", "prenorm_l2"),
        "training.batch_size": (32, 64),
        "seed": (0, 1, 2),
    }
    assert plan.sampler.type == "grid"


def test_build_plan_from_sections() -> None:
    from studies.schema import FloatParam, ResourcesSpec, SearchSpec, TPESpec, build_plan

    spec = load_study(SHIPPED, preset="smoke")
    search = SearchSpec(
        space=(FloatParam(name="training.lr", low=1e-4, high=1e-2, log=True),), sampler=TPESpec(seed=3)
    )
    plan = build_plan(
        name="composed",
        base_config=spec.base_config(),
        search=search,
        document={"name": "composed"},
        resources=ResourcesSpec(cpu=2, gpu=0.5),
        extra_tags=(("autonorm.phase", "tuning"),),
        environ={"MLFLOW_TRACKING_URI": "http://x:1"},
    )
    assert plan.sampler.seed == 3
    assert plan.tracking.uri == "http://x:1" and plan.tracking.experiment == "composed"
    assert dict(plan.tags)["autonorm.phase"] == "tuning"
    assert dict(plan.resources) == {"cpu": 2.0, "gpu": 0.5}


def test_public_names_used_by_other_specs_exist() -> None:
    for name in (
        "ModelSpec",
        "DataSpec",
        "TrainingSpec",
        "TrackingSpec",
        "StorageSpec",
        "ResourcesSpec",
        "SearchSpec",
        "TrialSections",
        "build_plan",
        "check_search_space",
        "SpecError",
        "SpecIssue",
        "load_spec",
    ):
        assert name in spec_mod.__all__ and hasattr(spec_mod, name)


# ---- the contract with autonorm_core: what a spec accepts, the core builds ------------------------------


def _variants(union: Any) -> list[Any]:
    import typing

    return list(typing.get_args(typing.get_args(union)[0]))


@pytest.mark.parametrize("model_type", ["vit_lite", "text_encoder", "tabular", "mlp", "cnn"])
def test_model_fields_are_core_options(model_type: str) -> None:
    from autonorm_core.models import model_defaults
    from studies.schema import ModelSpec

    cls = next(c for c in _variants(ModelSpec) if c.model_fields["type"].default == model_type)
    ours = set(cls.model_fields) - {"type", "preset"}
    assert ours <= set(model_defaults(model_type, preset="tiny"))


def test_every_norm_and_linear_variant_builds_in_core() -> None:
    from autonorm_core.data import load_dataset
    from autonorm_core.models import create_model
    from studies.schema import LinearSpec, NormSpec, ViTLiteSpec

    splits = load_dataset("digits", seed=0, subset=64)
    for norm_cls in _variants(NormSpec):
        for linear_cls in _variants(LinearSpec):
            model = ViTLiteSpec(preset="tiny", patch_size=4, norm=norm_cls(), linear=linear_cls())
            cfg = model.model_dump(mode="json", exclude_none=True)
            kind, preset = cfg.pop("type"), cfg.pop("preset")
            net = create_model(kind, splits, preset=preset, **cfg)
            assert sum(p.numel() for p in net.parameters()) > 0


def test_every_affine_net_layer_builds_in_core() -> None:
    from autonorm_core.data import load_dataset
    from autonorm_core.models import create_model
    from studies.schema import CNNSpec, ConvLayerSpec, MLPLayerSpec, MLPSpec

    splits = load_dataset("digits", seed=0, subset=64)
    built = 0
    for layer_cls in _variants(MLPLayerSpec):
        cfg = MLPSpec(preset="tiny", layer=layer_cls()).model_dump(mode="json", exclude_none=True)
        create_model(cfg.pop("type"), splits, preset=cfg.pop("preset"), **cfg)
        built += 1
    for layer_cls in _variants(ConvLayerSpec):
        cfg = CNNSpec(preset="tiny", layer=layer_cls()).model_dump(mode="json", exclude_none=True)
        create_model(cfg.pop("type"), splits, preset=cfg.pop("preset"), **cfg)
        built += 1
    from autonorm_core.models.affine_nets import CNN_LAYERS, MLP_LAYERS

    assert built == len(MLP_LAYERS) + len(CNN_LAYERS)


def test_training_section_is_a_core_train_config() -> None:
    from autonorm_core.training import TrainConfig

    spec = load_study(SHIPPED)
    cfg = TrainConfig.from_dict(spec.base_config()["training"])
    assert cfg.epochs == spec.training.epochs and cfg.freeze is not None
    assert cfg.freeze.t_freeze == spec.training.freeze.t_freeze


# ---- study kind -------------------------------------------------------------------------------------


def test_kind_is_the_first_field_and_defaults_to_search(tmp_path: Path) -> None:
    assert next(iter(StudySpec.model_fields)) == "kind"
    assert load_study(_write(tmp_path, MINIMAL)).kind == "search"
    assert load_study(_write(tmp_path, "kind: search\n" + MINIMAL)).kind == "search"
    issues = _issues(_write(tmp_path, "kind: batchsize\n" + MINIMAL))
    assert [i.path for i in issues] == ["kind"]


# ---- YAML limits ------------------------------------------------------------------------------------


def _nested_flow(depth: int) -> str:
    return "x: " + "[" * depth + "]" * depth + "\n"


def test_nesting_up_to_the_limit_parses_and_beyond_is_refused_with_its_line() -> None:
    doc, _ = parse_yaml(_nested_flow(spec_mod.MAX_YAML_DEPTH - 1))  # the root mapping is one level
    assert isinstance(doc["x"], list)
    with pytest.raises(SpecError) as info:
        parse_yaml("a: 1\n" + _nested_flow(spec_mod.MAX_YAML_DEPTH), source="deep.yaml")
    (issue,) = info.value.issues
    assert (issue.line, issue.source) == (2, "deep.yaml")
    assert "nested more than" in issue.message


def test_alias_expansion_is_counted_not_performed() -> None:
    # 10 levels of 10 copies: 10**10 values once expanded, a few hundred written.
    lines = ["a0: &a0 [" + ", ".join(["x"] * 10) + "]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 10)]
    with pytest.raises(SpecError) as info:
        parse_yaml("\n".join(lines) + "\n", source="bomb.yaml")
    assert "aliases expanded" in info.value.issues[0].message
    # Modest reuse stays legal: anchors are a YAML feature, not an attack.
    doc, _ = parse_yaml("base: &b {type: layernorm, eps: 1.0e-5}\nnorm: *b\nfinal_norm: *b\n")
    assert doc["norm"] == doc["final_norm"] == {"type": "layernorm", "eps": 1e-5}


def test_self_referencing_alias_is_refused() -> None:
    with pytest.raises(SpecError) as info:
        parse_yaml("a: 1\nb: &s {c: *s}\n")
    assert info.value.issues[0].line == 2
    assert "refers to the collection it is part of" in info.value.issues[0].message


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [
        ("name: ok\nbad: a\x00b\n", 2, "U+0000"),
        ("name: ok\nbad: \x1b[31m\n", 2, "U+001B"),
        ("name: ok\nretries: " + "9" * 4400 + "\n", 2, "4400-digit integer"),
        ("name: ok\nwhen: 2021-02-30\n", 2, "invalid timestamp value"),
        ("name: ok\n1: x\n", 2, "mapping keys must be plain strings"),
    ],
)
def test_bad_scalars_are_spec_errors_with_their_line(text: str, line: int, fragment: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_yaml(text, source="f.yaml")
    (issue,) = info.value.issues
    assert issue.line == line and fragment in issue.message and issue.source == "f.yaml"


def test_set_values_are_parsed_under_the_same_limits(tmp_path: Path) -> None:
    path = _write(tmp_path, MINIMAL)
    bomb = "[&a [x,x,x,x,x,x,x,x,x], &b [*a,*a,*a,*a,*a,*a,*a,*a,*a], &c [*b,*b,*b,*b,*b,*b,*b,*b,*b], " + (
        "&d [*c,*c,*c,*c,*c,*c,*c,*c,*c], &e [*d,*d,*d,*d,*d,*d,*d,*d,*d], *e, *e, *e, *e, *e, *e]"
    )
    (issue,) = _issues(path, (f"description={bomb}",))
    assert issue.path == "description" and "aliases expanded" in issue.message
    assert issue.source is not None and issue.source.startswith("--set description=")
    (issue,) = _issues(path, ("description=" + "[" * 500 + "]" * 500,))
    assert issue.path == "description" and "nested more than" in issue.message


def test_an_oversized_file_is_refused_unread(tmp_path: Path) -> None:
    path = _write(tmp_path, MINIMAL + "#" * spec_mod.MAX_YAML_BYTES)
    (issue,) = _issues(path)
    assert "larger than" in issue.message and issue.source == str(path)


def test_error_text_never_repeats_a_credential_anywhere(tmp_path: Path) -> None:
    secret = "Zq9SECRETxx/yy"
    path = _write(tmp_path, MINIMAL)
    for field in ("storage_path", "tracking.uri", "tracking.artifact_location", "storage.endpoint_override"):
        url = f"s3://AKIAKEY:{secret}@bucket/prefix"
        with pytest.raises(SpecError) as info:
            load_study(path, (f"{field}={url}",))
        text = info.value.format() + repr(info.value.issues) + str(info.value)
        assert secret not in text and "AKIAKEY" not in text and url not in text
        assert "s3://***@bucket/prefix" in text
    # ... also when the credential sits in a field that is no URL at all (the name pattern echoes input).
    with pytest.raises(SpecError) as info:
        load_study(path, (f"name=http://u:{secret}@h",))
    assert secret not in info.value.format()


# ---- URL-like fields ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("checker", "value", "fragment"),
    [
        ("storage_path", "runs", None),
        ("storage_path", "/abs/runs", None),
        ("storage_path", "s3://bucket/prefix", None),
        ("storage_path", "file:///abs/runs", None),
        ("storage_path", "s3:///prefix", "names no bucket"),
        ("storage_path", "s3://KEY:S3CR3T@bucket/p", "carries user info"),
        ("storage_path", "s3://bucket/p?secret_key=x", "query"),
        ("storage_path", "gs://bucket/p", "scheme 'gs'"),
        ("storage_path", "ftp://host/p", "scheme 'ftp'"),
        ("storage_path", "file://relative/p", "absolute path"),
        ("storage_path", "runs\nx", "control characters"),
        ("storage_path", "s3:bucket/p", "without '//'"),
        ("tracking_uri", "http://mlflow:5000", None),
        ("tracking_uri", "https://mlflow.example.org", None),
        ("tracking_uri", "sqlite:////abs/mlflow.db", None),
        ("tracking_uri", "postgresql+psycopg2://db.example/mlflow", None),
        ("tracking_uri", "mysql://db.example/mlflow", None),
        ("tracking_uri", "databricks", None),
        ("tracking_uri", "sqlite:///relative.db", "absolute database path"),
        ("tracking_uri", "file:///tmp/mlruns", "scheme 'file'"),
        ("tracking_uri", "/tmp/mlruns", "a path without a scheme"),
        ("tracking_uri", "ftp://host/x", "scheme 'ftp'"),
        ("tracking_uri", "http://user:hunter2@host", "carries user info"),
        ("tracking_uri", "http://", "names no valid host"),
        ("tracking_uri", "http+evil://host", "scheme 'http+evil'"),
        ("artifact_location", "s3://bucket/artifacts", None),
        ("artifact_location", "mlflow-artifacts:/exp", None),
        ("artifact_location", "gs://bucket/a", "scheme 'gs'"),
        ("endpoint", "http://127.0.0.1:8333", None),
        ("endpoint", "https://s3.example.org/", None),
        ("endpoint", "127.0.0.1:8333", "must be http://host[:port]"),
        ("endpoint", "http://host:99999", "no valid host[:port]"),
        ("endpoint", "http://host/path", "has no path"),
        ("endpoint", "http://k:S3CR3T@host", "carries user info"),
    ],
)
def test_url_fields(checker: str, value: str, fragment: str | None) -> None:
    from studies.schema import urls as spec_urls

    problem = getattr(spec_urls, f"{checker}_problem")(value)
    if fragment is None:
        assert problem is None
    else:
        assert problem is not None and fragment in problem
        assert "S3CR3T" not in problem and "hunter2" not in problem


def test_url_fields_are_checked_for_every_study_kind() -> None:
    from studies.schema import url_field_issues

    doc = {
        "storage_path": "s3://K:S@b/p",
        "tracking": {"uri": "sqlite:///x.db", "artifact_location": "gs://b/a"},
        "storage": {"endpoint_override": "ftp://h"},
    }
    assert [i.path for i in url_field_issues(doc)] == [
        "storage_path",
        "tracking.uri",
        "tracking.artifact_location",
        "storage.endpoint_override",
    ]


# ---- seeds and integer ranges ----------------------------------------------------------------------


def test_seeds_must_fit_32_bits(tmp_path: Path) -> None:
    path = _write(tmp_path, MINIMAL)
    assert (
        load_study(path, ("search.sampler={type: tpe, seed: 4294967295}",)).search.sampler.seed == 2**32 - 1
    )
    (issue,) = _issues(path, ("search.sampler={type: random, seed: 4294967296}",))
    assert issue.path == "search.sampler.seed"
    issues = _issues(path, ("seeds=[4294967296]",))
    assert any(i.path == "seeds.0" and "less than 4294967296" in i.message for i in issues)


def test_small_int_range_is_checked_value_by_value(tmp_path: Path) -> None:
    path = _write(tmp_path, MINIMAL)
    ok = load_study(path, ("model.dim=64", "search.space=[{name: model.heads, type: int, low: 1, high: 2}]"))
    assert ok.search.space[0].high == 2
    (issue,) = _issues(
        path, ("model.dim=64", "search.space=[{name: model.heads, type: int, low: 1, high: 4}]")
    )
    assert issue.path == "search.space.0" and "model.heads=3," in issue.message
    (issue,) = _issues(path, ("search.space=[{name: model.patch_size, type: int, low: 1, high: 8}]",))
    assert "model.patch_size=3 (also 5, 6, 7)" in issue.message
    # With a step only the reachable values count: 2, 4, 6, 8 -> 6 fails.
    (issue,) = _issues(
        path, ("search.space=[{name: model.patch_size, type: int, low: 2, high: 8, step: 2}]",)
    )
    assert "model.patch_size=6," in issue.message and "also" not in issue.message


def test_wide_int_range_is_sampled_with_its_endpoints() -> None:
    from studies.schema import IntParam

    small = spec_space._int_values(IntParam(name="training.epochs", low=1, high=64))
    assert small == list(range(1, 65))
    wide = spec_space._int_values(IntParam(name="training.epochs", low=1, high=10_000))
    assert wide[0] == 1 and wide[-1] == 10_000 and 3 <= len(wide) <= 20
    stepped = spec_space._int_values(IntParam(name="training.epochs", low=1, high=10, step=4))
    assert stepped == [1, 5, 9]


def test_searched_t_freeze_must_fit_the_smallest_searched_epochs(tmp_path: Path) -> None:
    base = MINIMAL.replace("training: {epochs: 4}", "training: {epochs: 12, freeze: {t_freeze: 2}}")
    path = _write(tmp_path, base)
    space = (
        "search.space=[{name: training.freeze.t_freeze, type: int, low: 1, high: %d}, "
        "{name: training.epochs, type: int, low: 6, high: 12}]"
    )
    assert load_study(path, (space % 6,)).training.freeze is not None
    issues = _issues(path, (space % 8,))
    assert [i.path for i in issues] == ["search.space.0.high"]
    assert "never freezes" in issues[0].message
