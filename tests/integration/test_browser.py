"""What a user sees in the MLflow UI of a finished batch-size study, in a real browser.

A smoke batch-size study runs on a local Ray with a cheap planted trial function (every phase, the
analysis and the report are the real ones), into a storage directory whose MLflow store is sqlite.
An ``mlflow server`` then serves that store and its artifacts on loopback, and Debian's chromium,
driven headless by Selenium, opens it the way a user would:

* the runs table: one study run; expanding it shows its phase runs, expanding those their trial
  runs, each nested (indented) under its parent, every trial name readable in full;
* the study run's page: the verdict tags;
* the artifact viewer: ``report.html`` rendered (in a sandboxed iframe from a blob URL) with every
  plot loaded, its figures before the protocol;
* the experiment's own page: MLflow's training view (its runs table, the classic-ML side bar), not
  the GenAI one;
* the chart view of the confirmatory phase's summary runs, the phase run hidden, full screen:
  ``test_accuracy_mean`` drawn against the batch size (the step), one line per arm, every line in
  sight. Its screenshot is docs/compare-in-mlflow.png (refreshed with AUTONORM_UPDATE_DOCS_SCREENSHOT=1).

Every page is saved as a screenshot under the test's tmp dir. The tests share one study and one
browser, but no page state: each starts with the MLflow UI unloaded and its browser storage cleared
(the ``driver`` fixture), so they pass in any order.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest

from studies.kinds import StudyOutcome
from studies.running import run_study_spec
from tests.integration.browser import headless_chromium, wait_until
from tests.services import MlflowServer, start_mlflow_server
from tests.studies.test_batchsize_study import planted_trial, smoke_spec

pytestmark = [pytest.mark.slow, pytest.mark.services, pytest.mark.ray]

REPO_ROOT = Path(__file__).resolve().parents[2]

#: The runs table's rows (the pinned left part holds the run name), and a row's expand/collapse button.
ROWS = ".ag-pinned-left-cols-container [role=row]"
EXPANDER = "button[data-component-id$='runnamecellrenderer.tsx_46']"
NAME_CELL = "[col-id='attributes.`Run Name`']"
NAME_LINK = "a[href*='/runs/']"
TAG = "[role=status][data-component-id$='keyvaluetag.tsx_60']"
LOAD = 90.0  # seconds for a page of the UI to render on a busy 2-core machine


@dataclass(frozen=True)
class Study:
    """A finished study as MLflow holds it, and a server showing it."""

    out: StudyOutcome
    server: MlflowServer
    experiment_id: str
    study_run: Any
    phases: dict[str, Any]  # run id -> run
    trials: dict[str, Any]  # run id -> run
    summaries: dict[str, Any]  # run id -> run (one per arm under the confirmatory phase run)
    arms: tuple[str, ...]

    def url(self, fragment: str) -> str:
        return f"{self.server.tracking_uri}/#/experiments/{self.experiment_id}{fragment}"


class _Shifted:
    """A trial session whose reports carry ``test_accuracy`` shifted by ``delta``."""

    def __init__(self, session: Any, delta: float) -> None:
        self.session, self.delta = session, delta

    def report(self, metrics: dict[str, Any], *args: Any, **kwargs: Any) -> None:
        self.session.report(
            {**metrics, "test_accuracy": metrics["test_accuracy"] + self.delta}, *args, **kwargs
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(self.session, name)


#: In the planted world both controls score alike, so one control's line would hide the other's in
#: the chart: ``linear_batchnorm`` is drawn below ``linear`` here (its slope stays 0).
CONTROL_GAP = {"linear_batchnorm": -0.03}


def shown_apart_trial(config: dict[str, Any], session: Any) -> None:
    """The planted trial, each arm's ``test_accuracy`` shifted by its :data:`CONTROL_GAP`."""
    delta = CONTROL_GAP.get(config["model"]["layer"]["type"], 0.0)
    planted_trial(config, cast(Any, _Shifted(session, delta)) if delta else session)


