"""The report kit every study kind uses: one Jinja2 template, Markdown and HTML from one document,
tables, embedded images, number and CI formatting, JSON cleaning, one colour per label.

A kind builds a :class:`Document` (its headline, sections of paragraphs and tables, method lines)
and calls :func:`write_report`; it never writes HTML itself. The HTML embeds every image as a
``data:`` URI (MLflow shows HTML artifacts from a blob URL in a sandboxed iframe, where a relative
``<img src>`` never resolves) and is autoescaped; the Markdown links the images by file name.
"""

from __future__ import annotations

import base64
import html
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

import jinja2
import numpy as np
import yaml
from markupsafe import Markup

__all__ = [
    "CAPTIONS",
    "COLORS",
    "Document",
    "Section",
    "begin_report",
    "caption",
    "count",
    "data_uri",
    "draw_contrast_row",
    "estimate_name",
    "finite",
    "fmt",
    "fmt_ci",
    "fmt_refinement",
    "json_safe",
    "legend_handles",
    "md_fence",
    "md_table",
    "plot_gate_entropy",
    "render_html",
    "render_markdown",
    "resources_lines",
    "save_figure",
    "study_document",
    "to_yaml",
    "with_study_cost",
    "write_json",
]

COLORS: dict[str, str] = {
    "supported": "#1f5fa8",
    "refuted": "#c0392b",
    "inconclusive": "#8a8f94",
    "budget-dependent": "#b07aa1",
    "none": "#c5c8cb",
    "stable": "#2a9d8f",
    "declines": "#d9822b",
    "unclear": "#7b5ea7",
    "better": "#1b9e4b",
    "worse": "#8c2d04",
    "equivalent": "#5aa9e6",
}
"""One colour per verdict or label (no two labels share one), in every kind's tables, headlines and
plots; :func:`legend_handles` draws a legend of the labels that occur."""

CAPTIONS: dict[str, str] = {
    "metric_vs_batch_size": "The analysis metric against batch size (log scale), one line per arm: mean over "
    "seeds with its confidence band; a falling line means the arm gets worse as the batch grows.",
    "forest": "Each arm's slope per doubling of B (left) and its interaction with the control (right), "
    "with confidence intervals, coloured by the arm's verdict or label; left of zero is a decline.",
    "intervals_vs_seeds": "The anytime-valid confidence sequence of each hypothesis at every look, against "
    "the seeds used so far.",
    "claims_forest": "The paired contrasts behind the claims: per-seed differences (dots), their mean and "
    "t-interval, coloured by the claim's verdict.",
    "gate_entropy": "AutoNorm's gate entropy per sub-layer over training, per arm: how fast each gate "
    "settles on one normalisation.",
    "gate_entropy_per_layer": "AutoNorm's gate entropy per layer over training: how fast each gate "
    "settles on one normalisation.",
    "dyt_weight_vs_depth": "The weight AutoNorm's gate gives DyT at the end of training, by layer depth.",
}
"""What each plot shows, by file stem: the caption under it in every report (a kind may add more)."""


def legend_handles(labels: Sequence[str], **line: Any) -> list[Any]:
    """Legend handles (``matplotlib`` lines) of ``labels`` that have a colour, once each, in
    :data:`COLORS` order: a legend shows only the labels that occur, each in its own colour."""
    from matplotlib.lines import Line2D

    used = set(labels)
    return [Line2D([], [], color=c, label=name, **line) for name, c in COLORS.items() if name in used]


def caption(plot: str | Path, captions: Mapping[str, str] | None = None) -> str:
    """The caption of a plot file: ``captions`` (the document's own), else :data:`CAPTIONS`, else its name."""
    stem = Path(plot).stem
    return (captions or {}).get(stem) or CAPTIONS.get(stem) or stem.replace("_", " ")


# --------------------------------------------------------------------------------------------------
# Values


def finite(value: Any) -> TypeGuard[float]:
    """A real, finite number (not a bool)."""
    return isinstance(value, int | float | np.number) and not isinstance(value, bool) and math.isfinite(value)


def fmt(v: Any, digits: int = 3) -> str:
    """A cell: ``–`` for a missing or non-finite number, ``digits`` significant digits for a float."""
    if v is None or isinstance(v, bool):
        return "–" if v is None else str(v)
    if isinstance(v, int | np.integer):
        return str(int(v))
    if isinstance(v, float | np.floating):
        return f"{float(v):.{digits}g}" if math.isfinite(v) else "–"
    return str(v)


