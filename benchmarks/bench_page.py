"""The HTML page and the speedscope export of a 16k-rank job: their sizes against the goal, and the time
to draw them beside the time of the analysis they show.

    python benchmarks/run.py page                  # 16,384 ranks
    PAGE_SIZES=1024,16384 python benchmarks/run.py page
    PAGE_KEEP=/tmp python benchmarks/run.py page   # and keep the pages there, to look at

Uses the scale benchmark's synthetic job (benchmarks/bench_scale.py: 8 ranks a node, one rank stuck in
its data loader, a 3D layout's Flight Recorder with a rank that never issued a collective and a desync),
read by ``stacks.verdict.read_node_document`` and analysed by ``build_report`` as dump-stacks does, and
its logs (one file per rank, 4 KiB each here) triaged as ``mldebug logs`` does. Each size runs in a fresh
child process. Goal: the page of a 16k-rank job well under 10 MB (``SIZE_GOAL_MB``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

from benchmarks.common import Result

SIZES = tuple(int(x) for x in os.environ.get("PAGE_SIZES", "16384").split(","))
SIZE_GOAL_MB = 10.0
LOG_BYTES = 4096


def child(n: int) -> dict[str, Any]:
    from benchmarks.bench_scale import PER_NODE, culprits, fr_node, host_of, stacks_node, write_logs
    from ml_debug.logs.triage import triage
    from ml_debug.page import build
    from ml_debug.stacks.fr_analysis import EntryPool
    from ml_debug.stacks.verdict import build_report, read_node_document

    pool = EntryPool()
    nodes, processes, records = [], [], []
    for i in range(n // PER_NODE):
        doc = read_node_document(json.loads(json.dumps({"nodes": [{"host": host_of(i * PER_NODE), "ok": True,
                                                                   "targets": PER_NODE, "dumped": PER_NODE}],
                                                        **stacks_node(i, n), **fr_node(i, n)})),
                                 host_of(i * PER_NODE), pool=pool)
        nodes += doc.nodes
        processes += doc.processes
        records += doc.fr_records
    t0 = time.process_time()
    result = build_report(nodes, processes, {"samples": 2}, fr_records=records)
    analysis = time.process_time() - t0
    t0 = time.process_time()
    page = build.stacks_page(result)
    drawn = time.process_time() - t0
    t0 = time.process_time()
    scope = build.speedscope_text(result)
    scoped = time.process_time() - t0
    root = tempfile.mkdtemp(prefix="bench-page-logs-")
    try:
        write_logs(root, n, LOG_BYTES)
        report = triage([root])
        t0 = time.process_time()
        logs_page = build.logs_page(report)
        logs_drawn = time.process_time() - t0
    finally:
        shutil.rmtree(root, ignore_errors=True)
    keep = os.environ.get("PAGE_KEEP")  # a directory: the pages are written there, to look at
    if keep:
        for name, text in ((f"dump-stacks-{n}.html", page), (f"logs-{n}.html", logs_page),
                           (f"dump-stacks-{n}.speedscope.json", scope)):
            with open(os.path.join(keep, name), "w", encoding="utf-8") as f:
                f.write(text)
    stuck = culprits(n)["stack"]
    return {"n": n, "analysis": analysis, "page_cpu": drawn, "page_mb": len(page.encode()) / 1e6,
            "speedscope_cpu": scoped, "speedscope_mb": len(scope.encode()) / 1e6, "logs_page_cpu": logs_drawn,
            "logs_page_mb": len(logs_page.encode()) / 1e6, "suspect_named": f"rank {stuck} " in page,
            "logs_rank_named": f"rank {culprits(n)['logs']} " in logs_page}


def run() -> list[Result]:
    out = []
    for n in SIZES:
        proc = subprocess.run([sys.executable, "-c", f"import json, benchmarks.bench_page as b; "
                               f"print(json.dumps(b.child({n})))"], capture_output=True, text=True, timeout=1800,
                              cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr[-2000:])
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        ok = r["page_mb"] < SIZE_GOAL_MB and r["logs_page_mb"] < SIZE_GOAL_MB
        out.append(Result(f"page: dump-stacks page size / {SIZE_GOAL_MB:.0f} MB goal, {n} ranks",
                          r["page_mb"] / SIZE_GOAL_MB,
                          f"{r['page_mb']:.2f} MB (suspect named: {r['suspect_named']}); speedscope "
                          f"{r['speedscope_mb']:.2f} MB; logs page {r['logs_page_mb']:.2f} MB (first failure named: "
                          f"{r['logs_rank_named']}): " + ("PASS" if ok else "FAIL")))
        out.append(Result(f"page: drawing / analysis CPU time, {n} ranks", r["page_cpu"] / max(r["analysis"], 1e-9),
                          f"page {r['page_cpu']:.2f} s, speedscope {r['speedscope_cpu']:.2f} s, logs page "
                          f"{r['logs_page_cpu']:.2f} s; dump-stacks analysis {r['analysis']:.2f} s"))
    return out