@pytest.fixture(scope="module")
def study(local_ray: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Study]:
    from mlflow import MlflowClient

    storage = tmp_path_factory.mktemp("browser_study")
    with pytest.MonkeyPatch.context() as env:
        for key in list(os.environ):
            if key.startswith(("AWS_", "RAY_", "MLFLOW_")):
                env.delenv(key)
        backend = f"sqlite:///{storage}/mlflow.db"
        spec = smoke_spec(
            f"storage_path={storage}",
            f"tracking.uri={backend}",
            "lr_tuning.low=0.1",
            "lr_tuning.high=10.0",
            "lr_tuning.points=3",
            "lr_tuning.max_extensions=0",  # two phases (tuning, confirmatory): what this test reads
            "analysis.adequacy.check=false",  # (no adequacy phase: a third phase run)
            "analysis.n_boot=200",
            "analysis.n_perm=99",
            "max_concurrent=1",  # one trial at a time: one trial actor per phase (an actor process costs seconds of CPU to start)
        )
        out = run_study_spec(spec, trainable=shown_apart_trial, progress=False)
        assert out.parent_run_id is not None and out.verdict is not None
        client = MlflowClient(tracking_uri=backend)
        study_run = client.get_run(out.parent_run_id)
        exp = study_run.info.experiment_id
        phases = {
            r.info.run_id: r
            for r in client.search_runs(
                [exp], filter_string=f"tags.mlflow.parentRunId = '{out.parent_run_id}'"
            )
        }
        trials = {
            r.info.run_id: r
            for r in client.search_runs(
                [exp], filter_string="tags.`autonorm.role` = 'trial'", max_results=1000
            )
        }
        summaries = {
            r.info.run_id: r
            for r in client.search_runs([exp], filter_string="tags.`autonorm.role` = 'summary'")
        }
        assert len(phases) == 2 and len(trials) == spec.total_trials and len(summaries) == len(spec.arms)
        with start_mlflow_server(
            backend, f"file://{storage}/mlartifacts", {}, directory=storage / "mlflow-server"
        ) as server:
            yield Study(out, server, exp, study_run, phases, trials, summaries, tuple(spec.arms))


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    # Tall enough that the runs table renders every row of the smoke study at once (ag-grid only
    # puts rows near the viewport into the page).
    with headless_chromium(tmp_path_factory.mktemp("chromium"), width=1600, height=2400) as driver:
        yield driver


@pytest.fixture
def driver(study: Study, browser: Any) -> Any:
    """The module's browser as a new user's would be: no MLflow UI loaded, nothing it remembers.

    The tests share one Chromium (starting one costs seconds), and with it what the MLflow UI keeps
    in the browser: the page itself (a ``get`` that changes only the ``#/...`` route is a navigation
    inside the loaded app, which keeps its expanded rows, search filter, chosen view), and what it
    stores per origin (``localStorage``: the search filter, column widths, expanded rows, the
    GenAI / training view switch; ``sessionStorage``; cookies). So each test starts on a page of the
    server's origin that is not the UI (``/health``: leaving the UI unloads it), with that storage
    cleared; its own ``get`` of a UI page then loads the app afresh.
    """
    browser.switch_to.default_content()
    browser.get(f"{study.server.tracking_uri}/health")
    browser.execute_script("window.localStorage.clear(); window.sessionStorage.clear();")
    browser.delete_all_cookies()
    assert browser.execute_script("return localStorage.length + sessionStorage.length") == 0
    assert not browser.get_cookies()
    return browser


def _shot(driver: Any, path: Path) -> None:
    assert driver.save_screenshot(str(path)), path


def _close_assistant(driver: Any) -> None:
    """The MLflow Assistant side panel opens by default and takes a third of the width."""
    for button in driver.find_elements(
        "css selector", "button[data-component-id='mlflow.assistant.chat_panel.close']"
    ):
        with contextlib.suppress(Exception):
            button.click()