def count(n: Any, noun: str, plural: str | None = None) -> str:
    """``1 seed``, ``2 seeds``, ``0 seeds``: a count with its noun in the right number (``plural``
    when adding an ``s`` is wrong)."""
    return f"{n} {noun if n == 1 else (plural or noun + 's')}"


_ESTIMATE_NAMES: dict[str, str] = {"batchsize": "interaction", "compare": "difference"}
_CLAIM_ESTIMATES: dict[str, str] = {"c": "slope", "d": "median epoch"}


def estimate_name(kind: Any, hypothesis: str) -> str:
    """What a hypothesis's ``estimate`` (the shared ``hypotheses`` view of ``verdict.json``) is, in
    one word or two, so that no estimate is printed without its name: the batch-size kind's
    ``interaction`` (the per-seed slope of the paired differences fix − control vs log2 B), the
    compare kind's ``difference`` (arm − reference), the claims study's ``difference`` (claims a, b,
    e: paired contrasts), ``slope`` (claim c and its sub-layers: DyT weight vs block index) and
    ``median epoch`` (claim d: the collapse epoch); ``estimate`` for anything else."""
    if kind == "search":
        return next(
            (n for prefix, n in _CLAIM_ESTIMATES.items() if str(hypothesis).startswith(prefix)), "difference"
        )
    return _ESTIMATE_NAMES.get(str(kind), "estimate")


def fmt_refinement(refine: Mapping[str, Any] | None) -> str:
    """A tuning record's refinement (:func:`studies.tuning.tune`) as a cell: the rates it ran and
    whether one of them beat the grid's winner; ``–`` when none ran."""
    if not refine or not refine.get("points"):
        return "–"
    rates = ", ".join(fmt(x) for x in refine["points"])
    grid_lr = fmt(refine.get("grid_lr"))
    return f"{rates} (one beat {grid_lr})" if refine.get("moved") else f"{rates} (kept {grid_lr})"


def fmt_ci(ci: Any, digits: int = 3) -> str:
    """``[lo, hi]``; ``–`` when there is no interval (a missing bound shows as ``–`` inside it)."""
    if not isinstance(ci, Sequence) or isinstance(ci, str) or len(ci) != 2 or all(c is None for c in ci):
        return "–"
    return f"[{fmt(ci[0], digits)}, {fmt(ci[1], digits)}]"


def json_safe(obj: Any) -> Any:
    """NaN/inf → None, numpy scalars → Python, tuples → lists, keys → str: valid, strict JSON."""
    if isinstance(obj, Mapping):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple | set | frozenset):
        items = sorted(obj, key=str) if isinstance(obj, set | frozenset) else obj
        return [json_safe(v) for v in items]
    if isinstance(obj, np.ndarray):
        return [json_safe(v) for v in obj.tolist()]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if obj is None or isinstance(obj, str | int | float | bool):
        return obj
    return str(obj)


