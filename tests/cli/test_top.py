"""`mldebug top` on the rig's real parts: a 4-rank gloo job run by the rig's Slurm on node1 and node2
(2 ranks each), seen over ssh and through `srun --overlap`; an sshd stopped with SIGSTOP; the live
view in a pseudo-terminal. The job's rank 3 spins and rank 1 stops stepping: the outliers.

The whole file takes well under a minute: one job serves every test of the module."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import select
import shlex
import signal
import socket
import struct
import subprocess
import sys
import termios
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO, kill_pids, mldebug, pids_with_env, validate_schema, wait_until
from tests.fakes import nvml as fake_nvml
from tests.fakes.nvml import healthy_gpu
from tests.rig.fixtures import rig_port

TOKEN_VAR = "TOP_TEST_JOB"

# Every rank appends {"step": N} to rank-<R>.jsonl every 0.1 s, except rank 1, which stops after its
# first step (it sleeps: a stalled rank). Rank 3 steps too, but two threads of it spin (hashing releases
# the GIL, so both burn a core): a rank using far more CPU than its peers, even on a loaded machine. They
# spin only while the file "spin" exists in the job's folder: the test that judges CPU shares creates it,
# the others leave 2 cores to the rest of the suite.
JOB = r'''
import hashlib, json, os, socket, threading, time
from datetime import timedelta
import torch, torch.distributed as dist
rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world, timeout=timedelta(seconds=300))
t = torch.ones(1)
dist.all_reduce(t)
assert int(t[0]) == world
out = os.environ["TOP_JOB_DIR"]
role = {1: "sleep", 3: "spin"}.get(rank, "work")
end_at = time.monotonic() + 300

def spin():
    block, flag = bytes(1 << 20), os.path.join(out, "spin")
    while time.monotonic() < end_at:
        if os.path.exists(flag):
            for _ in range(20):
                hashlib.sha256(block).digest()
        else:
            time.sleep(0.05)

if role == "spin":
    for _ in range(2):
        threading.Thread(target=spin, daemon=True).start()
with open(os.path.join(out, f"rank-{rank}.jsonl"), "a", buffering=1) as f:
    f.write(json.dumps({"step": 0, "rank": rank}) + "\n")
    with open(os.path.join(out, f"ready-{rank}.tmp"), "w") as m:
        json.dump({"host": socket.gethostname(), "pid": os.getpid()}, m)
    os.replace(os.path.join(out, f"ready-{rank}.tmp"), os.path.join(out, f"ready-{rank}.json"))
    step = 0
    while time.monotonic() < end_at:
        time.sleep(1 if role == "sleep" else 0.1)
        if role != "sleep":
            step += 1
            f.write(json.dumps({"step": step, "rank": rank}) + "\n")
'''


@dataclass
class TopJob:
    job_id: str
    token: str
    dir: Path
    ranks: dict[int, tuple[str, int]]  # rank -> (node, pid as the node sees it)

    @property
    def progress(self) -> str:
        return str(self.dir / "rank-{rank}.jsonl")


@pytest.fixture(scope="module")
def job(rig_slurm, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TopJob]:
    nodes = rig_slurm.nodes[:2]
    d = tmp_path_factory.mktemp("top-job")
    (d / "job.py").write_text(JOB)
    token = uuid.uuid4().hex[:12]
    env = {"OMP_NUM_THREADS": "1", TOKEN_VAR: token, "TOP_JOB_DIR": str(d), "GLOO_SOCKET_IFNAME": "eth0",
           "MASTER_ADDR": rig_slurm.node_ips[nodes[0]], "MASTER_PORT": str(rig_port()),
           "PYTHONUNBUFFERED": "1"}
    job_id = rig_slurm.sbatch([sys.executable, str(d / "job.py")], nodes=2, ntasks_per_node=2, env=env,
                              output=d / "slurm.out", extra=["-w", ",".join(nodes), "-J", f"top-{token}"])
    try:
        def ready() -> dict[int, tuple[str, int]] | None:
            if not rig_slurm.run(["squeue", "-h", "-j", job_id, "-o", "%i"]).stdout.strip():
                out = (d / "slurm.out").read_text() if (d / "slurm.out").exists() else ""
                pytest.fail(f"slurm job {job_id} ended before its ranks were ready:\n{out[-2000:]}")
            try:
                marks = {r: json.loads((d / f"ready-{r}.json").read_text()) for r in range(4)}
            except (OSError, ValueError):
                return None
            return {r: (m["host"], int(m["pid"])) for r, m in marks.items()}

        ranks = wait_until(ready, 120, "the 4 ranks of the top test job to start stepping", interval=0.1)
        yield TopJob(job_id=job_id, token=token, dir=d, ranks=ranks)
    finally:
        rig_slurm.run(["scancel", "-s", "KILL", job_id])
        deadline = time.monotonic() + 30
        while (left := pids_with_env(TOKEN_VAR, token)) and time.monotonic() < deadline:
            kill_pids(left)
            time.sleep(0.1)
        rig_slurm.cancel(job_id)
        assert not pids_with_env(TOKEN_VAR, token), "processes of the top test job survive"


def _run(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> tuple[int, dict, str]:
    proc = mldebug("top", "--once", "--json", "--remote-python", sys.executable, *args, env=env, timeout=timeout)
    try:
        doc = json.loads(proc.stdout)
    except ValueError:
        pytest.fail(f"no JSON document (rc {proc.returncode}): {proc.stdout[-500:]} {proc.stderr[-2000:]}")
    validate_schema(doc, "top")
    return proc.returncode, doc["result"], proc.stderr


def _check_job(result: dict, job: TopJob, nodes: dict[str, str]) -> None:
    """Every node answered, every rank is there with its label and sane values, and the outliers are
    exactly the spinning rank 3 (CPU) and the stalled rank 1 (step rate)."""
    assert {n["target"]: n["status"] for n in result["nodes"]} == {t: "ok" for t in nodes}, result["summary"]
    assert result["not_answering"] == [] and result["counts"]["ranks"] == 4
    seen: dict[int, tuple[str, int]] = {}
    for n in result["nodes"]:
        assert n["host"] == nodes[n["target"]]
        assert 0 <= n["cpu_pct"] <= 100 and n["cpus"] >= 1 and 0 < n["mem_used_bytes"] < n["mem_total_bytes"]
        assert n["load1"] >= 0 and n["gpus"] == [] and not n["nvml"]["available"]
        for r in n["ranks"]:
            seen[r["rank"]] = (n["host"], r["pid"])
            assert r["label"] == f"rank {r['rank']}" and r["world_size"] == 4 and r["rank_source"] == "SLURM_PROCID"
            assert r["state"] in ("R", "S"), r
            assert r["threads"] >= (3 if r["rank"] == 3 else 1), r
            assert 0 <= r["cpu_pct"] <= 100 * r["threads"] and 20 << 20 < r["rss_bytes"] < 8 << 30, r
            p = r["progress"]
            assert p["path"] == job.progress.replace("{rank}", str(r["rank"])) and p["kind"] == "step" and not p["error"]
            assert p["step"] >= 0 and p["rate"] is not None
    assert seen == job.ranks
    flagged = {(o["kind"], o["rank"]) for o in result["outliers"]}
    assert flagged == {("rank_cpu", 3), ("step_rate", 1)}, result["outliers"]
    (spin,) = [o for o in result["outliers"] if o["kind"] == "rank_cpu"]
    assert spin["value"] > 25 and spin["median"] < 10 and spin["peers"] == 4
    assert spin["message"].startswith(f"rank 3 ({job.ranks[3][0]}, pid {job.ranks[3][1]}): CPU ")
    (slow,) = [o for o in result["outliers"] if o["kind"] == "step_rate"]
    assert slow["value"] == 0 and slow["median"] > 1


# In the parallel part: rank 3's two spinning threads stay far above its peers' CPU even beside 6 busy loops
# on 2 cores (tried); the job is the module's one, which the d-key test reads too (no second start afterwards).
def test_once_json_over_slurm_and_over_ssh_every_rank_labelled_and_the_outliers_named(job, rig_slurm, rig_ssh) -> None:
    names = {n: n for n in rig_slurm.nodes[:2]}
    (job.dir / "spin").touch()  # rank 3 spins from now on (the agents' first sample is a full interval away)
    try:
        rc, result, err = _run("--slurm-job", job.job_id, "--progress-file", job.progress, env=rig_slurm.env)
        assert rc == 1, err  # outliers found
        assert result["transport"] == "slurm" and result["slurm_job"] == job.job_id
        _check_job(result, job, names)

        hosts = rig_ssh.hostfile([n for n in rig_ssh.nodes if n.name in names])
        rc, result, err = _run("--hosts", str(hosts), "--ssh-config", str(rig_ssh.ssh_config), "--env",
                               f"{TOKEN_VAR}={job.token}", "--progress-file", job.progress)
        assert rc == 1, err
        assert result["transport"] == "ssh"
        _check_job(result, job, names)
        assert "2/2 nodes answering, 4 ranks, 0 GPUs; 2 outliers: " in result["summary"]
    finally:
        (job.dir / "spin").unlink(missing_ok=True)


# ------------------------------------------------------------------------------- a stopped sshd


@dataclass
class PrivateSshd:
    """An sshd of our own inside a rig node (the rig's are shared with other tests)."""

    proc: subprocess.Popen[bytes]
    alias: str
    config: Path

    def processes(self) -> list[int]:
        """Root-namespace pids of the sshd and every sshd below it (one per connection)."""
        kids: dict[int, list[int]] = {}
        comm: dict[int, str] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    stat = Path(f"/proc/{entry}/stat").read_text()
                except OSError:
                    continue
                ppid = int(stat.rsplit(")", 1)[1].split()[1])
                kids.setdefault(ppid, []).append(int(entry))
                comm[int(entry)] = stat[stat.index("(") + 1:stat.rindex(")")]
        out, todo = [], [self.proc.pid]
        while todo:
            pid = todo.pop()
            if comm.get(pid) == "sshd":
                out.append(pid)
            todo.extend(kids.get(pid, []))
        return out

    def signal(self, sig: int) -> None:
        for pid in self.processes():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)