def _visible_rows(driver: Any) -> list[dict[str, Any]]:
    """The runs table's rows in display order: run id, name, x of the name (nesting indents it).

    One script for the whole table: a WebDriver round trip per cell is slow on a busy machine.
    """
    rows: list[dict[str, Any]] = driver.execute_script(
        """
        return Array.from(document.querySelectorAll(arguments[0])).map(row => {
            const link = row.querySelector(arguments[1]);
            return {id: row.getAttribute('row-id'), index: Number(row.getAttribute('row-index')),
                    name: link ? link.innerText : null, x: link ? link.getBoundingClientRect().x : null,
                    row: row, link: link};
        });
        """,
        ROWS,
        f"{NAME_CELL} {NAME_LINK}",
    )
    assert all(r["name"] is not None for r in rows), "a runs table row without a run name link"
    return sorted(rows, key=lambda r: r["index"])


def _expand(driver: Any, run_id: str, children: set[str], shot: Path) -> list[dict[str, Any]]:
    """Expand ``run_id``'s row (unless its children already show) and wait for them all."""

    def shown() -> list[dict[str, Any]] | None:
        rows = _visible_rows(driver)
        return rows if children <= {r["id"] for r in rows} else None

    if shown() is None:
        row = next(r for r in _visible_rows(driver) if r["id"] == run_id)
        row["row"].find_element("css selector", EXPANDER).click()
    return wait_until(
        shown, timeout=LOAD, what=f"the child runs of {run_id} in the runs table", driver=driver, shot=shot
    )


def test_runs_table_nests_phases_under_the_study_and_trials_under_their_phase(
    study: Study, driver: Any, tmp_path: Path
) -> None:
    children_of = {**study.trials, **study.summaries}
    total = 1 + len(study.phases) + len(children_of)
    driver.get(study.url("/runs"))
    rows = wait_until(
        lambda: _visible_rows(driver),
        timeout=LOAD,
        what="the runs table",
        driver=driver,
        shot=tmp_path / "x.png",
    )
    _close_assistant(driver)
    wait_until(
        lambda: f"{total} matching runs" in driver.find_element("tag name", "body").text,
        timeout=LOAD,
        what=f"'{total} matching runs'",
        driver=driver,
        shot=tmp_path / "count.png",
    )
    _shot(driver, tmp_path / "1-runs-collapsed.png")
    # Collapsed, the table shows the study run alone, by its name, with an expand button.
    rows = _visible_rows(driver)
    assert [(r["id"], r["name"]) for r in rows] == [(study.out.parent_run_id, study.study_run.info.run_name)]
    assert rows[0]["row"].find_element("css selector", EXPANDER).is_displayed()

    rows = _expand(driver, study.out.parent_run_id, set(study.phases), tmp_path / "x.png")  # type: ignore[arg-type]
    assert rows[0]["id"] == study.out.parent_run_id and len(rows) == 1 + len(study.phases)
    study_x = rows[0]["x"]
    for row in rows[1:]:
        assert row["name"] == study.phases[row["id"]].info.run_name
        assert row["x"] > study_x, f"phase run {row['name']} is not indented under the study run"
    _shot(driver, tmp_path / "2-runs-phases.png")

    for phase_id in study.phases:
        children = {t for t, run in children_of.items() if run.data.tags["mlflow.parentRunId"] == phase_id}
        assert children
        _expand(driver, phase_id, children, tmp_path / "x.png")
    rows = _visible_rows(driver)
    _shot(driver, tmp_path / "3-runs-expanded.png")
    assert len(rows) == total and {r["id"] for r in rows} == {
        study.out.parent_run_id,
        *study.phases,
        *children_of,
    }
    # Each trial row sits in the block of rows right under its own phase, one indent deeper.
    current_phase: dict[str, Any] | None = None
    for row in rows[1:]:
        if row["id"] in study.phases:
            current_phase = row
            assert row["x"] > study_x
            continue
        assert current_phase is not None, f"trial {row['name']} shown above every phase"
        assert children_of[row["id"]].data.tags["mlflow.parentRunId"] == current_phase["id"], row["name"]
        assert row["x"] > current_phase["x"], f"trial {row['name']} is not indented under its phase"


