"""`mldebug attach`: a real debugpy injected (with gdb) into real processes, read by mldebug's own DAP client.

One looping process serves the tests on this node (module scope); one hung Slurm job on two rig nodes
serves --slurm-job and --hosts (tests/cli/test_attach_remote.py). After every attach the process still runs, its loop still advances, and
no debugger process or listening socket is left (the adapter is mldebug's child; the process never
listens).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO, mldebug, require, require_module, validate_schema, wait_until

# every test counts the debugger processes of the whole machine (conftest.exclusive)
pytestmark = pytest.mark.usefixtures("debuggers_alone")

LOOPER = textwrap.dedent("""
    import os, sys, threading, time

    def main(path):
        step = 0
        while True:
            batch = {"input_ids": list(range(step % 5 + 1))}
            time.sleep(0.05)  # C code: a pause stops on the next line, always here in main
            step += 1
            with open(path + ".tmp", "w") as f:
                f.write(str(step))
            os.replace(path + ".tmp", path)

    def run():
        started = 4242  # only the caller knows it: --eval looks up the stack
        main(sys.argv[1])

    run()
""")


class Looper:
    def __init__(self, proc: subprocess.Popen[bytes], step_file: Path) -> None:
        self.proc, self.step_file = proc, step_file

    @property
    def pid(self) -> int:
        return self.proc.pid

    def step(self) -> int:
        try:
            return int(self.step_file.read_text() or 0)
        except (OSError, ValueError):
            return 0

    def still_looping(self) -> None:
        """Alive, and its loop advances after the debugger left."""
        assert self.proc.poll() is None, "the process died"
        now = self.step()
        wait_until(lambda: self.step() > now + 2, 30, "the loop to advance after the detach")


def _parts() -> None:
    require_module("debugpy", "mldebug attach injects debugpy (pip install 'mldebug[debug]')")
    require(shutil.which("gdb"), "gdb (debugpy injects itself into a running process with gdb)")


def processes_matching(match: Callable[[str], bool]) -> list[str]:
    """"PID command line" of every process on this machine whose command line `match`es."""
    psutil = require_module("psutil")
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if match(cmd):
            out.append(f"{p.pid} {cmd}")
    return out


def _debugger_processes() -> list[str]:
    """Every debugpy adapter or injector on this machine (none may outlive an attach)."""
    return processes_matching(lambda cmd: "debugpy.adapter" in cmd or "debugpy --connect" in cmd
                              or ("debugpy" in cmd and "--pid" in cmd))


def _listening(pid: int) -> list[object]:
    psutil = require_module("psutil")
    return [c.laddr for c in psutil.Process(pid).net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]


@pytest.fixture(scope="module")
def looper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Looper]:
    _parts()
    d = tmp_path_factory.mktemp("looper")
    (d / "looper.py").write_text(LOOPER)
    proc = subprocess.Popen([sys.executable, str(d / "looper.py"), str(d / "step")], start_new_session=True)
    loop = Looper(proc, d / "step")
    wait_until(lambda: loop.step() > 2, 30, "the looper to start")
    yield loop
    proc.kill()
    proc.wait(timeout=10)


def test_attach_by_pid_reads_a_local_evaluates_and_detaches_leaving_the_loop_running(looper: Looper) -> None:
    # --eval of a name the innermost frame (main) lacks: found in its caller, run()
    proc = mldebug("--json", "attach", "--pid", str(looper.pid), "--eval", "started + 1", timeout=120)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    validate_schema(doc, "attach")
    r = doc["result"]
    assert r["ok"] and r["stopped"] and r["alive_after"], r
    assert [t["name"] for t in r["threads"]] == ["MainThread"]
    assert [f["name"] for f in r["frames"]] == ["main", "run", "<module>"]
    assert r["evaluation"] == {"expression": "started + 1", "value": "4243", "type": "int", "frame": 1, "error": None}
    assert r["frame"] == 1 and {v["name"]: v["value"] for v in r["locals"]} == {"started": "4242"}
    assert r["summary"] == f"pid {looper.pid} on {r['host']}: started + 1 = 4243"
    looper.still_looping()
    assert _debugger_processes() == [] and _listening(looper.pid) == []


def test_lldb_injects_where_gdb_cannot_and_the_program_keeps_its_globals(looper: Looper, tmp_path: Path) -> None:
    """lldb's route (taken where gdb cannot call into a process: an AMX CPU with gdb 13; asked for here with
    debugpy's PYDEVD_ATTACH_PREFER_LLDB): the gdb on PATH only leaves a mark if it runs. It leaves no name in the
    program's globals and no thread of its own in the list."""
    from ml_debug.core.extras import find_lldb

    require(find_lldb(), "lldb (apt install lldb-19: tests/rig/up.sh)")
    bin_dir, mark = tmp_path / "bin", tmp_path / "gdb-ran"
    bin_dir.mkdir()
    (bin_dir / "gdb").write_text(f"#!/bin/sh\ntouch {mark}\nexit 1\n")
    (bin_dir / "gdb").chmod(0o755)
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "PYDEVD_ATTACH_PREFER_LLDB": "1"}
    proc = mldebug("--json", "attach", "--pid", str(looper.pid), "--eval", "[k for k in globals() if 'mldebug' in k]",
                   timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)["result"]
    assert r["evaluation"]["value"] == "[]" and [t["name"] for t in r["threads"]] == ["MainThread"], r
    assert not mark.exists(), "gdb ran"
    looper.still_looping()
    assert _debugger_processes() == [] and _listening(looper.pid) == []


