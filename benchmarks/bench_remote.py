"""Fan-out wall time: mldebug's runner vs a sequential `for h in hosts; do ssh $h true; done` loop.

Targets are the rig's sshd daemons (4 loopback ports + 3 netns nodes), repeated under distinct
ssh_config aliases to make 1, 16 and 64 targets; every target gets its own connection, as distinct
hosts would. Both sides run `true` and are measured in the same run:

    python benchmarks/run.py remote

Here every sshd runs on the same machine as the client, so the server side (one sshd fork, key
exchange and shell per connection) is shared CPU for both contenders and caps the speed-up on a
small box; on a cluster each node does its own. The client's own CPU per target is printed too:
that is what limits how many real hosts one runner can drive.
"""

from __future__ import annotations

import resource
import subprocess
import tempfile
import time
from pathlib import Path

from benchmarks.common import Result


def _config(rig, n: int, path: Path) -> list[str]:
    endpoints = [*rig.hosts, *rig.nodes]
    lines, names = [], []
    for i in range(n):
        e = endpoints[i % len(endpoints)]
        name = f"t{i:02d}"
        names.append(name)
        lines.append(f"Host {name}\n  HostName {e.address}\n  Port {e.port}\n  User root\n"
                     f"  IdentityFile {rig.client_key}\n  IdentitiesOnly yes\n"
                     f"  UserKnownHostsFile {rig.known_hosts}\n  StrictHostKeyChecking yes\n"
                     "  BatchMode yes\n  LogLevel ERROR\n")
    path.write_text("".join(lines))
    return names


def _cpu(who: int) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def _fanout(cfg: Path, names: list[str]) -> float:
    from ml_debug.remote.runner import run_everywhere
    from ml_debug.remote.targets import Target, TargetSpec

    spec = TargetSpec(kind="ssh", targets=[Target(n) for n in names], ssh_config=cfg, connect_timeout_s=30)
    t0 = time.perf_counter()
    results = run_everywhere(spec, ["true"], timeout_s=120, max_parallel=64)
    elapsed = time.perf_counter() - t0
    bad = [r for r in results if not r.ok]
    if bad:
        raise RuntimeError(f"fan-out failed on {len(bad)} targets: {bad[0].host}: {bad[0].failure}: {bad[0].detail}")
    return elapsed


def _sequential(cfg: Path, names: list[str]) -> float:
    t0 = time.perf_counter()
    for name in names:
        subprocess.run(["ssh", "-F", str(cfg), name, "true"], check=True, timeout=60,
                       stdin=subprocess.DEVNULL, capture_output=True)
    return time.perf_counter() - t0


def run() -> list[Result]:
    from tests.rig.fixtures import ensure_rig, load_ssh_rig

    errors = {k: v for k, v in ensure_rig("ssh", "netns").items() if v}
    if errors:
        raise RuntimeError(f"rig not up: {errors}")
    rig = load_ssh_rig()
    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="mldebug-bench-remote-") as tmp:
        cfg = Path(tmp) / "ssh_config"
        names = _config(rig, 64, cfg)
        _fanout(cfg, names[:1])  # warm up: imports, paramiko, the sshd binaries in page cache
        fan1 = None
        for n in (1, 16, 64):
            c0 = _cpu(resource.RUSAGE_SELF)
            fan = min(_fanout(cfg, names[:n]) for _ in range(2))
            fan_cpu = (_cpu(resource.RUSAGE_SELF) - c0) / 2
            c0 = _cpu(resource.RUSAGE_CHILDREN)
            seq = _sequential(cfg, names[:n])
            seq_cpu = _cpu(resource.RUSAGE_CHILDREN) - c0
            fan1 = fan1 or fan
            results.append(Result(f"remote fan-out {n} targets vs ssh loop", seq / fan,
                                  f"mldebug runner {fan:.2f} s, sequential ssh {seq:.2f} s "
                                  f"(ratio > 1: the runner is faster); client CPU per target: "
                                  f"runner {fan_cpu / n * 1000:.0f} ms, ssh {seq_cpu / n * 1000:.0f} ms"))
            if n > 1:
                results.append(Result(f"remote fan-out {n} vs 1 target", fan / fan1,
                                      f"{fan:.2f} s vs {fan1:.2f} s ({fan / n * 1000:.0f} ms per target)"))
    return results