def _widen_name_column(driver: Any, pixels: int) -> None:
    from selenium.webdriver.common.action_chains import ActionChains

    header = driver.find_element("css selector", f".ag-header-cell{NAME_CELL}")
    before = header.rect["width"]
    handle = header.find_element("css selector", ".ag-header-cell-resize")
    ActionChains(driver).click_and_hold(handle).move_by_offset(pixels, 0).release().perform()
    wait_until(lambda: header.rect["width"] > before + pixels / 2, timeout=10, what="the wider column")


_ARM_B = re.compile(r"(?<![A-Za-z0-9])B(\d+)(?![0-9])")


def test_trial_run_names_are_readable(study: Study, driver: Any, tmp_path: Path) -> None:
    driver.get(study.url("/runs"))
    wait_until(lambda: _visible_rows(driver), timeout=LOAD, what="the runs table", driver=driver)
    _close_assistant(driver)
    _expand(driver, study.out.parent_run_id, set(study.phases), tmp_path / "x.png")  # type: ignore[arg-type]
    children_of = {**study.trials, **study.summaries}
    for phase_id in study.phases:
        children = {t for t, run in children_of.items() if run.data.tags["mlflow.parentRunId"] == phase_id}
        _expand(driver, phase_id, children, tmp_path / "x.png")
    # A user drags the Run Name column wider; then every name shows in full (no ellipsis).
    _widen_name_column(driver, 250)
    _shot(driver, tmp_path / "4-runs-names.png")
    rows = {r["id"]: r for r in _visible_rows(driver)}
    names = []
    for run_id, run in study.trials.items():
        row = rows[run_id]
        name = row["name"]
        names.append(name)
        assert name == run.info.run_name, (name, run.info.run_name)
        clipped = driver.execute_script(
            "const a = arguments[0], cell = arguments[0].closest('[role=gridcell]');"
            "const r = a.getBoundingClientRect(), c = cell.getBoundingClientRect();"
            "return a.scrollWidth > a.clientWidth + 1 || r.right > c.right + 1;",
            row["link"],
        )
        assert not clipped, f"trial run name {name!r} is cut off in the runs table"
        assert not name.startswith("tune_entry"), name  # Tune's default name says nothing to a user
        arm = run.data.params["model.layer.type"]
        batch = run.data.params["training.batch_size"]
        if _ARM_B.search(name):  # a name that gives the batch size gives the right one, and the arm
            assert f"B{batch}" in _ARM_B.findall(name) or batch in _ARM_B.findall(name), (name, batch)
            assert arm in name, (name, arm)
    assert len(names) == len(study.trials)


def test_study_run_page_shows_the_verdict_tags(study: Study, driver: Any, tmp_path: Path) -> None:
    verdict = study.out.verdict
    assert verdict is not None
    driver.get(study.url(f"/runs/{study.out.parent_run_id}"))

    def tags() -> dict[str, str] | None:
        found = {}
        for tag in driver.find_elements("css selector", TAG):
            if tag.is_displayed():
                key = tag.get_attribute("title")
                text = tag.text.replace("\n", "")
                assert text.startswith(f"{key}:"), text
                found[key] = text[len(key) + 1 :].strip()
        return found if "verdict/study" in found else None

    shown = wait_until(
        tags, timeout=LOAD, what="the study run's tags", driver=driver, shot=tmp_path / "x.png"
    )
    _close_assistant(driver)
    tag = driver.find_element("css selector", f"{TAG}[title='verdict/study']")
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", tag)
    _shot(driver, tmp_path / "5-study-run.png")
    body = driver.find_element("tag name", "body").text
    assert study.study_run.info.run_name in body
    assert shown["verdict/study"] == verdict["study_verdict"]
    for arm, label in verdict["verdict"].items():
        assert shown[f"verdict/{arm}"] == label, arm
    for arm, label in verdict["controls"].items():
        assert shown[f"control/{arm}"] == label, arm
    # ... and each is readable in full: neither its key nor its value is cut off with an ellipsis.
    keys = [
        "verdict/study",
        *(f"verdict/{a}" for a in verdict["verdict"]),
        *(f"control/{a}" for a in verdict["controls"]),
    ]
    for key in keys:
        element = driver.find_element("css selector", f"{TAG}[title='{key}']")
        clipped = driver.execute_script(
            "return Array.from(arguments[0].querySelectorAll('span'))"
            ".filter(s => s.scrollWidth > s.clientWidth + 1).map(s => s.innerText);",
            element,
        )
        assert not clipped, f"tag {key} is cut off on the run page: {clipped}"
    # The page lists the phase runs as the study run's children.
    for phase in study.phases.values():
        assert phase.info.run_name in body


