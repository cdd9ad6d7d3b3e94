"""`mldebug dump-stacks` on real hung gloo jobs from the rig (torchrun ranks, real py-spy)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from html import escape
from pathlib import Path

import jsonschema
import pytest

from tests.conftest import REPO, check_golden, mldebug, require, stderr_until, wait_until

SCHEMA = json.loads((REPO / "ml_debug" / "schemas" / "dump-stacks.json").read_text())
GOLDEN = REPO / "tests" / "golden" / "dump_stacks_local.txt"
VENV_BIN = Path(sys.executable).parent


def _tools() -> None:
    require(shutil.which("py-spy") or (VENV_BIN / "py-spy").exists(), "py-spy")


def _json(proc: subprocess.CompletedProcess[str]) -> dict:
    assert proc.stdout.strip(), f"no JSON on stdout; stderr: {proc.stderr}"
    doc = json.loads(proc.stdout)
    jsonschema.validate(doc, SCHEMA)
    return doc


def normalise(text: str, hosts: list[str]) -> str:
    """Golden-test view: no pids, hostnames, torch line numbers or trailing spaces."""
    for h in sorted(hosts, key=len, reverse=True):
        text = re.sub(rf"(?<![\w-]){re.escape(h)}(?![\w-])", "<HOST>", text)
    text = re.sub(r"pid \d+", "pid <PID>", text)
    text = re.sub(r"((?:torch/[\w/]+|distributed_c10d|c10d_logger)\.py):\d+", r"\1:<L>", text)
    lines = []
    for line in text.splitlines():
        if "┃" in line or "━" in line or re.match(r"^ [A-Z] ", line):  # table: widths follow the hostname
            line = re.sub(r" +", " ", re.sub(r"━+", "━", line))
        lines.append(line.rstrip())
    text = "\n".join(lines)
    return text.rstrip() + "\n"


def test_local_names_the_odd_rank_and_function_and_reports_what_it_cannot_dump(hung_job) -> None:
    _tools()
    job = hung_job(nranks=4, odd_rank=3, odd_function="load_batch", mode="hang", where="local")
    launcher = str(job.launcher_pids[0])
    proc = mldebug("dump-stacks", "--local", "--pid", launcher, "--json", timeout=120)
    assert proc.returncode == 1, proc.stderr
    result = _json(proc)["result"]
    host, pid = job.ranks[3]
    verdict = result["verdict"]
    assert verdict.startswith(f"suspect: rank 3 ({host}, pid {pid}) in load_batch (hung_worker.py:"), verdict
    assert "while 3 ranks wait in all_reduce (distributed_c10d.py:" in verdict, verdict
    # below Python, the kernel's view of the suspect joins the verdict
    assert result["summary"] == f"{verdict}; below Python: rank 3 ({host}): blocked in clock_nanosleep()"
    assert result["ok"] is False
    assert [s["ranks"] for s in result["suspects"]] == [[3]]
    assert result["suspects"][0]["kind"] == "outside-collective"
    sizes = {g["id"]: (g["size"], sorted(g["ranks"])) for g in result["groups"]}
    assert sizes == {"A": (3, [0, 1, 2]), "B": (1, [3])}
    assert result["groups"][0]["collective"]["name"] == "all_reduce"
    # every raw stack is in the bundle, labelled from /proc/PID/environ
    by_rank = {p["rank"]: p for p in result["processes"]}
    assert sorted(by_rank) == [0, 1, 2, 3]
    for r, p in by_rank.items():
        assert p["pid"] == job.ranks[r][1] and p["world_size"] == 4 and p["local_rank"] == r
        assert p["found_by"] == f"torchrun pid {launcher}"
        main = [t for t in p["samples"][0]["threads"] if t["is_main"]][0]
        assert main["frames"][0]["name"] == ("load_batch" if r == 3 else "all_reduce")
    # the dumped ranks are still alive and running
    assert all(job.alive().values())

    # the human view: a golden tree/table, verdict last (without the kernel's table: its ports and fds vary)
    human = mldebug("dump-stacks", "--local", "--pid", launcher, "--no-kernel", timeout=120)
    assert human.returncode == 1, human.stderr
    got = normalise(human.stdout, [host])
    assert got.rstrip().splitlines()[-1].startswith("suspect: rank 3 (<HOST>, pid <PID>) in load_batch")
    check_golden(GOLDEN, got)

    # The same job beside processes that cannot be dumped: each is reported with its reason, the ranks are
    # dumped anyway, and the exit code says the result is partial.
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])  # exits at once; never reaped until the end
    not_python = subprocess.Popen(["sleep", "120"])
    # a Python process that exits between the first and the second sample (killed when sample 1 is in)
    short = subprocess.Popen([sys.executable, "-c", "import time\ndef short_lived():\n    time.sleep(300)\n"
                              "short_lived()"])
    try:
        wait_until(lambda: _state(zombie.pid) == "Z", 10, "the child that exits at once to be a zombie")
        pids = [*job.pids, zombie.pid, not_python.pid, short.pid]
        args = [a for p in pids for a in ("--pid", str(p))]
        env = {**os.environ, "MLDEBUG_WIDTH": "160"}
        run = subprocess.Popen([sys.executable, "-m", "ml_debug", "dump-stacks", *args, "--samples", "2",
                                "--interval", "2", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=env)
        assert run.stderr is not None
        for line in run.stderr:
            if "sample 1/2 taken" in line:
                short.kill()
                short.wait()
                break
        out, err = run.communicate(timeout=120)
        assert run.returncode == 4, err  # partial: some processes were not dumped
        result = _json(subprocess.CompletedProcess(run.args, run.returncode, out, err))["result"]
        reasons = {p["pid"]: p["error"] for p in result["not_dumped"]}
        assert set(reasons) == {zombie.pid, not_python.pid, short.pid}, reasons
        assert "zombie" in reasons[zombie.pid]
        assert reasons[not_python.pid] == "not a Python process"
        assert reasons[short.pid] == ("process exited before it could be dumped (after 1 good sample; last seen "
                                      "in short_lived (<string>:3))"), reasons[short.pid]
        dumped = {p["rank"] for p in result["processes"] if p["state"] != "not-dumped"}
        assert dumped == {0, 1, 2, 3}
        assert "rank 3" in result["verdict"] and "load_batch" in result["verdict"]
        assert "3 processes not dumped" in result["verdict"]
    finally:
        for p in (zombie, not_python, short):
            p.kill()
            p.wait()


def _state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def test_samples_tell_a_looping_rank_from_stuck_ones(hung_job) -> None:
    _tools()
    job = hung_job(nranks=2, odd_rank=1, odd_function="spin_here", mode="loop", where="local")
    # 10 samples 0.25 s apart fall in both halves of the odd rank's 0.4 s loop (odd function, load_batch)
    proc = mldebug("dump-stacks", "--pid", str(job.launcher_pids[0]), "--samples", "10", "--interval", "0.25",
                   "--json", timeout=120)
    assert proc.returncode == 1, proc.stderr
    result = _json(proc)["result"]
    states = {p["rank"]: p["state"] for p in result["processes"]}
    assert states == {0: "stuck", 1: "moving"}, states
    assert all(len(p["samples"]) == 10 for p in result["processes"])
    suspect = result["suspects"][0]
    assert suspect["kind"] == "moving" and suspect["ranks"] == [1]
    assert result["verdict"].startswith(f"suspect: rank 1 ({job.ranks[1][0]}, pid {job.ranks[1][1]}) keeps "
                                        "running (its stack changed across 10 samples: ")
    assert "spin_here (hung_worker.py:" in result["verdict"] and "load_batch (hung_worker.py:" in result["verdict"]
    assert "while 1 rank is stuck in all_reduce" in result["verdict"]


def test_py_spy_missing_exits_3_with_the_install_hint(tmp_path: Path) -> None:
    # A python whose bin/ has no py-spy (PATH neither): the venv's packages come in via PYTHONPATH.
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python").symlink_to(os.path.realpath(sys.executable))
    site = next(p for p in sys.path if p.endswith("site-packages") and p.startswith(sys.prefix))
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{REPO}:{site}", "MLDEBUG_WIDTH": "160"}
    proc = subprocess.run([str(bindir / "python"), "-m", "ml_debug", "dump-stacks", "--pid", str(os.getpid())],
                          capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 3, proc.stderr
    assert "mldebug: error: missing py-spy: mldebug dump-stacks needs it" in proc.stderr
    assert "hint: pip install py-spy" in proc.stderr


def test_ptrace_refused_says_exactly_why_and_what_to_do(tmp_path: Path) -> None:
    _tools()
    require(shutil.which("setpriv") and Path("/usr/bin/python3").exists() and os.geteuid() == 0,
            "root, setpriv and /usr/bin/python3 (to run a target as another user)")
    # target: a Python process of uid 65534; mldebug: root without CAP_SYS_PTRACE
    target = subprocess.Popen(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3",
                               "-c", "import time\ndef waiting():\n    time.sleep(120)\nprint('ready', flush=True)\n"
                               "waiting()"], cwd="/", stdout=subprocess.PIPE, text=True)
    try:
        assert target.stdout is not None and target.stdout.readline().strip() == "ready"
        proc = subprocess.run(["setpriv", "--bounding-set=-sys_ptrace", "--inh-caps=-sys_ptrace", sys.executable,
                               "-m", "ml_debug", "dump-stacks", "--pid", str(target.pid), "--json"],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 3, proc.stderr
        result = _json(proc)["result"]
        (entry,) = result["not_dumped"]
        assert entry["error"].startswith("permission denied: the process belongs to uid 65534"), entry
        assert "without CAP_SYS_PTRACE" in entry["error"]
        assert "sudo" in entry["fix"]
        assert "hint: run mldebug as that user, or" in proc.stderr
        assert _state(target.pid) in ("S", "R")  # left running
    finally:
        target.kill()
        target.wait()


def test_no_target_found_exits_3_with_a_hint() -> None:
    proc = mldebug("dump-stacks", "--pattern", "no-such-process-[0-9]{40}", timeout=60)
    assert proc.returncode == 3, proc.stderr
    assert "no processes to dump" in proc.stdout
    assert "hint: name them: --pid PID" in proc.stderr


def test_same_job_over_two_rig_nodes_via_hosts_and_via_slurm_job(hung_job, rig_ssh, rig_slurm,
                                                                 tmp_path: Path) -> None:
    _tools()
    job = hung_job(nranks=2, odd_rank=1, odd_function="load_batch", where="slurm", nodes=2)
    assert job.job_id
    assert {r: h for r, (h, _) in job.ranks.items()} == {0: "node1", 1: "node2"}  # one rank per node
    assert rig_slurm.run(["squeue", "-h", "-j", job.job_id, "-o", "%T"]).stdout.strip() == "RUNNING"
    remote = ["--remote-python", sys.executable, "--json"]
    page, scope = tmp_path / "hang.html", tmp_path / "hang.speedscope.json"
    via_slurm = mldebug("dump-stacks", "--slurm-job", job.job_id, "--html", str(page), "--speedscope", str(scope),
                        *remote, env=rig_slurm.env, timeout=240)
    assert via_slurm.returncode == 1, via_slurm.stderr
    slurm_result = _json(via_slurm)["result"]
    # the page and the export come from the merged report, written here (never on the nodes): both nodes on it
    # (the page in a browser: tests/cli/test_page.py)
    html = page.read_text()
    assert f'id="verdict">{escape(slurm_result["summary"])}</div>' in html
    assert all(f"<td>{n}</td>" in html for n in job.nodes), job.nodes
    assert json.loads(scope.read_text())["name"] == "mldebug dump-stacks: suspect rank 1"

    nodes = [n for n in rig_ssh.nodes if n.name in job.nodes]
    assert len(nodes) == 2
    out_dir = tmp_path / "out"
    bad = rig_ssh.bad_hostkey_host  # a node that never answers (its host key is wrong): the rest is reported
    via_ssh = mldebug("dump-stacks", "--hosts", str(rig_ssh.hostfile([*nodes, bad])), "--ssh-config",
                      str(rig_ssh.ssh_config), "--env", f"MLDEBUG_RIG_JOB={job.token}", "--out-dir", str(out_dir),
                      "--connect-timeout", "5", *remote, timeout=240)
    assert via_ssh.returncode == 4, via_ssh.stderr  # partial: one node not reached
    ssh_result = _json(via_ssh)["result"]
    (failed,) = [n for n in ssh_result["nodes"] if n["error"]]
    assert failed["host"] == bad.name and "host key" in failed["error"], failed
    assert f"1 node(s) not reached: {bad.name} (host key mismatch" in ssh_result["summary"]
    ssh_result["nodes"] = [n for n in ssh_result["nodes"] if not n["error"]]

    host1, pid1 = job.ranks[1]  # node-local pid: the node's own PID namespace
    for result in (slurm_result, ssh_result):
        assert result["verdict"].startswith(f"suspect: rank 1 ({host1}, pid {pid1}) in load_batch (hung_worker.py:")
        assert "while 1 rank waits in all_reduce (distributed_c10d.py:" in result["verdict"]
        assert sorted(n["host"] for n in result["nodes"]) == sorted(job.nodes)
        assert all(n["ok"] and n["targets"] == 1 for n in result["nodes"]), result["nodes"]
        ranks = {p["rank"]: (p["host"], p["pid"]) for p in result["processes"]}
        assert ranks == job.ranks
        assert {p["world_size"] for p in result["processes"]} == {2}
        # below Python, read on each node: the odd rank sleeps, the other waits in gloo's socket read
        kernel = {p["rank"]: p["kernel"]["verdict"] for p in result["processes"]}
        assert kernel[1].startswith("blocked in clock_nanosleep()"), kernel
        assert f"below Python: rank 1 ({host1}): blocked in clock_nanosleep()" in result["summary"], result["summary"]
    assert slurm_result["verdict"] == ssh_result["verdict"]
    # --out-dir: each node's answer as it arrived, and the merged report
    written = sorted(p.name for p in out_dir.iterdir())
    assert "merged.json" in written and sum(name.endswith(".json") for name in written) == 4, written
    assert json.loads((out_dir / "merged.json").read_text())["result"]["verdict"] == ssh_result["verdict"]
    assert {p["rank_source"] for p in slurm_result["processes"]} == {"SLURM_PROCID"}
    assert all(p["found_by"].startswith("slurmstepd pid ") for p in slurm_result["processes"])


@pytest.mark.parametrize(("pid", "code", "words"), [
    ("0", 2, "mldebug: error: Invalid value for '--pid'"),
    ("-1", 2, "mldebug: error: Invalid value for '--pid'"),
    ("99999999", 3, "no processes to dump on "),  # and why: not "no rank under a launcher"
])
def test_a_pid_that_cannot_be_dumped_says_why(pid: str, code: int, words: str) -> None:
    proc = mldebug("dump-stacks", "--pid", pid, timeout=60)
    assert proc.returncode == code, proc.stderr
    assert words in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    if code == 3:
        assert f"pid {pid}: no such process on this node" in proc.stdout, proc.stdout
    one = mldebug("dump-stacks", "--pid", "1", timeout=60)  # an ancestor of mldebug: said, not dropped
    assert one.returncode == 3 and "pid 1: mldebug itself or one of its parent processes" in one.stdout, one.stdout


def test_ctrl_c_during_samples_keeps_the_rounds_taken_in_out_dir(tmp_path: Path) -> None:
    """--samples 20 and Ctrl-C after a few: exit 130, and the rounds taken are the result, on stdout and in
    --out-dir (which its help promises; it was left empty)."""
    import signal
    import uuid

    _tools()
    mark = f"ctrlc_{uuid.uuid4().hex[:10]}"
    target = subprocess.Popen([sys.executable, "-c", f"import time  # {mark}\ntime.sleep(120)"])
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "ml_debug", "dump-stacks", "--pattern", mark, "--samples", "20",
                             "--interval", "0.5", "--json", "--out-dir", str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        err = stderr_until(proc, "sample 2/20 taken", "two rounds done: interrupt the rest")
        os.killpg(proc.pid, signal.SIGINT)
        stdout, rest = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        target.kill()
        target.wait()
    assert proc.returncode == 130, err + rest
    for text in (stdout, (out / f"{os.uname()[1]}.json").read_text()):
        doc = json.loads(text)
        jsonschema.validate(doc, SCHEMA)
        result = doc["result"]
        assert result["interrupted"] and result["exit_code"] == 130 and not result["ok"]
        (p,) = result["processes"]
        assert 2 <= len(p["samples"]) < 20, p
        assert "(interrupted after " in result["summary"], result["summary"]


def test_pid_of_one_rank_does_not_call_the_others_missing() -> None:
    """`--pid` of rank 0 of a 2-rank job: rank 1 was named "missing" and the suspect (exit 1); it was not
    asked for. --world-size 2 still says so."""
    _tools()
    rank0 = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                             env={**os.environ, "RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"})
    try:
        wait_until(lambda: "<module> (<string>:1)" in mldebug("dump-stacks", "--pid", str(rank0.pid), timeout=60).stdout,
                   30, "the rank to be in its sleep")
        alone = _json(mldebug("dump-stacks", "--pid", str(rank0.pid), "--json", timeout=60))["result"]
        assert alone["missing_ranks"] == [] and alone["exit_code"] == 0, alone["summary"]
        told = _json(mldebug("dump-stacks", "--pid", str(rank0.pid), "--world-size", "2", "--json", timeout=60))
        assert told["result"]["missing_ranks"] == [1] and told["result"]["exit_code"] == 1
    finally:
        rank0.kill()
        rank0.wait()


def test_a_mistyped_dumper_with_hosts_is_exit_2_before_any_node_is_reached() -> None:
    """--dumper is a choice, refused when the command line is read: a node listening on a real socket
    sees no connection (it was found on every node, after connecting, when it was a plain string)."""
    import socket

    with socket.socket() as node:
        node.bind(("127.0.0.1", 0))
        node.listen(8)
        port = node.getsockname()[1]
        proc = mldebug("dump-stacks", "--hosts", f"127.0.0.1:{port}", "--dumper", "pyspy", timeout=60)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.startswith("mldebug: error: Invalid value for '--dumper'"), proc.stderr
        assert "'auto', 'py-spy', 'pystack', 'gdb'" in proc.stderr and "\nhint: " in proc.stderr
        assert proc.stdout == ""
        node.setblocking(False)
        with pytest.raises(BlockingIOError):  # nothing in the listen queue: no node was reached
            node.accept()
        # the same command line with a valid dumper does connect, so the socket above would have seen it
        reached = subprocess.Popen([sys.executable, "-m", "ml_debug", "dump-stacks", "--hosts", f"127.0.0.1:{port}",
                                    "--dumper", "py-spy", "--connect-timeout", "3"], cwd=REPO,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            node.setblocking(True)
            node.settimeout(60)
            conn, _ = node.accept()
            conn.close()
        finally:
            reached.kill()
            reached.wait()


def _tracer(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("TracerPid:"):
            return int(line.split()[1])
    raise AssertionError(f"no TracerPid in /proc/{pid}/status")


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_strace_stops_at_once_on_ctrl_c_and_sigterm_and_detaches(sig: str, tmp_path: Path) -> None:
    """`--strace S` ignored Ctrl-C until S seconds passed, and SIGTERM left strace attached to the rank
    (TracerPid set) after mldebug ended: now both stop every strace at once, detached before mldebug exits."""
    import signal

    require(shutil.which("strace"), "strace (apt-get install strace)")
    target = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.05)"],
                              stdin=subprocess.DEVNULL)
    proc = subprocess.Popen([sys.executable, "-m", "ml_debug", "dump-stacks", "--pid", str(target.pid),
                             "--strace", "60"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=tmp_path, start_new_session=True)
    try:
        wait_until(lambda: _tracer(target.pid) != 0 or proc.poll() is not None, 60, "strace to attach")
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        proc.send_signal(getattr(signal, sig))
        _out, err = proc.communicate(timeout=30)  # well before the 60 s of --strace
        assert proc.returncode == 130, err[-3000:]
        assert ("interrupted" if sig == "SIGINT" else "interrupted by SIGTERM") in err, err[-3000:]
        assert "Traceback" not in err and "internal error" not in err, err[-3000:]
        assert _tracer(target.pid) == 0, "strace still attached after mldebug ended"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        target.kill()
        target.wait(timeout=30)
