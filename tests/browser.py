"""A real browser for the tests of mldebug's HTML pages: Debian's chromium, driven headless by Selenium
through Debian's chromedriver (never a downloaded one: Selenium Manager is not asked, nothing is fetched).

The fixture `browser` starts one Chromium per test module and stops it after, checking that its driver
exited. Under MLDEBUG_REQUIRE_REAL=1 a missing chromium, chromedriver or selenium FAILS the test.

`Page.open(path)` loads a page file and returns what the tests assert on: the console's messages and
the resources the page fetched (none may be). `MLDEBUG_SCREENSHOTS=DIR` makes `Page.shot(name)` write a
small PNG (a palette of 128 colours) there: how the screenshots in docs/commands/ are made.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import require, require_module, wait_until

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
SHOTS = os.environ.get("MLDEBUG_SCREENSHOTS")


@dataclass
class Loaded:
    """What one page load left: the console messages and the URLs of everything it fetched."""

    console: list[dict[str, Any]]
    fetched: list[str]

    @property
    def errors(self) -> list[dict[str, Any]]:
        return [m for m in self.console if m.get("level") in ("SEVERE", "WARNING")]


class Browser:
    """A started Chromium and its driver."""

    def __init__(self, driver: Any) -> None:
        self.driver = driver

    def open(self, path: Path) -> Loaded:
        self.driver.get(path.resolve().as_uri())
        self.driver.execute_script("return document.readyState")  # the load has finished (get waits for it)
        fetched = self.driver.execute_script(
            "return performance.getEntriesByType('resource').map(function (e) { return e.name; })")
        return Loaded(console=self.driver.get_log("browser"), fetched=list(fetched))

    def js(self, script: str, *args: Any) -> Any:
        return self.driver.execute_script(script, *args)

    def shot(self, name: str, height: int = 900) -> None:
        """With MLDEBUG_SCREENSHOTS=DIR: the page's first `height` pixels as DIR/<name>.png, small."""
        if not SHOTS:
            return
        from PIL import Image

        self.driver.set_window_size(1200, height)
        out = Path(SHOTS) / f"{name}.png"
        out.parent.mkdir(parents=True, exist_ok=True)
        self.driver.save_screenshot(str(out))
        Image.open(out).convert("RGB").quantize(colors=128).save(out, optimize=True)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    """Chromium, headless, started for this module's tests and stopped after them."""
    require(os.access(CHROMIUM, os.X_OK) and shutil.which(CHROMIUM), "chromium (apt-get install chromium)")
    require(os.access(CHROMEDRIVER, os.X_OK), "chromedriver (apt-get install chromium-driver)")
    webdriver = require_module("selenium.webdriver", "pip install selenium (the test extra)")
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    profile = tmp_path_factory.mktemp("chromium-profile")
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1200,900", f"--user-data-dir={profile}", "--no-first-run",
                "--disable-background-networking", "--disable-component-update"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(CHROMEDRIVER)
    driver = webdriver.Chrome(options=opts, service=service)
    proc = service.process
    try:
        yield Browser(driver)
    finally:
        driver.quit()
        if proc is not None:
            proc.wait(timeout=30)
        # every Chromium process of this profile is gone too
        wait_until(lambda: not _with_arg(f"--user-data-dir={profile}"), 30, "the browser's processes to end")


def _with_arg(arg: str) -> list[int]:
    """Pids whose command line holds `arg`."""
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if arg.encode() in (d / "cmdline").read_bytes().split(b"\0"):
                    pids.append(int(d.name))
            except OSError:
                pass
    return pids