@contextlib.contextmanager
def private_sshd(rig_ssh, node, tmp: Path, other) -> Iterator[PrivateSshd]:
    port = rig_port()
    conf = (rig_ssh.base / "netns" / f"sshd_{node.name}.conf").read_text()  # the node's own sshd, another port
    conf = re.sub(r"(?m)^Port .*$", f"Port {port}", conf)
    conf = re.sub(r"(?m)^PidFile .*$", f"PidFile {tmp}/sshd.pid", conf)
    (tmp / "sshd.conf").write_text(conf)
    known = tmp / "known_hosts"
    key = rig_ssh.host_key_pub.read_text().split()[:2]
    known.write_text(rig_ssh.known_hosts.read_text() + f"[{node.ip}]:{port} {' '.join(key)}\n")
    alias = f"{node.name}-own"
    config = tmp / "ssh_config"
    entry = ("Host {alias}\n  HostName {ip}\n  Port {port}\n  User root\n  IdentityFile {key}\n  IdentitiesOnly yes\n"
             "  UserKnownHostsFile {known}\n")
    config.write_text(entry.format(alias=alias, ip=node.ip, port=port, key=rig_ssh.client_key, known=known) +
                      entry.format(alias=other.name, ip=other.address, port=other.port, key=rig_ssh.client_key,
                                   known=known))
    proc = subprocess.Popen(node.nsenter_argv(["/usr/sbin/sshd", "-D", "-f", str(tmp / "sshd.conf"), "-E",
                                               str(tmp / "sshd.log")]), start_new_session=True,
                            stdin=subprocess.DEVNULL)
    sshd = PrivateSshd(proc, alias, config)
    try:
        def listening() -> bool:
            with contextlib.suppress(OSError), socket.create_connection((node.ip, port), timeout=1):
                return True
            assert proc.poll() is None, (tmp / "sshd.log").read_text()
            return False

        wait_until(listening, 30, f"our sshd on {node.name}:{port}")
        yield sshd
    finally:
        sshd.signal(signal.SIGCONT)
        procs = sshd.processes()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        kill_pids(procs)
        proc.wait(timeout=30)


