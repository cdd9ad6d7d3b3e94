"""The HTML pages (`dump-stacks --html`, `logs --html`, watch's incident.html) in a real browser, and the
speedscope export, on real inputs: a real hung gloo job dumped by real py-spy, real logs from tests/data,
real Flight Recorder dumps (tests/golden/flight_recorder).

The job's file name carries HTML (`<img onerror=...>`, `<script>`): on every page it must read as text
and never run. Chromium (Debian's, headless) is started for this module and stopped after it
(tests/browser.py). `MLDEBUG_SCREENSHOTS=docs/img` also writes the screenshots of docs/commands/."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import jsonschema
import pytest

from tests.browser import Browser, browser  # noqa: F401 - the fixture
from tests.conftest import REPO, mldebug, require
from tests.rig import fixtures


class By:
    """Selenium's locator strings (its `By`), here so that collecting this module needs no selenium: the
    `browser` fixture requires it (the GPU session collects every module to run the gpu-marked ones)."""

    ID = "id"
    CSS_SELECTOR = "css selector"
    TAG_NAME = "tag name"


# a job's file name with HTML in it: an image whose onerror would run, and a script tag
EVIL = "train<img src=x onerror=window.pwned=1><script>window.pwned=2.py"

# speedscope's file format (https://www.speedscope.app/file-format-schema.json, from its
# src/lib/file-format-spec.ts): the parts a sampled profile must have
SPEEDSCOPE = {
    "type": "object",
    "required": ["$schema", "shared", "profiles"],
    "properties": {
        "$schema": {"const": "https://www.speedscope.app/file-format-schema.json"},
        "shared": {"type": "object", "required": ["frames"], "properties": {"frames": {"type": "array", "items": {
            "type": "object", "required": ["name"], "properties": {
                "name": {"type": "string"}, "file": {"type": "string"}, "line": {"type": "number"},
                "col": {"type": "number"}}}}}},
        "profiles": {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["type", "name", "unit", "startValue", "endValue", "samples", "weights"],
            "properties": {"type": {"const": "sampled"}, "name": {"type": "string"},
                           "unit": {"enum": ["none", "nanoseconds", "microseconds", "milliseconds", "seconds",
                                             "bytes"]},
                           "startValue": {"type": "number"}, "endValue": {"type": "number"},
                           "samples": {"type": "array", "items": {"type": "array", "items": {"type": "integer",
                                                                                            "minimum": 0}}},
                           "weights": {"type": "array", "items": {"type": "number"}}}}},
        "name": {"type": "string"}, "activeProfileIndex": {"type": "number"}, "exporter": {"type": "string"},
    },
}


def _tools() -> None:
    require(shutil.which("py-spy") or (Path(__import__("sys").executable).parent / "py-spy").exists(), "py-spy")


def _self_contained(html: str) -> None:
    """Nothing the page could fetch: no src/href/url() at all, and the job's HTML only escaped."""
    # (the job's own "src=x" is in the page, escaped, as text: not an attribute)
    assert not re.search(r"\b(?:src|href|action|srcset)\s*=\s*[\"']?[^\"'\s>]", html.replace("src=x", "")), \
        "the page names something to fetch"
    assert "url(" not in html and "@import" not in html
    assert "<img" not in html and "<script>window" not in html
    assert html.count("<script>") == 1  # the page's own script; the data blocks are typed application/json


def _loads_cleanly(b: Browser, page: Path) -> None:
    loaded = b.open(page)
    assert loaded.errors == [], loaded.errors  # no console error: nothing blocked, no exception
    assert loaded.fetched == [], loaded.fetched  # no network request of any kind
    assert b.js("return document.documentElement.className") == ""  # the page's script ran (it drops "nojs")
    assert b.js("return window.pwned === undefined && document.images.length === 0")  # the job's HTML did not


def _shown(b: Browser, css: str) -> list:
    return [e for e in b.driver.find_elements(By.CSS_SELECTOR, css) if e.is_displayed()]