def begin_report(out_dir: str | Path, verdict: Any, table: Any, **plots: str) -> dict[str, Path]:
    """The output paths of a fixed-design kind's report in ``out_dir`` (made if missing): ``verdict``
    (``verdict.json``), ``trials`` (``trials.csv``), ``markdown``, ``html`` and each of ``plots``
    (name -> file name); writes ``verdict.json`` (NaN as null; inside a study run with the run's cost
    in its ``resources``, :func:`with_study_cost`) and ``trials.csv`` (``table``) now."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {
        "verdict": out / "verdict.json",
        "trials": out / "trials.csv",
        "markdown": out / "report.md",
        "html": out / "report.html",
        **{name: out / file for name, file in plots.items()},
    }
    write_json(paths["verdict"], with_study_cost(verdict))
    table.to_csv(paths["trials"], index=False)
    return paths


def write_json(path: Path, data: Any) -> Path:
    """``data`` as strict JSON (NaN as null), indented; written whole (a reader never sees a part)."""
    from workers.uploads import write_whole

    write_whole(path, (json.dumps(json_safe(data), indent=2, allow_nan=False) + "\n").encode("utf-8"))
    return path


def to_yaml(obj: Any) -> str:
    return yaml.safe_dump(json_safe(obj), sort_keys=False, allow_unicode=True)


def resources_lines(
    wall_time_s: float | None,
    cpu_hours: float | None,
    gpu_hours: float | None,
    *,
    trials: int | None = None,
) -> list[str]:
    """The report's resources: the trials run (when known), the wall time as every output prints it
    (:func:`workers.console.format_wall`, ``–`` when unknown), CPU and GPU hours."""
    from workers.console import format_wall

    wall = format_wall(wall_time_s) if finite(wall_time_s) else "–"
    head = [f"trials run: {int(trials)}"] if finite(trials) else []
    return [*head, f"wall time: {wall}", f"CPU hours: {fmt(cpu_hours)}", f"GPU hours: {fmt(gpu_hours)}"]


def with_study_cost(verdict: Any) -> Any:
    """``verdict`` (a ``verdict.json`` dictionary, changed in place and returned) with the running
    study's cost in its ``resources`` (:func:`workers.cost.running_cost`: ``trials``, ``wall_time_s``,
    ``cpu_hours``, ``gpu_hours``, the numbers of the run's closing lines and of ``ls``); unchanged
    outside a study run (``report`` keeps what the run wrote)."""
    from workers.cost import running_cost

    cost = running_cost()
    if cost is not None and isinstance(verdict, dict):
        verdict["resources"] = {**(verdict.get("resources") or {}), **cost}
    return verdict


# --------------------------------------------------------------------------------------------------
# Markdown pieces, images


def md_fence(text: str, lang: str) -> str:
    """A fenced code block whose fence is longer than any run of backticks inside ``text``."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{lang}\n{text if text.endswith(chr(10)) else text + chr(10)}{fence}\n"