def test_report_html_renders_with_every_plot_loaded(study: Study, driver: Any, tmp_path: Path) -> None:
    verdict = study.out.verdict
    assert verdict is not None
    driver.get(study.url(f"/runs/{study.out.parent_run_id}/artifacts"))
    node = "[data-testid=artifact-tree-node][artifact-name='{}']"
    report = wait_until(
        lambda: driver.find_element("css selector", node.format("report.html")),
        timeout=LOAD,
        what="report.html in the artifact tree",
        driver=driver,
        shot=tmp_path / "x.png",
    )
    _close_assistant(driver)
    listed = {
        e.get_attribute("artifact-name")
        for e in driver.find_elements("css selector", "[data-testid=artifact-tree-node]")
    }
    assert {"report.html", "report.md", "verdict.json", "forest.png", "metric_vs_batch_size.png"} <= listed
    report.click()
    frame = wait_until(
        lambda: driver.find_element("css selector", "iframe.mlflow-html-iframe"),
        timeout=LOAD,
        what="the HTML artifact viewer",
        driver=driver,
        shot=tmp_path / "x.png",
    )
    assert frame.get_attribute("src").startswith("blob:")
    assert frame.rect["width"] > 300 and frame.rect["height"] > 200, frame.rect
    _shot(driver, tmp_path / "6-report.png")
    driver.switch_to.frame(frame)
    try:
        # The report opens with the study verdict, the one a user reads first.
        heading = wait_until(
            lambda: driver.find_element("css selector", "#study-verdict").text or None,
            timeout=LOAD,
            what="the report's study verdict",
        )
        assert heading.startswith(f"Study verdict: {verdict['study_verdict']}"), heading
        assert driver.find_element("tag name", "h1").text.endswith(study.study_run.info.run_name)

        def images() -> list[dict[str, Any]] | None:
            found = driver.execute_script(
                "return Array.from(document.images).map(i => ({alt: i.alt, src: i.src.slice(0, 22),"
                " complete: i.complete, w: i.naturalWidth, h: i.naturalHeight,"
                " shown: i.getBoundingClientRect().width}));"
            )
            return found if found and all(i["complete"] for i in found) else None

        imgs = wait_until(images, timeout=LOAD, what="the report's images to finish loading")
        assert {"metric_vs_batch_size", "forest"} <= {i["alt"] for i in imgs}, imgs
        for img in imgs:
            assert img["src"] == "data:image/png;base64,", img
            assert img["w"] > 0 and img["h"] > 0, f"plot {img['alt']} did not load"
            assert img["shown"] > 100, f"plot {img['alt']} is not shown at a readable size"
        # It shows before it tells: every figure sits above the protocol, on the page as rendered.
        tops = driver.execute_script(
            "const y = e => e.getBoundingClientRect().top + window.scrollY;"
            "return {images: Array.from(document.images).map(y),"
            " protocol: y(document.getElementById('protocol')), first_table: y(document.querySelector('table'))};"
        )
        assert tops["images"] and max(tops["images"]) < tops["protocol"], tops
        assert max(tops["images"]) < tops["first_table"], tops
        first = driver.find_element("css selector", "img[alt='metric_vs_batch_size']")
        driver.execute_script("arguments[0].scrollIntoView({block: 'start'})", first)
    finally:
        driver.switch_to.default_content()
    _shot(driver, tmp_path / "7-report-plot.png")