def test_a_node_whose_sshd_is_stopped_is_not_answering_while_the_other_keeps_updating(
        job, rig_ssh, rig_nodes, tmp_path: Path) -> None:
    from ml_debug.remote.targets import Target, TargetSpec
    from ml_debug.sampling.streams import Client
    from ml_debug.top.options import TopOptions
    from ml_debug.top.result import snapshot

    node2 = next(n for n in rig_ssh.nodes if n.name == job.ranks[2][0])
    node1 = next(n for n in rig_ssh.nodes if n.name == job.ranks[0][0])
    with private_sshd(rig_ssh, next(n for n in rig_nodes if n.name == node2.name), tmp_path, node1) as sshd:
        opts = TopOptions(interval=0.5, timeout=1.5, env=[(TOKEN_VAR, job.token)])
        spec = TargetSpec(kind="ssh", targets=[Target(node1.name), Target(sshd.alias)], ssh_config=sshd.config,
                          remote_python=sys.executable, connect_timeout_s=5)
        with Client(spec, opts.sampler()) as client:
            def statuses() -> dict[str, str]:
                with client.lock:
                    r = snapshot(client.feeds, spec, opts, started=client.started)
                return {n["target"]: n["status"] for n in r["nodes"]}

            def seq(label: str) -> int:
                with client.lock:
                    return next(f.sample.seq for f in client.feeds if f.label == label and f.sample)

            wait_until(lambda: statuses() == {node1.name: "ok", sshd.alias: "ok"}, 30, "both nodes streaming")
            sshd.signal(signal.SIGSTOP)  # the listener and the session's sshd: the stream stalls
            before = seq(node1.name)
            wait_until(lambda: statuses()[sshd.alias] == "not answering", 30, f"{sshd.alias} not answering")
            assert statuses()[node1.name] == "ok"
            assert seq(node1.name) > before  # the other node kept sending while this one was silent
            with client.lock:
                r = snapshot(client.feeds, spec, opts, started=client.started)
            (stopped,) = [n for n in r["nodes"] if n["target"] == sshd.alias]
            assert stopped["age_s"] >= opts.grace_s and stopped["error"].startswith("no sample for ")
            assert [x["rank"] for x in stopped["ranks"]] == [2, 3]  # its last values are kept (greyed)
            assert r["not_answering"] == [sshd.alias] and r["exit_code"] == 4
            sshd.signal(signal.SIGCONT)
            wait_until(lambda: statuses()[sshd.alias] == "ok", 30, f"{sshd.alias} answering again")

        # --once with the sshd stopped before we connect: the node is named within --interval + --node-timeout
        sshd.signal(signal.SIGSTOP)
        rc, result, err = _run("--hosts", f"{node1.name},{sshd.alias}", "--ssh-config", str(sshd.config),
                               "--env", f"{TOKEN_VAR}={job.token}", "--interval", "0.5", "--node-timeout", "6",
                               "--connect-timeout", "30")
        sshd.signal(signal.SIGCONT)
    assert rc == 4, err
    assert result["not_answering"] == [sshd.alias], result["summary"]
    by = {n["target"]: n for n in result["nodes"]}
    assert by[sshd.alias]["status"] == "not answering"
    assert by[sshd.alias]["error"] == "no answer within 6.5 s (--interval + --node-timeout)"
    assert by[node1.name]["status"] == "ok" and sorted(r["rank"] for r in by[node1.name]["ranks"]) == [0, 1]
    assert result["summary"].startswith(f"1/2 nodes answering ({sshd.alias}: not answering, no answer within")


