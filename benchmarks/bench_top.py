"""`mldebug top` at 1, 16 and 64 nodes: round time, client CPU, agent CPU, start-up.

Targets are the rig's sshd daemons (4 loopback ports + 3 netns nodes) repeated under distinct
ssh_config aliases, as in bench_remote.py: every target is its own ssh connection running its own
agent. The client is the library itself (:class:`ml_debug.sampling.streams.Client`), and every round it
also builds the snapshot and draws the live view's screen (50 lines) into a string.

    python benchmarks/run.py top

Round time: agents sample on wall-clock ticks; a round's time is from its tick to the arrival of the
last node's sample of that tick (sampling + ssh + parsing), median over the measured rounds. The
goal is T(64) / T(1) <= 3. Client CPU: all of the client's threads (paramiko's transport threads
included) over the measured rounds, in % of one core; the goal is under 10 % at 64 nodes. Beside
it, what top replaces: a poll loop that opens a new ssh to every node each round.

All agents and every sshd run on this machine's cores, beside the client: on a cluster each node
samples on its own CPU, so the figures here are an upper bound on the client's share of the work.
"""

from __future__ import annotations

import functools
import io
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.bench_remote import _config
from benchmarks.common import Result

INTERVAL = 1.0
ROUNDS = 8
SETTLE = 2  # ticks left out after the last node's first sample (connections still settling)


def measure(cfg: Path, names: list[str]) -> dict[str, float]:
    from rich.console import Console

    from ml_debug.remote.targets import Target, TargetSpec
    from ml_debug.sampling.streams import Client, Feed
    from ml_debug.top.options import TopOptions
    from ml_debug.top.render import LiveView
    from ml_debug.top.result import snapshot

    n = len(names)
    spec = TargetSpec(kind="ssh", targets=[Target(x) for x in names], ssh_config=cfg, connect_timeout_s=60,
                      remote_python=sys.executable, max_parallel=64)
    # --pattern that matches nothing: the agents sample the node, its GPUs (none here) and no ranks
    opts = TopOptions(interval=INTERVAL, timeout=60, pattern="^no-such-process-bench-top$")
    arrivals: dict[int, dict[str, float]] = {}

    def complete(tick: int) -> bool:
        return len(arrivals.get(tick, {})) == n

    def on_sample(feed: Feed) -> None:
        assert feed.sample is not None
        arrivals.setdefault(feed.sample.tick or 0, {})[feed.label] = time.time()

    t0 = time.perf_counter()
    with Client(spec, opts.sampler(), on_sample=on_sample) as client:
        if not client.wait(client.all_first, time.monotonic() + 180):
            raise RuntimeError(f"{n} nodes: not all answered within 180 s")
        startup = time.perf_counter() - t0
        bad = [f for f in client.feeds if f.ended]
        if bad:
            raise RuntimeError(f"{len(bad)} of {n} agents failed: {bad[0].label}: {bad[0].error}")
        first = max(arrivals) + SETTLE
        console = Console(file=io.StringIO(), width=200, height=50, force_terminal=True)
        view = LiveView(lambda: {}, interval=INTERVAL, gpus=True, ranks=True, sort="node")
        c0, w0 = time.process_time(), time.perf_counter()
        rounds: list[float] = []
        done_at: list[float] = []
        draw_cpu = 0.0
        for tick in range(first, first + ROUNDS):
            deadline = time.monotonic() + max(0.0, tick * INTERVAL - time.time()) + 30
            if not client.wait(functools.partial(complete, tick), deadline):
                raise RuntimeError(f"{n} nodes: round {tick} incomplete: {len(arrivals.get(tick, {}))}/{n}")
            rounds.append(max(arrivals[tick].values()) - tick * INTERVAL)
            done_at.append(max(arrivals[tick].values()))
            d0 = time.thread_time()
            with client.lock:
                result = snapshot(client.feeds, spec, opts, started=client.started)
            console.print(view.render(result, console.size.height))
            draw_cpu += time.thread_time() - d0
        wall = time.perf_counter() - w0
        cpu = time.process_time() - c0
        with client.lock:
            agent = [f.sample.node.agent_cpu_pct or 0.0 for f in client.feeds if f.sample]
    return {"round_s": statistics.median(rounds), "round_max_s": max(rounds), "startup_s": startup,
            "period_s": (done_at[-1] - done_at[0]) / (ROUNDS - 1), "client_pct": 100.0 * cpu / wall,
            "draw_ms": 1000.0 * draw_cpu / ROUNDS,
            "agent_pct": statistics.mean(agent)}


def poll_round(cfg: Path, names: list[str]) -> tuple[float, float]:
    """What top replaces: each round a new ssh to every node reading its counters (a poll loop over
    ssh, as an operators' script does), with the same fan-out runner. (wall s, client CPU s) per round."""
    from ml_debug.remote.runner import run_everywhere
    from ml_debug.remote.targets import Target, TargetSpec

    spec = TargetSpec(kind="ssh", targets=[Target(x) for x in names], ssh_config=cfg, connect_timeout_s=60,
                      max_parallel=64)
    walls, cpus = [], []
    for _ in range(2):
        c0, w0 = time.process_time(), time.perf_counter()
        results = run_everywhere(spec, ["cat", "/proc/loadavg", "/proc/stat", "/proc/meminfo"], timeout_s=120)
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
        bad = [r for r in results if not r.ok]
        if bad:
            raise RuntimeError(f"poll round: {len(bad)} of {len(names)} failed: {bad[0].host}: {bad[0].detail}")
    return min(walls), min(cpus)


def run() -> list[Result]:
    from tests.rig.fixtures import ensure_rig, load_ssh_rig

    errors = {k: v for k, v in ensure_rig("ssh", "netns").items() if v}
    if errors:
        raise RuntimeError(f"rig not up: {errors}")
    rig = load_ssh_rig()
    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="mldebug-bench-top-") as tmp:
        cfg = Path(tmp) / "ssh_config"
        names = _config(rig, 64, cfg)
        figures = {n: measure(cfg, names[:n]) for n in (1, 16, 64)}
        polls = {n: poll_round(cfg, names[:n]) for n in (16, 64)}
    base = figures[1]
    for n, f in figures.items():
        detail = (f"round {f['round_s'] * 1000:.0f} ms from tick to last sample (max {f['round_max_s'] * 1000:.0f}), "
                  f"a round every {f['period_s']:.2f} s, client CPU {f['client_pct']:.1f}% of a core (snapshot + "
                  f"screen {f['draw_ms']:.1f} ms a round), agent CPU {f['agent_pct']:.2f}% each, start-up "
                  f"{f['startup_s']:.1f} s")
        results.append(Result(f"top {n} nodes: T({n})/T(1)", f["round_s"] / base["round_s"], detail))
    results.append(Result("top 64 nodes: client CPU / 10% of a core", figures[64]["client_pct"] / 10.0,
                          f"{figures[64]['client_pct']:.1f}% (goal: under 10%, ratio < 1)"))
    for n, (wall, cpu) in polls.items():
        f = figures[n]
        results.append(Result(f"top {n} nodes: ssh-per-poll round / top round", wall / f["round_s"],
                              f"a new ssh per node and round: {wall:.2f} s and {cpu * 1000:.0f} ms client CPU a "
                              f"round; top: {f['round_s'] * 1000:.0f} ms and "
                              f"{f['client_pct'] * f['period_s'] * 10:.0f} ms"))
    return results