def test_experiment_opens_in_the_training_view(study: Study, driver: Any, tmp_path: Path) -> None:
    """The link a study prints for its experiment (``mlflow_links``) opens MLflow's training view
    ("Model training"): the runs table under the view's "Runs" heading, the side bar's Runs / Models
    / Traces -- none of the GenAI view's Overview, Judges or Prompts."""
    from workers.tracking import mlflow_links

    (link,) = mlflow_links(study.server.tracking_uri, study.experiment_id)
    assert study.experiment_id in link
    driver.get(link)
    wait_until(
        lambda: _visible_rows(driver),
        timeout=LOAD,
        what="the training view's runs table",
        driver=driver,
        shot=tmp_path / "x.png",
    )
    _close_assistant(driver)
    _shot(driver, tmp_path / "8-experiment.png")
    assert re.search(rf"/experiments/{study.experiment_id}/runs\b", driver.current_url), driver.current_url
    headings = [h.text.strip() for h in driver.find_elements("css selector", "h1, h2") if h.is_displayed()]
    assert "Runs" in headings, headings
    nav = driver.find_element("tag name", "body").text.splitlines()
    for genai_only in ("Overview", "Judges", "Prompts", "Evaluation runs", "Training runs"):
        assert genai_only not in nav, (genai_only, nav[:40])
    assert {"Runs", "Models", "Traces"} <= set(nav)
    rows = _visible_rows(driver)
    assert rows[0]["id"] == study.out.parent_run_id and {r["id"] for r in rows} <= {
        study.out.parent_run_id,
        *study.phases,
        *study.trials,
        *study.summaries,
    }