def test_dump_stacks_and_watch_pages_of_a_real_hang_in_a_browser(hung_job, browser: Browser,  # noqa: F811
                                                                 tmp_path: Path, monkeypatch) -> None:
    _tools()
    worker = tmp_path / EVIL
    shutil.copy(fixtures.WORKER, worker)
    monkeypatch.setattr(fixtures, "WORKER", worker)
    job = hung_job(nranks=2, odd_rank=1, odd_function="load_batch")
    host, pid = job.ranks[1]
    page, scope = tmp_path / "hang.html", tmp_path / "hang.speedscope.json"
    proc = mldebug("dump-stacks", "--local", "--pid", str(job.launcher_pids[0]), "--html", str(page),
                   "--speedscope", str(scope), timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert f"--html: wrote {page}" in proc.stderr
    html = page.read_text()
    _self_contained(html)
    assert "train&lt;img src=x onerror=window.pwned=1&gt;&lt;script&gt;window.pwned=2.py" in html

    _loads_cleanly(browser, page)
    verdict = browser.driver.find_element(By.ID, "verdict")
    assert verdict.is_displayed()
    assert verdict.text.startswith(f"suspect: rank 1 ({host}, pid {pid}) in load_batch ({EVIL}:"), verdict.text
    verdict_text = verdict.text
    # the suspect's branch is open and marked, its below-Python line beside it
    (leaf,) = _shown(browser, ".leaf.suspect")
    assert "suspect" in leaf.text and f"below Python: rank 1 ({host}): blocked in clock_nanosleep()" in leaf.text
    assert all(d.get_attribute("open") is not None for d in browser.driver.find_elements(By.CSS_SELECTOR,
                                                                                          "details.onpath"))
    # rank 0's branch (the all_reduce) is collapsed; a click on it opens it
    closed = [d for d in browser.driver.find_elements(By.CSS_SELECTOR, "details.branch")
              if d.get_attribute("open") is None]
    assert len(closed) == 1 and "[rank 0]" in closed[0].text
    assert not _shown(browser, "details.branch:not([open]) .leaf")
    browser.shot("dump-stacks")
    closed[0].find_element(By.TAG_NAME, "summary").click()
    assert closed[0].get_attribute("open") is not None
    (waiting,) = _shown(browser, ".leaf:not(.suspect)")
    assert "waits in all_reduce (torch/distributed/distributed_c10d.py:" in waiting.text and "below" not in waiting.text
    # the rank finder (JavaScript): rank 1 is outlined where it appears; closing all, then finding, reopens it
    browser.driver.find_element(By.CSS_SELECTOR, "[data-act=close-all]").click()
    assert not _shown(browser, ".leaf")
    browser.driver.find_element(By.ID, "find-rank").send_keys("1")
    hits = _shown(browser, ".hit")
    assert hits and any("[rank 1]" in h.text for h in hits)
    assert _shown(browser, ".leaf.suspect")

    # the icicle (JavaScript): one cell per branch, as wide as its processes; a click opens that branch
    browser.driver.find_element(By.CSS_SELECTOR, "[data-act=close-all]").click()
    browser.driver.find_element(By.CSS_SELECTOR, "[data-act=icicle]").click()
    cells = {c.text: c for c in _shown(browser, "#icicle .cell")}
    assert set(cells) == {"<module>", "load_batch", "all_reduce"}, set(cells)
    assert "mine" in (cells["load_batch"].get_attribute("class") or "")
    assert cells["<module>"].size["width"] > 1.9 * cells["all_reduce"].size["width"]  # 2 processes against 1
    cells["all_reduce"].click()
    (waiting,) = _shown(browser, ".leaf:not(.suspect)")
    assert "waits in all_reduce" in waiting.text

    # without JavaScript: the verdict, the suspect's branch and the tables read the same; only the tools go
    browser.driver.execute_cdp_cmd("Emulation.setScriptExecutionDisabled", {"value": True})
    try:
        browser.driver.get(page.resolve().as_uri())
        assert browser.driver.find_element(By.ID, "verdict").text == verdict_text
        assert "below Python" in _shown(browser, ".leaf.suspect")[0].text
        assert _shown(browser, "#suspects table") and not _shown(browser, ".toolbar")
        assert browser.driver.find_element(By.TAG_NAME, "html").get_attribute("class") == "nojs"
    finally:
        browser.driver.execute_cdp_cmd("Emulation.setScriptExecutionDisabled", {"value": False})

    # speedscope: the file format, the whole job first (weight: processes), then each rank
    doc = json.loads(scope.read_text())
    jsonschema.validate(doc, SPEEDSCOPE)
    frames = doc["shared"]["frames"]
    for prof in doc["profiles"]:
        assert len(prof["samples"]) == len(prof["weights"]) and prof["endValue"] == sum(prof["weights"])
        assert all(0 <= i < len(frames) for s in prof["samples"] for i in s)
    whole = doc["profiles"][0]
    assert sorted(whole["weights"]) == [1, 1] and len(doc["profiles"]) == 3
    leaves = {frames[s[-1]]["name"]: frames[s[-1]] for s in whole["samples"]}
    assert leaves["load_batch"]["file"] == EVIL  # JSON keeps the exact name
    assert frames[whole["samples"][0][0]]["name"] == "<module>"  # the root first
    assert doc["name"] == "mldebug dump-stacks: suspect rank 1"

    # watch's bundle gains incident.html (and --html FILE, a copy): the same views, the watcher's ranks too
    bundle, copy = tmp_path / "bundle", tmp_path / "incident-copy.html"
    w = mldebug("watch", "--local", "--pid", str(job.launcher_pids[0]), "--now", "--samples", "1",
                "--bundle-dir", str(bundle), "--html", str(copy), timeout=180)
    assert w.returncode == 1, w.stderr[-3000:]
    incident = bundle / "incident.html"
    assert incident.read_text() == copy.read_text()
    summary = json.loads((bundle / "summary.json").read_text())["result"]
    _self_contained(incident.read_text())
    _loads_cleanly(browser, incident)
    assert browser.driver.find_element(By.ID, "verdict").text == summary["summary"]
    assert f"load_batch ({EVIL}:" in summary["summary"]
    ranks = browser.driver.find_element(By.ID, "ranks")
    assert ranks.is_displayed()
    marked = {tr.find_element(By.CSS_SELECTOR, "td").text: tr.get_attribute("class")
              for tr in ranks.find_elements(By.CSS_SELECTOR, "tbody tr")}
    assert marked == {"1": "outlier", "0": ""}, marked  # the culprit first, marked
    assert _shown(browser, ".leaf.suspect")
    browser.shot("watch")


def test_logs_page_of_real_logs_in_a_browser(browser: Browser, tmp_path: Path) -> None:  # noqa: F811
    # a real job's logs (tests/data/logs/README.md), the failing rank's message carrying HTML
    logs = tmp_path / "logs"
    shutil.copytree(REPO / "tests" / "data" / "logs" / "raise_then_sigabrt_at_exit", logs)
    console = logs / "console.log"
    text = console.read_text()
    assert "bad batch on rank 2" in text
    console.write_text(text.replace("bad batch on rank 2", "bad <script>window.pwned=3</script> batch on rank 2"))
    page = tmp_path / "logs.html"
    proc = mldebug("logs", str(logs), "--html", str(page))
    assert proc.returncode == 1, proc.stderr
    html = page.read_text()
    _self_contained(html)
    _loads_cleanly(browser, page)
    verdict = browser.driver.find_element(By.ID, "verdict")
    assert verdict.is_displayed()
    assert verdict.text.startswith("first failure: rank 2 (") and \
        "ValueError: bad <script>window.pwned=3</script> batch on rank 2" in verdict.text
    # the timeline: the first failure on rank 2's lane, the consequences on ranks 0 and 1 after it
    lanes = {r.find_element(By.CSS_SELECTOR, "td:nth-child(2)").text: r
             for r in browser.driver.find_elements(By.CSS_SELECTOR, "#timeline tbody tr")}
    assert set(lanes) == {"0", "1", "2"}
    first = lanes["2"].find_elements(By.CSS_SELECTOR, ".mark.first")
    assert len(first) == 1 and "bad <script>" in (first[0].get_attribute("title") or "")
    later = [m for r in ("0", "1") for m in lanes[r].find_elements(By.CSS_SELECTOR, ".mark.secondary")]
    assert later and all(_left(m) > _left(first[0]) for m in later)
    browser.shot("logs")
    # a folded section opens with a click
    tracebacks = browser.driver.find_element(By.CSS_SELECTOR, "#tracebacks > details")
    assert tracebacks.get_attribute("open") is None
    tracebacks.find_element(By.TAG_NAME, "summary").click()
    assert tracebacks.get_attribute("open") is not None
    assert any("ValueError" in e.text for e in _shown(browser, "#tracebacks pre"))


def _left(mark) -> float:
    return float(mark.value_of_css_property("left").removesuffix("px"))


def test_flight_recorder_view_of_real_dumps_in_a_browser(browser: Browser, tmp_path: Path) -> None:  # noqa: F811
    """The desync of `mldebug train --inject desync@step=3,rank=1` (tests/golden/flight_recorder/desync-*.json)."""
    from ml_debug.page import flight, shell
    from ml_debug.stacks.flight import section
    from tests.unit.stacks.test_fr_analysis import _dump, _record

    fr = section([_record(0, _dump("desync-0.json")), _record(1, _dump("desync-1.json"))])
    view = flight.section(fr)
    assert view is not None
    page = tmp_path / "fr.html"
    page.write_text(shell.render(shell.Page(title="flight recorder", command="test", verdict=fr["evidence"],
                                            tone="problem", sections=[view])))
    _loads_cleanly(browser, page)
    rows = {r.find_element(By.CSS_SELECTOR, "td.who").text: r
            for r in browser.driver.find_elements(By.CSS_SELECTOR, "table.grid tbody tr")}
    assert set(rows) == {"0 (1)", "1 (1)"}
    (odd,) = rows["1 (1)"].find_elements(By.CSS_SELECTOR, "td.desync")
    assert odd.get_attribute("title") == "#23: desync" and "outlier" in (rows["1 (1)"].get_attribute("class") or "")
    assert not rows["0 (1)"].find_elements(By.CSS_SELECTOR, "td.desync")
    assert "enqueued #23 gloo:all_reduce" in rows["1 (1)"].text and "enqueued #23 gloo:all_gather" in \
        rows["0 (1)"].text


@pytest.mark.parametrize("bad", ["", "/nonexistent-dir/x.html", "/proc/mldebug-page.html"])
def test_a_page_that_cannot_be_written_is_exit_2_with_a_hint(bad: str) -> None:
    """Refused before the logs are read; /proc passes the checks and refuses the write: said after the report."""
    proc = mldebug("logs", str(REPO / "tests" / "data" / "logs" / "raise_then_sigabrt_at_exit"), "--html", bad)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("mldebug: error: --html ") and "\nhint: " in proc.stderr
    assert ("first failure: rank 2" in proc.stdout) == bad.startswith("/proc/")


def test_postmortem_page_of_dumps_and_logs_in_an_archive_in_a_browser(browser: Browser, tmp_path: Path) -> None:  # noqa: F811
    """`mldebug logs job.tgz --html`, the archive holding a job's console and its ranks' Flight Recorder dumps
    (tests/golden/flight_recorder/desync-*.json, as fr-N.json): the post-mortem's verdict, what each source says,
    the logs' timeline and the Flight Recorder's grid with the odd rank's cell, on one page."""
    import tarfile

    golden = REPO / "tests" / "golden" / "flight_recorder"
    with tarfile.open(tmp_path / "job.tgz", "w:gz") as tar:
        for r in (0, 1):
            tar.add(golden / f"desync-{r}.json", arcname=f"job/fr-{r}.json")
        tar.add(REPO / "tests" / "data" / "logs" / "raise_then_sigabrt_at_exit" / "console.log", arcname="job/console.log")
    page = tmp_path / "pm.html"
    proc = mldebug("logs", str(tmp_path / "job.tgz"), "--html", str(page))
    assert proc.returncode == 1, proc.stderr
    html = page.read_text()
    _self_contained(html)
    _loads_cleanly(browser, page)
    assert browser.driver.find_element(By.ID, "verdict").text.startswith("rank ")
    said = [e.text for e in _shown(browser, "#sources li")]
    assert any(s.startswith("logs: ") and "bad batch on rank 2" in s for s in said), said
    assert any(s.startswith("flight-recorder: ") and "desync" in s for s in said), said
    assert _shown(browser, "#timeline tbody tr")  # the logs' own view, below
    (odd,) = browser.driver.find_elements(By.CSS_SELECTOR, "#flight-recorder td.desync")
    assert odd.get_attribute("title") == "#23: desync"
