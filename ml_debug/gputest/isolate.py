"""`mldebug gpu-test --isolate`: every GPU alone, then in pairs (0,1),(2,3).., then the shifted pairs
(1,2),(3,4)..(n-1,0), to point at one bad GPU or one bad link. On CPU the same schedule runs over
rank slots. The seed does this by hand with CUDA_VISIBLE_DEVICES=i,j.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ml_debug.core.errors import ExitCode


def schedule(n: int) -> list[tuple[int, ...]]:
    """Singles, pairs, then complementary (shifted) pairs, without repeats."""
    groups: list[tuple[int, ...]] = [(i,) for i in range(n)]
    seen: set[frozenset[int]] = set()
    for start in (0, 1):
        for i in range(start, n, 2):
            pair = (i, (i + 1) % n)
            if n > 1 and pair[0] != pair[1] and frozenset(pair) not in seen and (start == 1 or i + 1 < n):
                seen.add(frozenset(pair))
                groups.append(pair)
    return groups


@dataclass
class IsolateEntry:
    members: list[int]
    ok: bool
    exit_code: int
    summary: str
    seconds: float


@dataclass
class IsolateResult:
    ok: bool
    summary: str
    exit_code: int
    mode: str
    members: list[int]
    entries: list[IsolateEntry]
    suspects: list[str] = field(default_factory=list)
    hints: list[str] = field(default_factory=list)


def analyse(members: Sequence[int], entries: Sequence[IsolateEntry], kind: str) -> IsolateResult:
    """Bad alone -> that device; good alone but in failing pairs -> its links (or the pair's link)."""
    alone_bad = [e.members[0] for e in entries if len(e.members) == 1 and not e.ok]
    pair_bad = [tuple(e.members) for e in entries if len(e.members) == 2 and not e.ok]
    suspects: list[str] = [f"{kind} {m} fails alone" for m in alone_bad]
    rest = [p for p in pair_bad if not set(p) & set(alone_bad)]
    counts: dict[int, int] = {}
    for p in rest:
        for m in p:
            counts[m] = counts.get(m, 0) + 1
    blamed = {m for m, c in counts.items() if c > 1}
    for m in sorted(blamed):
        suspects.append(f"{kind} {m} fails in every pair it joins ({counts[m]}): its link or its peer path")
    for p in rest:
        if not set(p) & blamed:
            suspects.append(f"the link between {kind}s {p[0]} and {p[1]}")
    partial = any(e.exit_code == ExitCode.PARTIAL for e in entries if not e.ok)
    ok = all(e.ok for e in entries)
    code = ExitCode.OK if ok else (ExitCode.PARTIAL if partial and not suspects else ExitCode.PROBLEM)
    good = sum(1 for e in entries if e.ok)
    summary = (f"{good}/{len(entries)} groups OK over {len(members)} {kind}s" if ok else
               f"{good}/{len(entries)} groups OK; suspect: " + "; ".join(suspects or ["unclear (see groups)"]))
    hints = [] if ok else [
        "rerun the failing group alone: CUDA_VISIBLE_DEVICES=<ids> mldebug gpu-test (ids from the table)"
        if kind == "GPU" else "rerun a failing group with --debug to see each rank's error",
        "check the bad device with `mldebug health --level 2`; for links, `nvidia-smi topo -m` and "
        "`mldebug allreduce-bench`"]
    return IsolateResult(ok, summary, int(code), "isolate", list(members), list(entries), suspects, hints)


def run_isolation(members: Sequence[int], gpu: bool, worker_argv: Sequence[str], rdzv_timeout_s: float,
                  run_timeout_s: float) -> IsolateResult:
    """Launch one gpu-test per group of the schedule and judge the groups together."""
    import time

    from ml_debug.core import output
    from ml_debug.dist.spawn import SpawnSpec, spawn

    entries: list[IsolateEntry] = []
    groups = [tuple(members[i] for i in g) for g in schedule(len(members))]
    with tempfile.TemporaryDirectory(prefix="mldebug-isolate-") as tmp, \
            output.progress(len(groups), "isolate") as bar:
        for k, group in enumerate(groups):
            report = Path(tmp) / f"group{k}.json"
            env = {"MLDEBUG_DEVICE_IDS": ",".join(map(str, group))}
            if gpu:
                env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, group))
            t0 = time.monotonic()
            launched = spawn(["gpu-test", *worker_argv, "--report-to", str(report)],
                              SpawnSpec(len(group), rdzv_timeout_s=rdzv_timeout_s, run_timeout_s=run_timeout_s,
                                         cpu_ranks=not gpu), env=env)
            seconds = round(time.monotonic() - t0, 2)
            if report.exists():
                doc = json.loads(report.read_text())["result"]
                entries.append(IsolateEntry(list(group), bool(doc["ok"]), int(doc["exit_code"]),
                                            doc["summary"], seconds))
            else:
                entries.append(IsolateEntry(list(group), False, launched.code or int(ExitCode.PARTIAL),
                                            f"no verdict (rank exit codes {launched.exit_codes})", seconds))
            bar.advance(1)
    return analyse(members, entries, "GPU" if gpu else "slot")


def visible_members(count: int) -> list[int]:
    """Physical ids of the visible GPUs (CUDA_VISIBLE_DEVICES when it lists integers)."""
    listed = [x.strip() for x in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if x.strip()]
    if listed and all(x.isdigit() for x in listed) and len(listed) >= count:
        return [int(x) for x in listed[:count]]
    return list(range(count))


def render(result: IsolateResult, console: object) -> None:
    from rich.markup import escape
    from rich.table import Table

    table = Table(show_edge=False, pad_edge=False, header_style="bold")
    for col in ("group", "status", "time", "summary"):
        table.add_column(col, no_wrap=col != "summary")
    for e in result.entries:
        status = "[green]ok[/]" if e.ok else "[bold red]FAIL[/]"
        table.add_row(",".join(map(str, e.members)), status, f"{e.seconds:.1f}s", escape(e.summary))
    console.print(table)  # type: ignore[attr-defined]
    mark = "[bold green]OK[/]" if result.ok else "[bold red]PROBLEM[/]"
    console.print(f"{mark} {escape(result.summary)}", soft_wrap=True)  # type: ignore[attr-defined]
    for h in result.hints:
        console.print(f"  hint: {escape(h)}", soft_wrap=True)  # type: ignore[attr-defined]
