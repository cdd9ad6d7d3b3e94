"""The exporter's result and decisions, called directly: the shipped alert rules (real promtool), the dashboard's and
the docs' metric names, and the stall and job decisions (the exporter on real jobs: tests/cli/test_exporter.py)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time

from tests.conftest import REPO, require

RULES = REPO / "deploy" / "prometheus" / "mldebug-rules.yml"
RULE_TESTS = REPO / "tests" / "prometheus" / "mldebug-rules.test.yml"
DASHBOARD = REPO / "deploy" / "grafana" / "mldebug-dashboard.json"
DOCS = REPO / "docs" / "commands" / "exporter.md"
METRIC = re.compile(r"\bmldebug_[a-z0-9_]+")


# -- the shipped rules, dashboard and docs -----------------------------------------------------------------
def test_promtool_checks_the_shipped_rules_and_their_unit_tests_pass() -> None:
    promtool = shutil.which("promtool")
    require(promtool, "promtool (Debian package prometheus)")
    assert promtool is not None
    check = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0 and "SUCCESS: 5 rules found" in check.stdout, check.stdout + check.stderr
    unit = subprocess.run([promtool, "test", "rules", str(RULE_TESTS)], capture_output=True, text=True, timeout=60)
    assert unit.returncode == 0 and "SUCCESS" in unit.stdout, unit.stdout + unit.stderr
    config = subprocess.run([promtool, "check", "config", str(REPO / "deploy" / "prometheus" / "prometheus.yml")],
                            capture_output=True, text=True, timeout=60)
    assert config.returncode == 0, config.stdout + config.stderr


def test_every_query_of_the_dashboard_and_the_rules_names_a_served_metric() -> None:
    from ml_debug.exporter.render import served_names

    served = served_names()
    dash = json.loads(DASHBOARD.read_text())
    panels = [p for p in dash["panels"] if p["type"] != "row"]
    exprs = [t["expr"] for p in panels for t in p["targets"]]
    assert all(p["targets"] for p in panels) and len(exprs) >= 20
    exprs += [v["query"]["query"] for v in dash["templating"]["list"] if v["type"] == "query"]
    for expr in exprs:
        names = METRIC.findall(expr)
        assert names, f"a query without an mldebug metric: {expr}"
        assert set(names) <= served, f"{expr}: not served: {set(names) - served}"
    in_rules = set(METRIC.findall(RULES.read_text()))
    assert in_rules and in_rules <= served, in_rules - served


def test_the_docs_page_lists_every_metric_with_its_labels() -> None:
    from ml_debug.exporter.render import METRICS, PROCESS_METRICS

    rows = {line.split("|")[1].strip(" `"): line for line in DOCS.read_text().splitlines()
            if line.startswith("| `mldebug_")}
    for m in (*METRICS, *PROCESS_METRICS):
        assert m.name in rows, f"{m.name} is not in {DOCS.name}"
        for label in m.labels:
            assert f"`{label}`" in rows[m.name], f"{m.name}: label {label} not documented"
        assert m.kind in rows[m.name], f"{m.name}: type {m.kind} not documented"
    assert set(rows) == {m.name for m in (*METRICS, *PROCESS_METRICS)}, "a documented metric that is not served"


# -- stall decisions: watch's Tracker, the exporter's grace per rank ----------------------------------------
def test_the_exporter_states_the_trackers_stall_decision_with_a_grace_per_rank() -> None:
    from ml_debug.exporter.options import ExporterOptions
    from ml_debug.exporter.result import rank_values
    from ml_debug.exporter.sources import is_exited, make_tracker

    tracker = make_tracker(ExporterOptions(stall=10, grace=30, interval=1))

    from ml_debug.sampling.sample import NodeInfo, NodeSample, RankSample

    def sample(*rows: tuple[int, int, float]) -> NodeSample:
        return NodeSample(node=NodeInfo(host="n1"),
                          ranks=[RankSample(pid=pid, label=f"rank {rank}", rank=rank, local_rank=rank, world_size=2,
                                            state="S", cpu_pct=cpu, rss_bytes=1 << 20) for pid, rank, cpu in rows])

    t0 = time.time()  # the Tracker counts from its own start
    s = sample((11, 0, 90.0), (12, 1, 90.0))
    tracker.add_node("local", s, t0)
    tracker.evaluate(t0)
    for t in range(1, 41):  # rank 1 goes idle at once, rank 0 keeps working
        s = sample((11, 0, 90.0), (12, 1, 0.0))
        tracker.add_node("local", s, t0 + t)
        tracker.evaluate(t0 + t)
        ranks = {r.rank: r for r in rank_values(tracker, s, t0 + t, job_id="j", grace=30, is_exited=is_exited)}
        track = next(r for r in tracker.ranks.values() if r.rank == 1)
        assert ranks["1"].stalled == (track.status == "stalled" and t >= 30), t
        assert not ranks["0"].stalled
    assert ranks["1"].stalled and ranks["1"].seconds_since_progress == 40.0 and ranks["1"].job_id == "j"
    # the rank ends: its series go at once
    s = sample((11, 0, 90.0))
    tracker.add_node("local", s, t0 + 41)
    tracker.evaluate(t0 + 41)
    assert [r.rank for r in rank_values(tracker, s, t0 + 41, job_id="j", grace=30, is_exited=is_exited)] == ["0"]


def test_each_job_on_a_node_is_judged_apart_and_labelled_by_its_own_id() -> None:
    """Two jobs on one node: their ranks are split by job before the exporter gives each job its own Tracker
    (so a slow job's ranks are never stragglers beside a fast job's), with the job_id from --job, SLURM_JOB_ID,
    TORCHELASTIC_RUN_ID or the launcher."""
    from types import SimpleNamespace

    from ml_debug.exporter.result import job_id_of, split_by_job

    targets = [SimpleNamespace(pid=1, env={"SLURM_JOB_ID": "77", "TORCHELASTIC_RUN_ID": "x"}, launcher_pid=9),
               SimpleNamespace(pid=2, env={"TORCHELASTIC_RUN_ID": "run-a"}, launcher_pid=9),
               SimpleNamespace(pid=3, env={"TORCHELASTIC_RUN_ID": "none"}, launcher_pid=8),
               SimpleNamespace(pid=4, env={}, launcher_pid=None)]
    from ml_debug.sampling.sample import NodeInfo, NodeSample, RankSample

    sample = NodeSample(node=NodeInfo(host="n1"), ranks=[RankSample(pid=p, label=f"pid {p}") for p in (1, 2, 3, 4, 5)])
    jobs = split_by_job(sample, targets, None)
    assert {j: [r.pid for r in s.ranks] for j, s in jobs.items()} == {"77": [1], "run-a": [2], "pid8": [3],
                                                                      "": [4, 5]}
    assert list(split_by_job(sample, targets, "mine")) == ["mine"]
    assert job_id_of({"SLURM_JOB_ID": "5"}, 3, "over") == "over"