def test_summary_runs_chart_draws_one_line_per_arm_against_batch_size(
    study: Study, driver: Any, tmp_path: Path
) -> None:
    """What docs/compare-in-mlflow.md tells a user to do: filter the summary runs of the confirmatory
    phase, open the chart view, expand the phase's row and hide the phase run (its eye), find the
    ``test_accuracy_mean`` chart and open it full screen. It then draws one line per arm and no other
    (its legend names the arms, not the phase), one point per batch size (the step), every point
    inside the plot and clear of the chart's toolbar (plotly's modebar, always shown here), no line
    on top of another. Its screenshot is the recipe's figure."""
    from urllib.parse import quote

    from workers.tracking import mlflow_links

    (confirm,) = [r for r in study.phases.values() if r.info.run_name.startswith("confirm-")]
    (link,) = mlflow_links(study.server.tracking_uri, study.experiment_id)
    query = f"tags.`autonorm.role` = 'summary' and tags.`autonorm.phase` = '{confirm.info.run_name}'"
    driver.get(f"{link}&searchFilter={quote(query)}&compareRunsMode=CHART")
    # The filter matches the summary runs; the runs list shows them under their phase run, which a
    # user expands (unless the UI shows it expanded already).
    wait_until(
        lambda: confirm.info.run_name in driver.find_element("tag name", "body").text.splitlines() or None,
        timeout=LOAD,
        what="the confirmatory phase's row",
        driver=driver,
        shot=tmp_path / "x.png",
    )
    _close_assistant(driver)

    def listed() -> set[str]:
        return set(driver.find_element("tag name", "body").text.splitlines())

    if not set(study.arms) <= listed():
        driver.find_element("css selector", EXPANDER).click()
    wait_until(
        lambda: set(study.arms) <= listed() or None,
        timeout=LOAD,
        what="the summary runs under their phase",
        driver=driver,
        shot=tmp_path / "x.png",
    )
    # The phase run is drawn too (an empty line, named in the legend) until it is hidden: the eye at
    # the left of its row ("Hide run"). Its summary runs stay shown.
    phase_row = driver.find_element("css selector", f"{ROWS}[row-id='{confirm.info.run_id}']")
    phase_row.find_element("css selector", f"label:has({VISIBILITY})").click()

    def hidden_phase() -> dict[str, bool] | None:
        shown = _shown_runs(driver)
        expected = {run_id: True for run_id in study.summaries} | {confirm.info.run_id: False}
        return shown if shown == expected else None

    wait_until(
        hidden_phase,
        timeout=LOAD,
        what="the phase run hidden, its summary runs shown",
        driver=driver,
        shot=tmp_path / "x.png",
    )
    # The chart view has a section per metric prefix; the search box narrows it to the one chart.
    search = wait_until(
        lambda: driver.find_element("css selector", "input[placeholder='Search metric charts']"),
        timeout=LOAD,
        what="the chart search box",
        driver=driver,
        shot=tmp_path / "x.png",
    )
    search.send_keys("test_accuracy_mean")
    card = "[data-testid='experiment-view-compare-runs-card']"

    def chart() -> list[dict[str, Any]] | None:
        found: list[dict[str, Any]] = driver.execute_script(
            "return Array.from(document.querySelectorAll(arguments[0]))"
            ".filter(c => c.innerText.split('\\n')[0].trim() === 'test_accuracy_mean')"
            ".map(c => ({text: c.innerText, card: c, lines: Array.from(c.querySelectorAll('.scatterlayer .trace'))"
            ".map(t => t.querySelectorAll('.point').length).filter(n => n > 0)}));",
            card,
        )
        return found if found and found[0]["lines"] else None

    (shown,) = wait_until(
        chart, timeout=LOAD, what="the chart of test_accuracy_mean", driver=driver, shot=tmp_path / "x.png"
    )
    # One line per arm (the phase run has no such metric: no line), each through every batch size.
    n_sizes = len(study.out.verdict["batch_sizes"])  # type: ignore[index]
    assert shown["lines"] == [n_sizes] * len(study.arms), shown["lines"]
    _shot(driver, tmp_path / "9-summary-chart.png")
    # The card is small (its top line runs under the toolbar): full screen, in a window of a screen's
    # height (the module's browser is taller, for the runs table's rows).
    size = driver.get_window_size()
    driver.set_window_size(1600, 1300)
    try:
        shown["card"].find_element(
            "css selector", "[data-component-id='fullscreen_button_chartcard']"
        ).click()
        full = wait_until(
            lambda: _settled(lambda: _full_screen_chart(driver, "test_accuracy_mean")),
            timeout=LOAD,
            what="the chart full screen",
            driver=driver,
            shot=tmp_path / "x.png",
        )
        _shot(driver, tmp_path / "10-summary-chart-full-screen.png")
        # Its legend: the arms, nothing else (no phase run).
        assert sorted(full["legend"]) == sorted(f"{arm} (test_accuracy_mean)" for arm in study.arms), full
        lines = {t["name"]: t["points"] for t in full["traces"] if t["points"]}
        assert sorted(lines) == sorted(study.arms), full["traces"]
        left, top, width, height = full["plot"]
        bar_left, bar_top, bar_width, bar_height = full["modebar"]
        radius = 4  # a marker's, in pixels
        for arm, points in lines.items():
            assert len(points) == n_sizes, (arm, points)
            for x, y in points:
                assert left <= x <= left + width and top <= y <= top + height, (arm, (x, y), full["plot"])
                under_bar = (
                    bar_left - radius <= x <= bar_left + bar_width + radius
                    and bar_top - radius <= y <= bar_top + bar_height + radius
                )
                assert not under_bar, (arm, (x, y), "under the chart's toolbar", full["modebar"])
        for a, b in ((a, b) for a in lines for b in lines if a < b):  # no line drawn over another
            assert max(abs(p[1] - q[1]) for p, q in zip(lines[a], lines[b], strict=True)) > 2 * radius, (a, b)
        dialog = driver.find_element("css selector", "[role=dialog] .du-bois-light-modal-content")
        box = {k: round(v) for k, v in dialog.rect.items()}
        from PIL import Image

        # The full-screen chart: the recipe's figure. A test run never rewrites a tracked file:
        # AUTONORM_UPDATE_DOCS_SCREENSHOT=1 puts it in docs/, else it stays in tmp_path.
        figure = tmp_path / "compare-in-mlflow.png"
        if os.environ.get("AUTONORM_UPDATE_DOCS_SCREENSHOT") == "1":
            figure = REPO_ROOT / "docs" / "compare-in-mlflow.png"
        with Image.open(tmp_path / "10-summary-chart-full-screen.png") as image:
            ratio = image.width / driver.execute_script("return window.innerWidth")
            crop = [box["x"], box["y"], box["x"] + box["width"], box["y"] + box["height"]]
            image.crop(tuple(round(v * ratio) for v in crop)).save(figure)
        with Image.open(figure) as saved:
            assert saved.width > 800 and saved.height > 400, saved.size
    finally:
        driver.set_window_size(size["width"], size["height"])


