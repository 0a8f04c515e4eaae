"""The broken-spec corpus: every ``broken_specs/*.yaml`` names the error it must produce in its header.

Header comments (read as text, so they work for files that are not valid YAML):

    # expect-path: model.norm.tau          the issue's field path (<document> for the file itself)
    # expect-message: greater than 0       a fragment of its message
    # expect-line: 7                       optional: the YAML line reported
    # expect-source: --set model.norm.tau=0  optional: where the value came from
    # preset: smoke                        optional: load with this preset
    # set: model.norm.tau=0                optional, repeatable: --set overrides
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

CORPUS = Path(__file__).parent / "broken_specs"


@dataclass(frozen=True)
class BrokenCase:
    path: Path
    expect_path: str
    expect_message: str
    expect_line: int | None = None
    expect_source: str | None = None
    preset: str | None = None
    overrides: tuple[str, ...] = field(default=())

    @property
    def id(self) -> str:
        return self.path.stem

    def cli_args(self) -> list[str]:
        args = [str(self.path)]
        if self.preset:
            args += ["--preset", self.preset]
        for ov in self.overrides:
            args += ["--set", ov]
        return args


def load_cases() -> list[BrokenCase]:
    cases = []
    for path in sorted(CORPUS.glob("*.yaml")):
        meta: dict[str, str] = {}
        overrides: list[str] = []
        for line in path.read_text().splitlines():
            if not line.startswith("# "):
                continue
            key, sep, value = line[2:].partition(": ")
            if not sep:
                continue
            if key == "set":
                overrides.append(value)
            else:
                meta[key] = value
        cases.append(
            BrokenCase(
                path=path,
                expect_path=meta["expect-path"],
                expect_message=meta["expect-message"],
                expect_line=int(meta["expect-line"]) if "expect-line" in meta else None,
                expect_source=meta.get("expect-source"),
                preset=meta.get("preset"),
                overrides=tuple(overrides),
            )
        )
    return cases
