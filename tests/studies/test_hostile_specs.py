"""Hostile specs: a generated corpus of mutated shipped specs plus hand-written attacks on the loader.

Property under test: whatever the file holds, loading it either gives a spec or raises a
:class:`SpecError` whose every issue names a field path or a YAML line, and whose text never repeats
a credential. Nothing else may escape (no ``TypeError``, ``RecursionError``, ``MemoryError``, no hang:
pytest-timeout catches those). A sample goes through the real CLI, which must exit 2 without a
traceback; the loader attacks (alias bombs, binary junk, deep nesting) go through the CLI too.
"""

from __future__ import annotations

import copy
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from studies.kinds import load_study
from studies.kinds.batchsize.spec import BatchSizeStudySpec
from studies.kinds.search.spec import StudySpec
from studies.schema import SpecError, load_spec

ROOT = Path(__file__).resolve().parents[2]
SEARCH = ROOT / "studies" / "specs" / "autonorm_search.yaml"
BATCHSIZE = ROOT / "studies" / "specs" / "batchsize_correlation.yaml"
SECRET = "wJalrXUtnFEMIK7MDENGbPxRfiCYEXAMPLEKEY"
CREDENTIAL_URLS = (
    f"s3://AKIAIOSFODNN7EXAMPLE:{SECRET}@bucket/prefix",
    f"http://alice:{SECRET}@mlflow.example:5000",
    f"s3://AKIA:{SECRET[:10]}/{SECRET[10:]}@bucket/p",  # a secret holding '/' (common for AWS keys)
    f"https://{SECRET}@host/",
)

# Values planted at every leaf: wrong types, out-of-range and huge numbers, NaN/inf, empty and junk strings.
HOSTILE_VALUES: tuple[Any, ...] = (
    "",
    -1,
    0,
    10**30,
    1.0e308,
    math.nan,
    -math.inf,
    True,
    None,
    [],
    {},
    [1, [2, [3]]],
    {"type": "no_such_type", "x": 1},
    "\u202e\u0000\ufffd\U0001f4a5" * 3,
    "a" * 5000,
    CREDENTIAL_URLS[0],
    2**32,
    -0.0,
    "1e-3",
    "yes",
)


@dataclass(frozen=True)
class Hostile:
    id: str
    base: Path  # the shipped spec it was derived from (decides the spec class)
    text: str
    overrides: tuple[str, ...] = ()

    @property
    def model(self) -> type[BaseModel]:
        return BatchSizeStudySpec if self.base == BATCHSIZE else StudySpec


def _dump(doc: Any) -> str:
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=10**6)