#: A run's visibility toggle in the runs list (the eye; checked: the run is drawn in the charts).
VISIBILITY = "input.is-visibility-toggle-checkbox"


def _shown_runs(driver: Any) -> dict[str, bool]:
    """Each listed run's id and whether the charts draw it (its eye is open)."""
    shown: dict[str, bool] = driver.execute_script(
        "const out = {}; document.querySelectorAll(arguments[0]).forEach(row => {"
        " const box = row.querySelector(arguments[1]); if (box) out[row.getAttribute('row-id')] = box.checked; });"
        " return out;",
        ROWS,
        VISIBILITY,
    )
    return shown


def _settled(read: Any, pause_s: float = 0.3) -> Any:
    """``read()``'s answer once two reads ``pause_s`` apart agree (a chart still animating or being
    laid out moves between them); ``None`` until then."""
    first = read()
    if first is None:
        return None
    time.sleep(pause_s)
    return first if read() == first else None


def _full_screen_chart(driver: Any, metric: str) -> dict[str, Any] | None:
    """The full-screen chart's plot area and toolbar (x, y, width, height in page pixels), its legend
    entries, and per trace its run's name and its points' centres; ``None`` until it is drawn."""
    found: dict[str, Any] | None = driver.execute_script(
        """
        const dialog = document.querySelector('[role=dialog]');
        const plot = dialog && dialog.querySelector('.js-plotly-plot');
        if (!plot || !plot.data) return null;
        const box = e => (b => [b.x, b.y, b.width, b.height])(e.getBoundingClientRect());
        const centre = e => (b => [b.x + b.width / 2, b.y + b.height / 2])(e.getBoundingClientRect());
        const traces = Array.from(plot.querySelectorAll('.scatterlayer .trace'));
        return {
          plot: box(plot.querySelector('.nsewdrag')),
          modebar: box(plot.querySelector('.modebar')),
          legend: Array.from(dialog.querySelectorAll('span'))
            .filter(s => s.children.length === 0 && s.innerText.trim().endsWith(' (' + arguments[0] + ')'))
            .map(s => s.innerText.trim()),
          traces: plot.data.map((t, i) => ({name: t.name,
            points: traces[i] ? Array.from(traces[i].querySelectorAll('.point')).map(centre) : []})),
        };
        """,
        metric,
    )
    if not found or not any(t["points"] for t in found["traces"]) or not found["legend"]:
        return None
    # Drawn but not laid out yet: the toolbar still has no size (seen in CI as a point "under" a
    # 0x0 toolbar at the same spot). Wait for the layout, not for luck.
    if min(found["modebar"][2:]) <= 0 or min(found["plot"][2:]) <= 0:
        return None
    return found