def _served(m: subprocess.Popen[str], until: str, out: str) -> str:
    """``out`` and the prompt's output after it, read until it holds ``until`` (the answer of the last command sent)."""
    assert m.stdout is not None and m.stderr is not None
    while until not in out:
        line = m.stdout.readline()
        assert line, out + m.stderr.read()
        out += line
    return out


def test_the_prompt_then_ctrl_c_or_a_killed_mldebug_leave_no_debugger_behind(looper: Looper) -> None:
    """The prompt driven through stdin (an error in an expression is said and the prompt goes on), then
    Ctrl-C; then a mldebug killed outright. Either way the adapter ends and the process runs on."""
    psutil = require_module("psutil")
    from tests.fakes import pythonpath

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = pythonpath(env)
    commands = "bt\nup\nlocals\ndown\np step * 2\np no_such_name\nthreads\nc\n"
    for sig, code in ((signal.SIGINT, 130), (signal.SIGKILL, -9)):
        m = subprocess.Popen([sys.executable, "-m", "ml_debug", "attach", "--pid", str(looper.pid)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=env)
        assert m.stdin is not None and m.stdout is not None and m.stderr is not None
        first = m.stdout.readline()
        assert first.startswith(f"attached to pid {looper.pid} (MainThread stopped in frame 0)"), first
        children = psutil.Process(m.pid).children(recursive=True)
        assert children, "the adapter runs as mldebug's child"
        if sig == signal.SIGINT:
            m.stdin.write(commands)
            m.stdin.flush()
            out = _served(m, "running ('pause' stops it again", first)
            assert "> #0  main  looper.py:" in out and "> #1  run  looper.py:" in out
            assert "  started = 4242  (int)" in out
            doubled = re.search(r"\(mldebug\) (\d+)\n\(mldebug\) error: NameError: name 'no_such_name' is not "
                                r"defined\n", out)
            assert doubled and int(doubled.group(1)) % 2 == 0, out
            stopped_at = int(doubled.group(1)) // 2
            # it runs after c: paused again only once the loop is seen past where it stopped (a busy machine may give
            # it no step between two commands sent at once)
            wait_until(lambda at=stopped_at: looper.step() > at, 30, "the loop to run on after c")
            m.stdin.write("pause\nlocals\n")
            m.stdin.flush()
            out = _served(m, "  step = ", out)
            assert int(out.split("  step = ")[1].split()[0]) > stopped_at
        m.send_signal(sig)
        assert m.wait(timeout=60) == code
        wait_until(lambda kids=children: not any(c.is_running() and c.status() != psutil.STATUS_ZOMBIE for c in kids),
                   30, f"the adapter to end after {sig.name}")
        assert _debugger_processes() == [] and _listening(looper.pid) == []
        for stream in (m.stdin, m.stdout, m.stderr):
            stream.close()
        looper.still_looping()  # it resumed: a SIGKILLed client would otherwise leave it stopped


def test_a_thread_in_native_code_is_named_and_left_running(tmp_path: Path) -> None:
    _parts()
    ready = tmp_path / "sleeping"
    sleeper = subprocess.Popen([sys.executable, "-c", "import sys, threading, time; open(sys.argv[1], 'w').close(); "
                                "time.sleep(3600)", str(ready)])
    try:
        wait_until(ready.exists, 60, "the sleeper to reach its sleep")  # not still starting Python
        proc = mldebug("--json", "attach", "--pid", str(sleeper.pid), "--eval", "1", "--request-timeout", "1", timeout=120)
        assert proc.returncode == 4, proc.stderr
        r = json.loads(proc.stdout)["result"]
        assert not r["stopped"] and r["alive_after"] and r["evaluation"] is None
        assert "did not stop within 1 s: it is in native code" in r["error"]
        assert f"mldebug dump-stacks --pid {sleeper.pid} --native" in proc.stderr
        assert sleeper.poll() is None and _debugger_processes() == []
    finally:
        sleeper.kill()
        sleeper.wait(timeout=10)


def test_bad_input_is_one_line_with_its_exit_code(looper: Looper) -> None:
    sleep = subprocess.Popen(["sleep", "600"])
    try:
        cases = [
            ((), 2, "say which process: --pid PID or --rank R"),
            (("--pid", "99999999"), 2, "pid 99999999: no such process on "),
            (("--pid", str(sleep.pid)), 2, f"pid {sleep.pid} (sleep) is not a Python process"),
            (("--rank", "9", "--env", "MLDEBUG_NO_SUCH_JOB=1"), 2, "rank 9 is not on "),
            (("--pid", "0"), 2, "Invalid value for '--pid'"),
        ]
        for args, code, words in cases:
            proc = mldebug("attach", *args, timeout=60)
            assert proc.returncode == code, (args, proc.stderr)
            first = proc.stderr.splitlines()[0]
            assert first.startswith("mldebug: error: ") and words in first, (args, proc.stderr)
    finally:
        sleep.kill()
        sleep.wait(timeout=10)
    for args, words in ((("--debug-rank", "0"), "--debug-rank needs the ranks mldebug starts itself"),
                        (("--nproc-per-node", "2", "--debug-rank", "2"), "--debug-rank 2: the job has ranks 0..1")):
        proc = mldebug("train", *args, timeout=60)
        assert proc.returncode == 2, (args, proc.stderr)
        assert proc.stderr.splitlines()[0].startswith(f"mldebug: error: {words}"), (args, proc.stderr)
    # no ptrace permission: mldebug as another user, without CAP_SYS_PTRACE, on a root-owned process
    setpriv = shutil.which("setpriv")
    require(setpriv, "setpriv (util-linux) to run mldebug as another user")
    if os.geteuid() == 0:
        proc = subprocess.run([str(setpriv), "--reuid", "65534", "--regid", "65534", "--clear-groups",
                               sys.executable, "-m", "ml_debug", "attach", "--pid", str(looper.pid)],
                              capture_output=True, text=True, timeout=60,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
        assert proc.returncode == 3, proc.stderr
        assert (f"mldebug: error: cannot attach to pid {looper.pid}: the process belongs to uid 0 and this mldebug "
                "runs as uid 65534 without CAP_SYS_PTRACE") in proc.stderr


DEBUGGED = textwrap.dedent("""
    import datetime, torch, torch.distributed as dist
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=2))  # raised by --debug-rank
    t = torch.ones(1)
    dist.all_reduce(t)
    step = 41
    print(f"rank {dist.get_rank()} reduced {int(t.item())} step {step}", flush=True)  # line 7: the breakpoint
    dist.destroy_process_group()
""")


def test_launch_debug_rank_waits_for_a_dap_client_while_the_other_rank_waits(tmp_path: Path) -> None:
    """`mldebug launch --debug-rank 1`: rank 1 listens (127.0.0.1), prints the VS Code configuration, and
    waits; rank 0 waits past its own 2 s process-group timeout; mldebug's DAP client attaches with that
    configuration, stops at a breakpoint, reads a value, and the job then ends well."""
    import socket
    import time

    from ml_debug.debugger.dap import DapClient

    _parts()
    script = tmp_path / "debugged.py"
    script.write_text(DEBUGGED)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log_dir = tmp_path / "logs"
    job = subprocess.Popen([sys.executable, "-m", "ml_debug", "launch", "--nproc-per-node", "2", "--debug-rank", "1",
                            "--debug-port", str(port), "--log-dir", str(log_dir), "--", "python", str(script)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        def console() -> str:
            return "".join(p.read_text(errors="replace") for p in log_dir.glob("*/console.log"))

        wait_until(lambda: "waiting for a client" in console() and "VS Code attach configuration: " in console(),
                   120, "rank 1 to listen")
        config = json.loads(console().split("VS Code attach configuration: ")[1].splitlines()[0])
        assert config["connect"] == {"host": "127.0.0.1", "port": port} and config["request"] == "attach"
        assert f"ssh -N -L {port}:127.0.0.1:{port} " in console()
        time.sleep(3)  # longer than the script's 2 s process-group timeout: rank 0 must still be waiting
        c = DapClient.connect(config["connect"]["host"], config["connect"]["port"], 30)
        try:
            c.request("initialize", {"clientID": "mldebug", "adapterID": "debugpy", "linesStartAt1": True,
                                     "columnsStartAt1": True, "pathFormat": "path"})
            seq = c.send("attach", {"justMyCode": config["justMyCode"]})
            assert c.wait_event("initialized", 30) is not None
            c.request("setBreakpoints", {"source": {"path": str(script)}, "breakpoints": [{"line": 7}]})
            c.request("configurationDone")
            c.wait_response(seq, "attach", 30)
            stopped = c.wait_event("stopped", 120)
            assert stopped is not None and stopped["reason"] == "breakpoint", stopped
            frame = c.request("stackTrace", {"threadId": stopped["threadId"], "levels": 1})["stackFrames"][0]
            assert frame["line"] == 7
            got = c.request("evaluate", {"expression": "int(t.item()) * 100 + step", "frameId": frame["id"],
                                         "context": "watch"})
            assert got["result"] == "241"  # the all_reduce with rank 0 went through: 2 * 100 + 41
            c.request("continue", {"threadId": stopped["threadId"]})
            c.request("disconnect", {"terminateDebuggee": False})
        finally:
            c.close()
        assert job.wait(timeout=120) == 0, job.stderr.read() if job.stderr else ""
    finally:
        if job.poll() is None:
            job.kill()
            job.wait(timeout=30)
    text = console()
    assert "rank 0 reduced 2 step 41" in text and "rank 1 reduced 2 step 41" in text, text[-2000:]


def test_train_debug_rank_waits_for_a_dap_client_then_the_job_finishes(tmp_path: Path) -> None:
    """`mldebug train --debug-rank 1 --json`: rank 1 says where it listens (one JSON line on stderr), waits;
    mldebug's DAP client attaches, pauses it (rank 1, in the training's own code), lets it go; the job ends
    well with its one document on stdout, and nothing listens on the port after."""
    import socket

    from ml_debug.debugger.dap import DapClient

    _parts()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    job = subprocess.Popen([sys.executable, "-m", "ml_debug", "train", "--nproc-per-node", "2", "--debug-rank", "1",
                            "--debug-port", str(port), "--preset", "tiny", "--steps", "1", "--data", "synthetic",
                            "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        assert job.stderr is not None
        said = ""
        while not said.endswith("\n") or not said.splitlines()[-1].startswith('{"schema": "mldebug.debug_rank"'):
            line = job.stderr.readline()
            assert line, said
            said += line
        info = json.loads(said.splitlines()[-1])
        validate_schema(info, "debug-rank")
        assert (info["rank"], info["port"], info["waiting"]) == (1, port, True), info
        assert info["vscode"]["connect"] == {"host": "127.0.0.1", "port": port}
        c = DapClient.connect("127.0.0.1", port, 30)
        try:
            c.request("initialize", {"clientID": "mldebug", "adapterID": "debugpy", "linesStartAt1": True,
                                     "columnsStartAt1": True, "pathFormat": "path"})
            seq = c.send("attach", {"justMyCode": False})
            assert c.wait_event("initialized", 30) is not None
            c.request("configurationDone")
            c.wait_response(seq, "attach", 30)
            main = next(t for t in c.request("threads")["threads"] if t["name"] == "MainThread")
            c.request("pause", {"threadId": main["id"]})
            stopped = c.wait_event("stopped", 60)
            assert stopped is not None, "rank 1 never stopped"
            frames = c.request("stackTrace", {"threadId": main["id"], "levels": 100})["stackFrames"]
            assert any("ml_debug" in (f.get("source") or {}).get("path", "") for f in frames), frames
            got = c.request("evaluate", {"expression": "__import__('os').environ['RANK']",
                                         "frameId": frames[0]["id"], "context": "watch"})
            assert got["result"] == "'1'"
            c.request("continue", {"threadId": main["id"]})
            c.request("disconnect", {"terminateDebuggee": False})
        finally:
            c.close()
        out, err = job.communicate(timeout=180)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait(timeout=30)
    assert job.returncode == 0, err[-3000:]
    doc = json.loads(out)
    validate_schema(doc, "train")
    assert doc["result"]["world_size"] == 2, doc["result"]
    psutil = require_module("psutil")  # debugpy's port went with the rank
    assert not [c for c in psutil.net_connections(kind="inet") if c.laddr and c.laddr.port == port
                and c.status == psutil.CONN_LISTEN]