def _paths(doc: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    """Every (path, value) below the root, parents before children; presets left out."""
    items: list[tuple[Any, Any]]
    if isinstance(doc, dict):
        items = [(k, v) for k, v in doc.items() if not (path == () and k == "presets")]
    elif isinstance(doc, list):
        items = list(enumerate(doc))
    else:
        return
    for k, v in items:
        yield (*path, k), v
        yield from _paths(v, (*path, k))


def _with(doc: dict[str, Any], path: tuple[Any, ...], value: Any, *, delete: bool = False) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    cur: Any = out
    for part in path[:-1]:
        cur = cur[part]
    if delete:
        del cur[path[-1]]
    else:
        cur[path[-1]] = value
    return out


def _generated(base: Path) -> list[Hostile]:
    doc = yaml.safe_load(base.read_text())
    doc.pop("presets", None)
    tag = base.stem.split("_")[0]
    cases: list[Hostile] = []
    for n, (path, value) in enumerate(_paths(doc)):
        where = ".".join(map(str, path))
        # Two hostile values per field, rotating through the list so every value lands somewhere.
        for j in (0, 1):
            bad = HOSTILE_VALUES[(2 * n + j) % len(HOSTILE_VALUES)]
            cases.append(Hostile(f"{tag}-{where}-value{j}", base, _dump(_with(doc, path, bad))))
        if isinstance(value, dict):
            cases.append(
                Hostile(f"{tag}-{where}-unknown-key", base, _dump(_with(doc, (*path, "zz_unknown"), 1)))
            )
        if isinstance(value, (dict, list)) and value:
            cases.append(Hostile(f"{tag}-{where}-emptied", base, _dump(_with(doc, path, type(value)()))))
        if len(path) <= 2:
            cases.append(Hostile(f"{tag}-{where}-deleted", base, _dump(_with(doc, path, None, delete=True))))
    for field in ("storage_path",):
        for k, url in enumerate(CREDENTIAL_URLS):
            cases.append(Hostile(f"{tag}-{field}-credentials{k}", base, _dump(_with(doc, (field,), url))))
    for k, url in enumerate(CREDENTIAL_URLS):
        text = _dump(doc)
        cases.append(Hostile(f"{tag}-set-tracking-credentials{k}", base, text, (f"tracking.uri={url}",)))
        cases.append(
            Hostile(f"{tag}-set-endpoint-credentials{k}", base, text, (f"storage.endpoint_override={url}",))
        )
        cases.append(
            Hostile(f"{tag}-set-artifacts-credentials{k}", base, text, (f"tracking.artifact_location={url}",))
        )
    cases.append(Hostile(f"{tag}-top-level-unknown", base, _dump({**doc, "zz_unknown": {"a": 1}})))
    cases.append(Hostile(f"{tag}-deep-description", base, _dump({**doc, "description": _nested(90)})))
    cases.append(Hostile(f"{tag}-deep-model", base, _dump(_with(doc, ("model", "zz"), _nested(95)))))
    text = base.read_text()
    cases.append(Hostile(f"{tag}-truncated", base, text[: len(text) // 2]))
    cases.append(Hostile(f"{tag}-tabs", base, text.replace("  ", "\t", 3)))
    cases.append(Hostile(f"{tag}-doubled", base, text + "\n---\n" + text))
    cases.append(Hostile(f"{tag}-alias-reuse", base, _dump(doc) + "x: &a {type: mlp}\nmodel: *a\n"))
    return cases


def _nested(depth: int) -> Any:
    out: Any = "leaf"
    for i in range(depth):
        out = {f"k{i}": out} if i % 2 else [out]
    return out


def _bomb(levels: int, width: int, use: str = "description") -> str:
    lines = [f"a0: &a0 [{', '.join(['x'] * width)}]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]" for i in range(1, levels)]
    return "name: bomb\n" + "\n".join(lines) + f"\n{use}: *a{levels - 1}\n"


HAND_WRITTEN: list[tuple[str, str, tuple[str, ...]]] = [
    ("alias-bomb-9x9", _bomb(9, 9, "model"), ()),
    ("alias-bomb-description", _bomb(9, 9), ()),
    (
        "alias-bomb-merge-keys",
        "a: &a {x: 1, y: 2}\n"
        + "".join(f"b{i}: &b{i} {{<<: [*{'a' if i == 0 else f'b{i - 1}'}]}}\n" for i in range(50))
        + "name: m\n",
        (),
    ),
    ("alias-recursive", "name: &n [*n]\n", ()),
    ("alias-undefined", "name: *nope\n", ()),
    ("flow-5000-deep", "name: " + "[" * 5000 + "]" * 5000 + "\n", ()),
    ("flow-mapping-3000-deep", "name: " + "{a: " * 3000 + "1" + "}" * 3000 + "\n", ()),
    ("block-800-deep", "".join("  " * i + f"k{i}:\n" for i in range(800)) + "  " * 800 + "v\n", ()),
    ("nul-byte", "name: a\x00b\n", ()),
    ("control-chars", "name: a\x07b\x1b[31m\n", ()),
    ("bom-then-junk", "\ufeffname: [\n", ()),
    ("only-comment", "# nothing\n", ()),
    ("only-document-marker", "---\n...\n", ()),
    ("python-apply", "name: !!python/object/apply:os.system ['true']\n", ()),
    ("python-name-key", "!!python/name:os.system : 1\n", ()),
    ("unknown-tag", "name: !custom x\n", ()),
    ("binary-tag-bad", "name: !!binary '%%%%'\n", ()),
    ("set-tag", "name: !!set {a, b}\n", ()),
    ("timestamp-bad", "name: 2001-02-30\n", ()),
    ("huge-int-key", "9999999999999999999999999: x\n", ()),
    ("huge-int", "name: x\nretries: " + "9" * 5000 + "\n", ()),
    ("null-key", "~: x\nname: y\n", ()),
    ("bool-key", "on: x\nname: y\n", ()),
    ("complex-key", "? [a, b]\n: x\nname: y\n", ()),
    ("many-documents", "name: a\n---\nname: b\n", ()),
    ("top-level-list", "- name: a\n", ()),
    ("top-level-scalar", "just text\n", ()),
    ("unclosed-quote", "name: 'abc\n", ()),
    ("bad-indent", "name: a\n  model: b\n", ()),
    ("long-line", "name: " + "x" * 200_000 + "\n", ()),
    ("many-keys", "".join(f"k{i}: {i}\n" for i in range(20_000)), ()),
    (
        "nan-everywhere",
        "name: n\nmodel: {type: vit_lite, preset: tiny, norm: {type: autonorm, tau: .nan}}\ndata: {type: digits, val_fraction: .nan}\ntraining: {lr: .inf, epochs: .nan}\n",
        (),
    ),
    (
        "set-alias-bomb",
        "name: s\n",
        (
            "description=[&a [x,x,x,x,x,x,x,x,x], &b [*a,*a,*a,*a,*a,*a,*a,*a,*a], &c [*b,*b,*b,*b,*b,*b,*b,*b,*b], &d [*c,*c,*c,*c,*c,*c,*c,*c,*c], &e [*d,*d,*d,*d,*d,*d,*d,*d,*d], &f [*e,*e,*e,*e,*e,*e,*e,*e,*e], *f, *f, *f, *f, *f, *f, *f, *f]",
        ),
    ),
    ("set-deep", "name: s\n", ("description=" + "[" * 3000 + "]" * 3000,)),
    ("set-nul", "name: s\n", ("description=a\x00b",)),
    ("set-python-tag", "name: s\n", ("description=!!python/object/apply:os.system ['true']",)),
    ("set-into-list-index", "name: s\nseeds: [0]\n", ("seeds.5=1",)),
    ("set-into-scalar", "name: s\n", ("name.x.y=1",)),
    ("set-empty-key", "name: s\n", ("=1",)),
    ("set-credentials-storage", "name: s\n", (f"storage_path=s3://AKIA:{SECRET}@bucket/p",)),
    ("preset-bomb", "name: s\npresets:\n  p: &p {x: &q [1,2,3,4,5,6,7,8,9]}\n", ()),
]


def _corpus() -> list[Hostile]:
    cases = _generated(SEARCH) + _generated(BATCHSIZE)
    cases += [Hostile(f"hand-{name}", SEARCH, text, ovs) for name, text, ovs in HAND_WRITTEN]
    ids = [c.id for c in cases]
    assert len(set(ids)) == len(ids), "hostile ids must be unique"
    return cases


CORPUS = _corpus()


def _outcome(case: Hostile, tmp_path: Path) -> SpecError | None:
    path = tmp_path / f"{case.id[:80].replace('/', '_')}.yaml"
    path.write_text(case.text, encoding="utf-8", errors="surrogatepass")
    try:
        load_spec(path, case.overrides, model=case.model)
    except SpecError as e:
        return e
    return None


def test_corpus_is_large_and_varied() -> None:
    assert len(CORPUS) >= 200
    assert sum(c.base == BATCHSIZE for c in CORPUS) >= 50
    assert sum(c.base == SEARCH for c in CORPUS) >= 50


@pytest.mark.parametrize("case", CORPUS, ids=[c.id for c in CORPUS])
def test_hostile_spec_is_refused_cleanly_or_valid(case: Hostile, tmp_path: Path) -> None:
    err = _outcome(case, tmp_path)  # any exception but SpecError fails the test
    if err is None:
        return
    assert err.issues
    for issue in err.issues:
        # A malformed `--set` (no key at all) has neither; its source names the override instead.
        located = issue.path or issue.line is not None or (issue.source or "").startswith("--set ")
        assert located, f"{case.id}: issue without path or line: {issue}"
        assert issue.message
    text = err.format() + repr(err.issues)
    assert SECRET not in text and SECRET[:10] not in text and SECRET[10:] not in text
    assert "alice" not in text and "AKIAIOSFODNN7EXAMPLE" not in text


def test_most_hostile_specs_are_refused(tmp_path: Path) -> None:
    # Mutations that keep a spec valid (a leaf set to an equally valid value) are allowed, but a
    # corpus the validator mostly accepted would test nothing.
    refused = sum(_outcome(c, tmp_path) is not None for c in CORPUS)
    assert refused >= 0.7 * len(CORPUS), f"{refused} of {len(CORPUS)} refused"


CREDENTIAL_CASES = [c for c in CORPUS if "credentials" in c.id]


@pytest.mark.parametrize("case", CREDENTIAL_CASES, ids=[c.id for c in CREDENTIAL_CASES])
def test_credentials_are_refused_by_every_study_kind(case: Hostile, tmp_path: Path) -> None:
    err = _outcome(case, tmp_path)
    assert err is not None, f"{case.id} was accepted"
    assert any("user info" in i.message for i in err.issues), err.format()


def test_shipped_specs_themselves_are_valid() -> None:
    assert isinstance(load_study(SEARCH), StudySpec)
    assert isinstance(load_spec(BATCHSIZE, model=BatchSizeStudySpec), BatchSizeStudySpec)


# ---- through the real CLI ---------------------------------------------------------------------------

CLI_CASES = [
    "hand-alias-bomb-9x9",
    "hand-alias-bomb-description",
    "hand-flow-5000-deep",
    "hand-block-800-deep",
    "hand-nul-byte",
    "hand-set-alias-bomb",
    "hand-set-credentials-storage",
]


def _cli(path: Path, overrides: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    args = [sys.executable, "-m", "studies.cli", "validate", str(path)]
    for ov in overrides:
        args += ["--set", ov]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # The timeout is a hang guard, not a speed assertion.
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)


def _cli_sample() -> list[Hostile]:
    by_id = {c.id: c for c in CORPUS}
    named = [by_id[i] for i in CLI_CASES]
    generated = [c for c in CORPUS if not c.id.startswith("hand-")]
    return named + generated[:: max(1, len(generated) // 8)][:8]


@pytest.mark.slow  # one CLI subprocess per case: CI runs them, the quick loop does not
@pytest.mark.parametrize("case", _cli_sample(), ids=[c.id for c in _cli_sample()])
def test_cli_agrees_with_the_loader_and_never_shows_a_traceback(case: Hostile, tmp_path: Path) -> None:
    refused = _outcome(case, tmp_path) is not None
    if case.id in CLI_CASES:
        assert refused
    path = tmp_path / "hostile.yaml"
    path.write_text(case.text, encoding="utf-8", errors="surrogatepass")
    proc = _cli(path, case.overrides)
    assert proc.returncode == (2 if refused else 0), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr + proc.stdout
    assert ("invalid study spec" in proc.stderr) == refused
    assert SECRET not in proc.stderr + proc.stdout


def test_cli_refuses_binary_junk(tmp_path: Path) -> None:
    path = tmp_path / "junk.yaml"
    path.write_bytes(bytes(range(256)) * 40 + b"\xff\xfe\x00name: x\n")
    proc = _cli(path)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr + proc.stdout
    assert f"{path}" in proc.stderr and "cannot read the spec" in proc.stderr
    with pytest.raises(SpecError) as info:
        load_study(path)
    (issue,) = info.value.issues
    assert (issue.line, issue.source) == (2, str(path))  # byte 0x80 comes after the one newline, 0x0a
    assert "not UTF-8" in issue.message


def test_cli_refuses_valid_utf8_binary_junk(tmp_path: Path) -> None:
    path = tmp_path / "junk.yaml"
    path.write_text("name: x\n" + "".join(chr(c) for c in range(1, 32) if c not in (9, 10, 13)) + "\n")
    proc = _cli(path)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr + proc.stdout
    assert f"{path}:2: <document>: malformed YAML: character U+0001" in proc.stderr
