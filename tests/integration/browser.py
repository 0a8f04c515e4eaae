"""Debian's chromium driven headless by Selenium, for tests that look at what a user sees.

The browser and its driver are the system's (``scripts/setup.sh --browser``, which ``scripts/test.sh``
runs, installs the Debian packages ``chromium`` and ``chromium-driver``); both paths are given to Selenium explicitly and
``SE_OFFLINE`` is set, so Selenium Manager never downloads a browser or a driver.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")

_T = TypeVar("_T")


@contextlib.contextmanager
def headless_chromium(workdir: Path, *, width: int = 1600, height: int = 1000) -> Iterator[Any]:
    """A headless chromium ``webdriver.Chrome`` with its profile and driver log under ``workdir``.

    Raises (never skips) when the browser is missing: the suite's setup installs it.
    """
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    for binary in (CHROMIUM, CHROMEDRIVER):
        if not os.access(binary, os.X_OK):
            raise FileNotFoundError(
                f"{binary} is missing: run scripts/setup.sh --browser (apt-get install chromium chromium-driver)"
            )
    workdir.mkdir(parents=True, exist_ok=True)
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in (
        "--headless=new",
        "--no-sandbox",  # root in a container: chromium's sandbox needs user namespaces
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-extensions",
        f"--window-size={width},{height}",
        f"--user-data-dir={workdir / 'profile'}",
    ):
        options.add_argument(arg)
    service = Service(executable_path=str(CHROMEDRIVER), log_output=str(workdir / "chromedriver.log"))
    offline = os.environ.get("SE_OFFLINE")
    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager, if anything reaches it, must not download
    try:
        driver = webdriver.Chrome(service=service, options=options)
    finally:
        if offline is None:
            os.environ.pop("SE_OFFLINE", None)
        else:
            os.environ["SE_OFFLINE"] = offline
    try:
        driver.set_page_load_timeout(60)
        yield driver
    finally:
        driver.quit()  # stops the browser and the chromedriver process this call started


def wait_until(
    probe: Callable[[], _T | None], *, timeout: float, what: str, driver: Any = None, shot: Path | None = None
) -> _T:
    """Poll ``probe`` until it returns something truthy; return it.

    On timeout, save a screenshot to ``shot`` (when given) and raise with ``what`` and the page's
    visible text, so a failure says what the user saw instead.
    """
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            value = probe()
            if value:
                return value
        except Exception as err:  # stale elements while the page re-renders
            last = err
        time.sleep(0.25)
    text = ""
    if driver is not None:
        if shot is not None:
            with contextlib.suppress(Exception):
                driver.save_screenshot(str(shot))
        with contextlib.suppress(Exception):
            text = driver.execute_script("return document.body ? document.body.innerText : ''")[-3000:]
    raise AssertionError(
        f"timed out after {timeout:.0f} s waiting for {what} (last error {last!r}); page:\n{text}"
    )
