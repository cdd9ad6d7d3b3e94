"""ml_debug.page: escaping at its one place, the page shell's policy, and the views on real inputs (real
logs from tests/data, real Flight Recorder dumps from tests/golden). The pages in a real browser, with a
real hung job: tests/cli/test_page.py."""

from __future__ import annotations

import base64
import hashlib
import re

from ml_debug.logs.triage import triage
from ml_debug.page import build, flight, shell, timeline
from ml_debug.page.text import esc
from ml_debug.stacks.flight import section
from tests.conftest import REPO
from tests.unit.stacks.test_fr_analysis import _dump, _record


def test_esc_makes_html_and_control_characters_text() -> None:
    assert esc('<script>alert("x")</script>') == "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;"
    assert esc("a'b&c") == "a&#x27;b&amp;c"
    assert esc("title\x1b]0;pwned\x07 \u202e") == "title\\e]0;pwned\\a \\u202e"  # as a terminal view shows them
    assert esc(3) == "3"


def test_the_page_allows_only_its_own_script_and_fetches_nothing() -> None:
    html = shell.render(shell.Page(title="t <b>", command="test", verdict="v <i>", tone="ok"))
    policy = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', html)
    assert policy is not None
    rules = dict(r.strip().split(" ", 1) for r in policy.group(1).split(";"))
    assert rules["default-src"] == "'none'" and rules["base-uri"] == "'none'"
    script = re.search(r"<script>(.*)</script>", html, re.S)
    assert script is not None
    digest = base64.b64encode(hashlib.sha256(script.group(1).encode()).digest()).decode()
    assert rules["script-src"] == f"'sha256-{digest}'"  # that script and no other (an injected one would not run)
    assert "<title>t &lt;b&gt;</title>" in html and ">v &lt;i&gt;</div>" in html


def test_logs_views_of_a_real_job_put_the_first_failure_first() -> None:
    report = triage([str(REPO / "tests" / "data" / "logs" / "launch_rank3_exits_silently")])
    lanes = timeline.lanes_html(report)
    # no primary failure here: only consequences, and rank 3 silent, which the page says in its own row
    assert report.verdict.primary is None and report.verdict.silent_ranks == "3"
    assert 'class="mark first"' not in lanes
    assert '<td>silent</td><td><span data-ranks="3">3</span></td>' in lanes
    page = build.logs_page(report)
    assert f'id="verdict">{esc(report.summary)}</div>' in page

    report = triage([str(REPO / "tests" / "data" / "logs" / "raise_then_sigabrt_at_exit")])
    lanes = timeline.lanes_html(report)
    assert lanes.count('class="mark first"') == 1
    rows = re.findall(r'<tr class="(\w*)"><td>([^<]+)</td><td><span data-ranks="([^"]*)"', lanes)
    assert rows[0] == ("outlier", rows[0][1], "2")  # the first failure's lane on top, marked


def test_flight_recorder_rows_part_where_ranks_stopped() -> None:
    fr = section([_record(0, _dump("fr-0.json")), _record(1, _dump("fr-1.json"))])
    rows = flight.group_rows(fr["ranks"])
    # rank 1 never issued collective #4, which rank 0 issued
    assert [(r["ranks"], r["done"], r["queued"]) for r in rows["0"]] == [("1", 3, 3), ("0", 3, 4)]
    view = flight.section(fr)
    assert view is not None and "◀ behind" in view.body and "never issued collective #4" in view.body