# ------------------------------------------------------------------------------- the live view in a pty


class Pty:
    """`mldebug top` with a pseudo-terminal as its controlling terminal, stdin, stdout and stderr."""

    def __init__(self, args: list[str], env: dict[str, str], rows: int = 40, cols: int = 160) -> None:
        self.master, self.slave = os.openpty()
        fcntl.ioctl(self.master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        self.saved = termios.tcgetattr(self.slave)
        full = {**os.environ, "PYTHONPATH": str(REPO), "TERM": "xterm-256color", **env}
        for var in ("MLDEBUG_WIDTH", "COLUMNS", "LINES", "MLDEBUG_JSON"):
            full.pop(var, None)
        self.proc = subprocess.Popen([sys.executable, "-m", "ml_debug", "top", *args], stdin=self.slave,
                                     stdout=self.slave, stderr=self.slave, env=full, cwd=REPO,
                                     start_new_session=True, preexec_fn=_controlling_tty)
        self.out = b""

    def read(self, timeout: float = 0.1) -> None:
        while True:
            ready, _, _ = select.select([self.master], [], [], timeout)
            if not ready:
                return
            try:
                data = os.read(self.master, 65536)
            except OSError:  # the child closed its side
                return
            if not data:
                return
            self.out += data
            timeout = 0

    @property
    def text(self) -> bytes:
        """What was drawn, without the escape sequences (colours, cursor moves)."""
        return ANSI.sub(b"", self.out)

    def expect(self, pattern: bytes, what: str, timeout: float = 30, raw: bool = False) -> re.Match[bytes]:
        def found() -> re.Match[bytes] | None:
            self.read()
            return re.search(pattern, self.out if raw else self.text)

        return wait_until(found, timeout, what, interval=0.01)

    def send(self, data: bytes) -> None:
        os.write(self.master, data)

    def wait(self, timeout: float = 30) -> int:
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            self.read()
        self.read()
        return self.proc.wait(timeout=1)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for fd in (self.master, self.slave):
            with contextlib.suppress(OSError):
                os.close(fd)


ANSI = re.compile(rb"\x1b(\[[0-9;?]*[ -/]*[@-~]|[()][0-9A-Za-z]|[=>78])")


def _controlling_tty() -> None:
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def _scenario(tmp_path: Path) -> Path:
    path = tmp_path / "nvml.json"
    path.write_text(json.dumps({"gpus": [healthy_gpu(i) for i in range(2)]}))
    return path


@pytest.mark.parametrize("stop", ["q", "ctrl-c"])
def test_live_view_in_a_pty_draws_updates_toggles_gpu_rows_and_exits_restoring_the_terminal(
        stop: str, tmp_path: Path) -> None:
    env = fake_nvml.env(_scenario(tmp_path))
    term = Pty(["--local", "--interval", "0.5"], env)
    try:
        term.expect(rb"\x1b\[\?1049h", "the alternate screen", raw=True)
        first = term.expect(rb"last sample (\d\d:\d\d:\d\d)", "the first frame").group(1)
        assert b"1/1 nodes answering" in term.text and b"FAKE NVML" in term.text
        assert termios.tcgetattr(term.slave)[3] & termios.ICANON == 0  # keys arrive one by one
        term.expect(rb"last sample (?!" + first + rb")\d\d:\d\d:\d\d", "a later frame")  # it updates
        assert b"NVIDIA H100" not in term.text
        term.send(b"g")
        term.expect(rb"gpu 1 +NVIDIA H100", "the GPU rows after g")
        term.send(b"s")
        term.expect(rb"sort cpu", "the next sort order after s")
        term.send(b"q" if stop == "q" else b"\x03")
        rc = term.wait()
        assert rc == (0 if stop == "q" else 130), term.out[-2000:]
        tail = term.out[term.out.rindex(b"\x1b[?1049h"):]
        assert b"\x1b[?1049l" in tail  # the alternate screen is left
        assert b"\x1b[?25h" in tail  # the cursor is shown again
        lflag = termios.tcgetattr(term.slave)[3]
        assert lflag & termios.ICANON and lflag & termios.ECHO  # cooked mode is back
        assert termios.tcgetattr(term.slave) == term.saved
    finally:
        term.close()


def test_remote_agent_missing_is_named_with_the_hint(rig_ssh) -> None:
    proc = mldebug("top", "--once", "--json", "--hosts", rig_ssh.nodes[0].name, "--ssh-config",
                   str(rig_ssh.ssh_config), "--remote-python", "/nonexistent/python", "--node-timeout", "5", timeout=120)
    assert proc.returncode == 4, proc.stderr
    (node,) = json.loads(proc.stdout)["result"]["nodes"]
    assert node["status"] == "failed"
    assert node["error"].startswith(f"mldebug is not installed on {rig_ssh.nodes[0].name}"), node["error"]
    assert "--remote-python" in node["error"]


def test_shell_words_in_options_reach_the_agent_literally(rig_ssh, tmp_path: Path) -> None:
    """A --pattern full of shell metacharacters is one argument on the node, not shell code."""
    canary = tmp_path / "canary"
    evil = f"x'; touch {shlex.quote(str(canary))}; echo '$(touch {canary})"
    proc = mldebug("top", "--once", "--json", "--hosts", rig_ssh.nodes[0].name, "--ssh-config",
                   str(rig_ssh.ssh_config), "--remote-python", sys.executable, "--pattern", evil, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["result"]["nodes"][0]["status"] == "ok"
    assert not canary.exists()


def test_the_d_key_runs_dump_stacks_on_the_selected_nodes_ranks(job, rig_ssh) -> None:
    """What the live view's `d` calls: dump-stacks' own library call, on one node, with top's selectors."""
    from ml_debug.cli.top import dump_stacks_callback
    from ml_debug.remote.options import TargetOptions
    from ml_debug.top.options import TopOptions

    node1 = job.ranks[0][0]
    spec = TargetOptions(hosts=f"{node1},{job.ranks[2][0]}", ssh_config=rig_ssh.ssh_config,
                         remote_python=sys.executable).resolve()
    result = dump_stacks_callback(spec, TopOptions(env=[(TOKEN_VAR, job.token)]))(node1)
    assert [n["host"] for n in result["nodes"]] == [node1]  # the selected node only
    assert {p["rank"]: (p["host"], p["pid"]) for p in result["processes"]} == {r: job.ranks[r] for r in (0, 1)}
    assert all(p["samples"] and not p["error"] for p in result["processes"]), result["processes"]
    assert result["verdict"]