def md_table(rows: Sequence[Mapping[str, Any]]) -> str:
    if not rows:
        return "_none_\n"
    cols = list(rows[0])

    def cell(v: Any) -> str:
        return str(v).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    lines += ["| " + " | ".join(cell(r.get(c, "")) for c in cols) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def data_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def draw_contrast_row(
    ax: Any, trans: Any, y: float, contrast: Mapping[str, Any], color: str, note: str
) -> None:
    """One paired contrast's row ``y`` of a forest plot: its per-seed ``differences`` (small jittered
    dots), its ``ci`` (bar), its ``estimate`` (dot, when finite) and ``note`` right of the axes
    (``trans``: axes x, data y)."""
    diffs = [float(d) for d in contrast.get("differences") or [] if finite(d)]
    if diffs:
        jitter = np.linspace(-0.15, 0.15, len(diffs)) if len(diffs) > 1 else np.zeros(1)
        ax.scatter(diffs, y + jitter, s=10, color=color, alpha=0.35, linewidths=0)
    est, ci = contrast.get("estimate"), contrast.get("ci") or [None, None]
    if finite(ci[0]) and finite(ci[1]):
        ax.plot([ci[0], ci[1]], [y, y], color=color, lw=2.6)
    if finite(est):
        ax.plot([est], [y], "o", color=color, ms=7)
    ax.text(1.01, y, note, transform=trans, va="center", fontsize=7.5, color=color)


class ForestPlot:
    """A forest plot of paired contrasts, one row per label from the top (``ypos[i]`` is row ``i``):
    :meth:`row` draws a contrast, :meth:`note` writes grey text in a row, :meth:`save` adds the zero
    line, the labels, a legend of the verdicts that occur and the title, then writes the PNG."""

    def __init__(self, labels: Sequence[str], *, width: float) -> None:
        from matplotlib.figure import Figure
        from matplotlib.transforms import blended_transform_factory

        self.labels = list(labels)
        self.fig = Figure(figsize=(width, 0.8 * max(len(self.labels), 1) + 1.8))
        self.ax = self.fig.subplots()
        self.ypos = np.arange(len(self.labels))[::-1].astype(float)
        self.trans = blended_transform_factory(self.ax.transAxes, self.ax.transData)

    def row(self, y: float, contrast: Mapping[str, Any], color: str, note: str) -> None:
        draw_contrast_row(self.ax, self.trans, y, contrast, color, note)

    def note(self, y: float, text: str) -> None:
        self.ax.text(0.02, y, text, transform=self.trans, va="center", fontsize=8, color="gray")

    def save(
        self,
        path: str | Path,
        *,
        xlabel: str,
        title: str,
        verdicts: Sequence[str],
        label_size: float = 8.0,
        right: float = 0.84,
    ) -> Path:
        ax = self.ax
        ax.axvline(0.0, color="black", lw=0.9, ls="--")
        ax.set_yticks(self.ypos)
        ax.set_yticklabels(self.labels, fontsize=label_size)
        if len(self.labels):
            ax.set_ylim(self.ypos.min() - 0.6, self.ypos.max() + 0.6)
        ax.set_xlabel(xlabel)
        ax.grid(axis="x", alpha=0.3)
        handles = legend_handles(verdicts, lw=2.6)  # the verdicts that occur, once each
        self.fig.legend(
            handles=handles, loc="lower center", ncol=max(1, len(handles)), fontsize=8, frameon=False
        )
        ax.set_title(title, fontsize=10)
        self.fig.tight_layout(rect=(0, 0.07, right, 1))
        return save_figure(self.fig, Path(path))


def save_figure(fig: Any, path: str | Path) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    return out


# --------------------------------------------------------------------------------------------------
# The document


@dataclass
class Section:
    """A heading, paragraphs, tables (rows of text) and optionally a code block.

    Attributes:
        label_columns: columns whose cells are a verdict or label (coloured by their first word),
            besides every column named ``verdict*``.
        code: a YAML block shown after the tables; ``empty`` is said instead when it is empty.
    """

    heading: str
    text: list[str] = field(default_factory=list)
    tables: list[list[dict[str, str]]] = field(default_factory=list)
    label_columns: Sequence[str] = ()
    code: str | None = None
    empty: str = ""

    def is_label(self, column: str) -> bool:
        return column.startswith("verdict") or column in self.label_columns


@dataclass
class Document:
    """One report, rendered to Markdown and HTML alike.

    Attributes:
        headline: the first line of both renderings (the study verdict, or the claims line).
        scope: the second line: what the verdict was decided on (:func:`studies.scope.scope_line`).
        verdict: the study verdict (colours the headline's bar).
        parts: the headline split into coloured pieces ``(label, text)`` after ``prefix`` (HTML only).
        banner: the exploratory / underpowered warning, or ``""``.
        intro: paragraphs after the title (``**bold**`` and ```code``` are kept in the HTML).
        captions: what each plot shows, by file stem (over :data:`CAPTIONS`).
        protocol: the resolved protocol as YAML, shown last.

    Both renderings show before they tell: the verdict, the plots (captioned), the tables, the
    method and resources, then the protocol.
    """

    headline: str
    title: str
    scope: str = ""
    verdict: str = "none"
    prefix: str = ""
    parts: Sequence[tuple[str, str]] = ()
    banner: str = ""
    intro: Sequence[str] = ()
    sections: Sequence[Section] = ()
    method: Sequence[str] = ()
    resources: Sequence[str] = ()
    protocol: str = ""
    plot_errors: Sequence[str] = ()
    captions: Mapping[str, str] = field(default_factory=dict)


def study_document(
    verdict: Mapping[str, Any],
    *,
    banner: str,
    protocol: Mapping[str, Any] | None,
    spent: Sequence[float | None],
    **fields: Any,
) -> Document:
    """The :class:`Document` of a study's ``verdict`` (its ``verdict.json``): the study verdict, the
    scope line, ``banner`` when the design is exploratory, the resources ``spent`` (wall s, CPU h,
    GPU h) and the trials run (its ``resources``' ``trials``) with how the trials were trained (its
    ``execution``), and the ``protocol`` as YAML;
    ``fields``: the kind's own (headline, title, intro, ...)."""
    from studies.scope import execution_lines, scope_line

    return Document(
        scope=scope_line(verdict.get("scope")),
        verdict=str(verdict["study_verdict"]),
        banner=banner if verdict.get("exploratory") else "",
        resources=[
            *resources_lines(*spent, trials=(verdict.get("resources") or {}).get("trials")),
            *execution_lines(verdict.get("execution")),
        ],
        protocol=to_yaml(dict(protocol)) if protocol else "",
        **fields,
    )


def render_markdown(doc: Document, plots: Sequence[str | Path] = ()) -> str:
    """The Markdown report: headline, scope, banner, title, intro, plots (captioned), sections, method,
    resources, protocol."""
    # The verdict, then (a hard line break) what it was decided on: the report's first two lines.
    out = [f"**{doc.headline}**\\\n*Scope: {doc.scope}*\n\n" if doc.scope else f"**{doc.headline}**\n\n"]
    if doc.banner:
        out.append(f"> **{doc.banner}**\n\n")
    out.append(f"# {doc.title}\n\n")
    out += [f"{p}\n\n" for p in doc.intro]
    if plots or doc.plot_errors:
        out.append("## Plots\n\n")
        out += [f"![{Path(p).stem}]({Path(p).name})\n\n*{caption(p, doc.captions)}*\n\n" for p in plots]
        out += [f"- {e}\n" for e in doc.plot_errors]
        if doc.plot_errors:
            out.append("\n")
    for sec in doc.sections:
        out.append(f"## {sec.heading}\n\n")
        out += [f"{t}\n\n" for t in sec.text]
        out += [md_table(rows) + "\n" for rows in sec.tables]
        if sec.code is not None:
            out.append(md_fence(sec.code, "yaml") if sec.code else f"{sec.empty}\n")
    if doc.method:
        out.append("## Method\n\n" + "".join(f"- {line}\n" for line in doc.method))
    if doc.resources:
        out.append("\n## Resources\n\n" + "".join(f"- {line}\n" for line in doc.resources))
    if doc.protocol:
        out.append("\n## Protocol\n\n" + md_fence(doc.protocol, "yaml"))
    return "".join(out)


_HTML_TEMPLATE = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{{ doc.headline }} — {{ doc.title }}</title><style>
body{font-family:sans-serif;max-width:1250px;margin:2em auto;padding:0 1em}
table{border-collapse:collapse;margin-bottom:1em}td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}
td:first-child,th:first-child{text-align:left}
.study{font-size:1.3em;font-weight:bold;padding:.5em;border-left:6px solid {{ colors.get(doc.verdict, "#8a8f94") }}}
.banner{background:#fff4d6;border:1px solid #d9a400;padding:.6em;font-weight:bold}
{% for name, color in colors.items() %}.v-{{ name }}{color:{{ color }};font-weight:bold}
{% endfor %}img{max-width:100%}pre{background:#f6f6f6;padding:.6em;overflow-x:auto}
</style></head><body>
<p class="study" id="study-verdict">{% if doc.parts %}{{ doc.prefix }}{% for label, text in doc.parts %}<span class="v-{{ label }}">{{ text }}</span>{{ ", " if not loop.last }}{% endfor %}{% else %}{{ doc.headline }}{% endif %}</p>
{% if doc.scope %}<p class="scope" id="scope"><i>Scope: {{ doc.scope }}</i></p>
{% endif %}{% if doc.banner %}<p class="banner" id="exploratory">{{ doc.banner }}</p>
{% endif %}<h1>{{ doc.title }}</h1>
{% for p in doc.intro %}<p>{{ inline(p) }}</p>
{% endfor %}{% if images or doc.plot_errors %}<h2 id="plots">Plots</h2>
{% for name, uri, text in images %}<figure><img src="{{ uri }}" alt="{{ name }}"><figcaption>{{ text }}</figcaption></figure>
{% endfor %}{% for e in doc.plot_errors %}<p>{{ e }}</p>
{% endfor %}{% endif %}{% for sec in doc.sections %}<h2>{{ sec.heading }}</h2>
{% for t in sec.text %}<p>{{ t }}</p>
{% endfor %}{% for rows in sec.tables %}{% if rows %}<table>
<tr>{% for col in rows[0] %}<th>{{ col }}</th>{% endfor %}</tr>
{% for row in rows %}<tr>{% for col, val in row.items() %}{% if sec.is_label(col) %}<td class="v-{{ (val|string).split(" ")[0] }}">{{ val }}</td>{% else %}<td>{{ val }}</td>{% endif %}{% endfor %}</tr>
{% endfor %}</table>
{% endif %}{% endfor %}{% if sec.code is not none %}{% if sec.code %}<pre>{{ sec.code }}</pre>{% else %}<p>{{ sec.empty }}</p>{% endif %}
{% endif %}{% endfor %}{% if doc.method %}<h2>Method</h2><ul>
{% for line in doc.method %}<li>{{ line }}</li>
{% endfor %}</ul>
{% endif %}{% if doc.resources %}<h2>Resources</h2><ul>
{% for line in doc.resources %}<li>{{ line }}</li>
{% endfor %}</ul>
{% endif %}{% if doc.protocol %}<h2 id="protocol">Protocol</h2><pre>{{ doc.protocol }}</pre>
{% endif %}</body></html>
"""

_ENV = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)


def _inline(text: str) -> Any:
    """``**bold**`` and ```code``` of a paragraph as HTML, everything else escaped."""
    escaped = html.escape(text)
    escaped = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", escaped)
    escaped = re.sub(r"`([^`]+)`", r"<code>\1</code>", escaped)
    return Markup(escaped)


def render_html(doc: Document, images: Sequence[str | Path] = ()) -> str:
    """The HTML report (autoescaped); the headline is the body's first element; ``images`` (PNG
    files) are embedded as ``data:image/png;base64`` URIs."""
    return _ENV.from_string(_HTML_TEMPLATE).render(
        doc=doc,
        colors=COLORS,
        inline=_inline,
        images=[(Path(p).stem, data_uri(Path(p)), caption(p, doc.captions)) for p in images],
    )


_GATE_KEY = re.compile(r"^gate_entropy[/._](?:layer[_.]?)?(?P<layer>[A-Za-z0-9_.]+)$")


def plot_gate_entropy(
    history_by_trial: Mapping[str, Sequence[Mapping[str, Any]]], path: str | Path, *, max_trials: int = 12
) -> Path:
    """Gate entropy per layer over epochs, one panel per trial (AutoNorm search study).

    Args:
        history_by_trial: trial name -> its per-epoch results (``ray.tune.report`` dicts or MLflow
            metric rows). Per-layer keys look like ``gate_entropy/<layer>``, ``gate_entropy_<layer>``
            or ``gate_entropy.layer_<i>``; ``gate_entropy_mean`` (or a bare ``gate_entropy``) is drawn
            as the mean. The x axis is ``epoch`` when present, else the row number (1-based).
        path: the PNG to write.
        max_trials: panels beyond this are left out (the first ones in the mapping's order are kept).

    Raises:
        ValueError: no trial has any gate-entropy key.
    """
    import matplotlib
    from matplotlib.figure import Figure

    trials = [(name, list(rows)) for name, rows in history_by_trial.items()][:max_trials]
    series: list[tuple[str, dict[str, tuple[list[float], list[float]]]]] = []
    for name, rows in trials:
        per: dict[str, tuple[list[float], list[float]]] = {}
        for i, row in enumerate(rows):
            epoch: Any = row.get("epoch")
            x = float(epoch) if finite(epoch) else float(i + 1)
            for key, value in row.items():
                if key in ("gate_entropy_mean", "gate_entropy"):
                    label = "mean"
                else:
                    m = _GATE_KEY.match(key)
                    if m is None or m.group("layer") == "mean":
                        label = "mean" if m is not None else ""
                    else:
                        label = m.group("layer")
                if not label or not finite(value):
                    continue  # Tune's data frames hold NaN for epochs that did not report a key
                xs, ys = per.setdefault(label, ([], []))
                xs.append(x)
                ys.append(float(value))
        if per:
            series.append((name, per))
    if not series:
        raise ValueError(
            "no gate-entropy metrics found (keys like 'gate_entropy/<layer>' or 'gate_entropy_mean')"
        )
    ncols = min(3, len(series))
    nrows = math.ceil(len(series) / ncols)
    fig = Figure(figsize=(4.6 * ncols, 3.4 * nrows))
    axes = fig.subplots(nrows, ncols, squeeze=False, sharey=True)
    for ax, (name, per) in zip(axes.flat, series):
        layers = sorted((k for k in per if k != "mean"), key=lambda s: (len(s), s))
        cmap = matplotlib.colormaps["viridis"]
        for j, layer in enumerate(layers):
            xs, ys = per[layer]
            ax.plot(xs, ys, color=cmap(j / max(1, len(layers) - 1)), lw=1.2, label=f"layer {layer}")
        if "mean" in per:
            xs, ys = per["mean"]
            ax.plot(xs, ys, color="black", lw=2.0, ls="--", label="mean")
        ax.axhline(math.log(2), color="gray", lw=0.8, ls=":")
        ax.set_ylim(-0.02, max(math.log(2), *(max(v[1]) for v in per.values())) * 1.05)
        ax.set_title(str(name), fontsize=9)
        ax.set_xlabel("epoch")
        ax.grid(alpha=0.3)
        if len(layers) <= 12:
            ax.legend(fontsize=6, ncol=2)
    for ax in list(axes.flat)[len(series) :]:
        ax.set_visible(False)
    for ax in axes[:, 0]:
        ax.set_ylabel("gate entropy H (nats; ln 2 dotted)")
    fig.tight_layout()
    return save_figure(fig, path)
