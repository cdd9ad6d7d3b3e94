"""`mldebug trace` (a program under NicerTrace: exit codes, -m, forks, ring dumps) and `mldebug trace-tail`."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import jsonschema
import pytest

from tests.conftest import REPO, mldebug, validate_schema, wait_in_function

SCHEMA = json.loads((REPO / "ml_debug" / "schemas" / "trace-tail.json").read_text())

SCRIPT = textwrap.dedent('''
    import os, sys, time, threading

    def busy(n):
        return n + 1

    def sleeper():
        print("ready", flush=True)
        time.sleep(60)

    def stuck_here(path):
        print("ready", flush=True)
        with open(path) as f:   # a FIFO: blocks until the test writes to it
            return f.read()

    def blocked_in_c():
        # The main thread blocks SIGTERM and waits in C; another thread takes the signal,
        # like a gloo/NCCL thread while the main thread sits in a collective.
        helper = threading.Thread(target=time.sleep, args=(60,), daemon=True)
        helper.start()
        import signal
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])
        r, w = os.pipe()
        print("ready", flush=True)
        os.read(r, 1)

    def main():
        for i in range(20):
            busy(i)
        mode = sys.argv[1]
        if mode == "sleep":
            sleeper()
        elif mode == "fifo":
            stuck_here(sys.argv[2])
        elif mode == "blocked":
            blocked_in_c()
        elif mode == "fork":
            pid = os.fork()
            if pid == 0:
                busy(100)
                sys.exit(0)
            os.waitpid(pid, 0)
            busy(200)
        elif mode == "fail":
            raise ValueError("bad input")
        elif mode == "exit":
            sys.exit(int(sys.argv[2]))
        print("args", sys.argv[1:])

    if __name__ == "__main__":
        main()
''')

EVENT = re.compile(r"^\d+:\d\d:\d\d\.\d{3} (\{[^}]+\} )?(--> |    )")


@pytest.fixture
def script(tmp_path: Path) -> Path:
    p = tmp_path / "prog.py"
    p.write_text(SCRIPT)
    return p


def _files(d: Path) -> list[Path]:
    return sorted(d.glob("trace-*.txt"))


def _events(path: Path) -> list[str]:
    return [x for x in path.read_text().splitlines() if EVENT.match(x)]


def _popen(*args: str, cwd: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for var in ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        env.pop(var, None)
    return subprocess.Popen([sys.executable, "-m", "ml_debug", *args], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)


def _wait_ready(p: subprocess.Popen[str], timeout: float = 60) -> None:
    assert p.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = p.stdout.readline()
        if line.strip() == "ready":
            return
        if not line and p.poll() is not None:
            raise AssertionError(f"exited early rc={p.returncode}: {p.stderr.read() if p.stderr else ''}")
    raise AssertionError("program never got ready")


def _stop(p: subprocess.Popen[str]) -> None:
    if p.poll() is None:
        p.kill()
    p.wait(timeout=30)


# ------------------------------------------------------------------ mldebug trace


def test_trace_script_writes_one_file_and_passes_arguments(tmp_path, script):
    out = tmp_path / "out"
    r = mldebug("trace", "--out-dir", str(out), "--", str(script), "plain", "--ring", "x", cwd=tmp_path,
                env={"RANK": "2"})
    assert r.returncode == 0, r.stderr
    assert "args ['plain', '--ring', 'x']" in r.stdout  # options after the script belong to it
    [f] = _files(out)
    assert f.name == f"trace-{socket.gethostname()}-2-{_pid(f)}.txt"
    events = _events(f)
    assert any(e.endswith(f"--> {script}:1 <module>") for e in events)
    assert any("--> " in e and e.endswith(" main") for e in events)
    assert any("prog.py" in e and "busy(i)" in e for e in events)
    assert not any("runpy" in e or "nicertrace" in e or "typer" in e for e in events)
    assert f"wrote {f}" in r.stderr


def _pid(f: Path) -> int:
    return int(f.stem.rsplit("-", 1)[1])


@pytest.mark.parametrize(("args", "code", "stderr"), [
    (["exit", "3"], 3, ""),
    (["fail"], 1, "ValueError: bad input"),
])
def test_trace_exit_codes_are_the_programs(tmp_path, script, args, code, stderr):
    """With --json, the run's one document says how the program ended (it was an error document)."""
    r = mldebug("trace", "--json", "--out-dir", str(tmp_path), str(script), *args, cwd=tmp_path)
    assert r.returncode == code, r.stderr
    assert stderr in r.stderr
    doc = json.loads(r.stdout)
    validate_schema(doc, "trace")
    assert doc["result"]["ok"] is False and doc["result"]["exit_code"] == code
    if stderr:
        assert "mldebug: error" not in r.stderr and "runpy" not in r.stderr  # the user's traceback only


def test_trace_module(tmp_path):
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "tool.py").write_text("import sys\n\ndef run():\n    return sys.argv[1:]\n\nprint('got', run())\n")
    r = mldebug("trace", "-o", str(tmp_path / "t"), "-m", "mypkg.tool", "--flag", "v", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "got ['--flag', 'v']" in r.stdout
    [f] = _files(tmp_path / "t")
    # Your own code is named by its file (the seed's way), not by its dotted module name.
    assert any(e.endswith(f"--> {pkg / 'tool.py'}:3 run") for e in _events(f)), _events(f)


def test_trace_include_adds_a_package(tmp_path):
    prog = tmp_path / "j.py"
    prog.write_text("import json\n\ndef main():\n    return json.dumps([1])\n\nmain()\n")
    plain = mldebug("trace", "-o", str(tmp_path / "a"), str(prog), cwd=tmp_path)
    incl = mldebug("trace", "-o", str(tmp_path / "b"), "--include", "json", str(prog), cwd=tmp_path)
    assert plain.returncode == incl.returncode == 0
    assert not any("json" in e and "-->" in e for e in _events(_files(tmp_path / "a")[0]))
    assert any("--> json.encoder:" in e for e in _events(_files(tmp_path / "b")[0]))


def test_trace_seed_format(tmp_path, script):
    """--format seed: the handbook NicerTrace's lines; the script by its full path though given relative."""
    r = mldebug("trace", "-o", "s", "--format", "seed", "--log-pids", script.name, "plain", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    [f] = _files(tmp_path / "s")
    head, *events = f.read_text().splitlines()
    assert head.startswith("# nicertrace ") and " format=seed " in head
    pid = _pid(f)
    assert f"{pid}  {script}:1 <module>" in events  # a call: pid, a leading space, no time stamp
    main = script.read_text().splitlines().index("def main():") + 1
    assert f"{pid}  {script}:{main} main" in events
    # A line: pid, H:MM:SS, the file's name, the line number in 6 columns, the source as written.
    loop = [m for m in (re.fullmatch(rf"{pid} \d+:\d\d:\d\d prog\.py:( +\d+): {{9}}busy\(i\)", e) for e in events) if m]
    assert len(loop) == 20 and all(len(m.group(1)) == 6 for m in loop)


@pytest.mark.parametrize("args", [
    ["--", "does-not-exist.py"],
    ["--format", "fancy", "x.py"],
    ["-m", "no_such_module_zzz"],
    ["--idle-dump", "3", "x.py"],
    ["--ring", "5", "--dump-signal", "NOPE", "x.py"],
    ["--include", "not a name", "x.py"],
])
def test_trace_usage_errors(tmp_path, args):
    (tmp_path / "x.py").write_text("pass\n")
    r = mldebug("trace", "-o", str(tmp_path), *args, cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.startswith("mldebug: error: ") and "\nhint: " in r.stderr


def test_forked_child_gets_its_own_file(tmp_path, script):
    """With --json, one document: the child, which returns through mldebug too, prints none; the program's own
    output is on stderr."""
    out = tmp_path / "f"
    r = mldebug("trace", "--json", "-o", str(out), str(script), "fork", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    validate_schema(doc, "trace")
    assert "args ['fork']" in r.stderr
    files = _files(out)
    assert len(files) == 2
    child = next(f for f in files if "forked_from=" in f.read_text().splitlines()[0])
    parent = next(f for f in files if f != child)
    assert doc["result"]["trace_file"] == str(parent) and doc["result"]["ok"]
    assert f"forked_from={_pid(parent)} " in child.read_text().splitlines()[0]
    assert any("busy(100)" in e for e in _events(child))
    assert not any("busy(100)" in e for e in _events(parent))
    assert any("busy(200)" in e for e in _events(parent))


# ------------------------------------------------------------------ ring mode


def _ring_file(out: Path) -> tuple[str, list[str]]:
    [f] = _files(out)
    text = f.read_text()
    reason = re.search(r"^# dump reason=(.*?) at=", text, re.M)
    assert reason, text
    return reason.group(1), _events(f)


def test_ring_normal_exit_writes_last_n_events(tmp_path, script):
    r = mldebug("trace", "-o", str(tmp_path / "r"), "--ring", "4", str(script), "plain", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    reason, events = _ring_file(tmp_path / "r")
    assert reason == "end"
    assert len(events) == 4
    assert events[-1].endswith("print(\"args\", sys.argv[1:])")


def test_ring_killed_by_signal(tmp_path, script):
    p = _popen("trace", "-o", str(tmp_path / "s"), "--ring", "6", str(script), "sleep", cwd=tmp_path)
    try:
        _wait_ready(p)
        os.kill(p.pid, signal.SIGUSR1)  # a snapshot: keeps running
        deadline = time.monotonic() + 20
        while not _files(tmp_path / "s") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert p.poll() is None
        reason, _ = _ring_file(tmp_path / "s")
        assert reason.startswith("signal SIGUSR1")
        os.kill(p.pid, signal.SIGTERM)
        p.wait(timeout=30)
    finally:
        _stop(p)
    # still dies of SIGTERM itself (a shell reports 128 + 15 = 143), not an exit(143) of its own
    assert p.returncode == -signal.SIGTERM
    reason, events = _ring_file(tmp_path / "s")
    assert reason.startswith("signal SIGTERM")
    assert len(events) == 6
    assert events[-3].endswith(f"--> {script}:7 sleeper")
    assert events[-1].endswith("time.sleep(60)")


def test_ring_signal_while_main_thread_blocked_in_c(tmp_path, script):
    p = _popen("trace", "-o", str(tmp_path / "b"), "--ring", "5", str(script), "blocked", cwd=tmp_path)
    try:
        _wait_ready(p)
        # "ready" is printed just before os.read: wait until the main thread sits in it (in C)
        wait_in_function(p.pid, {"blocked_in_c"})
        os.kill(p.pid, signal.SIGTERM)
        p.wait(timeout=30)
    finally:
        _stop(p)
    assert p.returncode == 128 + signal.SIGTERM
    reason, events = _ring_file(tmp_path / "b")
    assert reason == "signal SIGTERM (main thread blocked)"
    assert events[-1].endswith("os.read(r, 1)")


def test_ring_hang_leaves_idle_dump_then_final_dump(tmp_path, script):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    out = tmp_path / "h"
    p = _popen("trace", "-o", str(out), "--ring", "5", "--idle-dump", "0.5", str(script), "fifo", str(fifo),
               cwd=tmp_path)
    try:
        _wait_ready(p)
        deadline = time.monotonic() + 30
        while not _files(out) and time.monotonic() < deadline:
            time.sleep(0.1)
        reason, events = _ring_file(out)
        assert reason == "idle 0.5s"
        assert len(events) == 5
        assert events[-3].endswith(f"--> {script}:11 stuck_here")
        with open(fifo, "w") as f:
            f.write("go")
        p.wait(timeout=30)
    finally:
        _stop(p)
    assert p.returncode == 0
    reason, events = _ring_file(out)
    assert reason == "end"
    assert events[-1].endswith("print(\"args\", sys.argv[1:])")


# ------------------------------------------------------------------ trace-tail

HEAD = "# nicertrace pid={pid} host={host} rank={rank} python=3.11.7 mode=stream argv=train.py\n"
COMMON = ["--> train:10 train_step", "    train.py:11: loss = model(batch)", "--> train:30 sync",
          "    train.py:31: dist.all_reduce(t)"]


def _write_trace(d: Path, host: str, rank: int, pid: int, body: list[str], t0: float = 1.0) -> Path:
    p = d / f"trace-{host}-{rank}-{pid}.txt"
    lines = [HEAD.format(pid=pid, host=host, rank=rank)]
    for i, b in enumerate(body):
        lines.append(f"0:00:{t0 + i * 0.25 + pid % 7:06.3f} {b}\n")
    p.write_text("".join(lines))
    return p


def _synthetic(d: Path, odd: bool = True) -> None:
    """Four ranks; the time stamps and the address in the last line differ on every rank."""
    for rank in range(4):
        body = ["--> train:1 main", "    train.py:2: for step in range(10):", *COMMON[:-1],
                f"    train.py:31: dist.all_reduce(t)  # t at 0x7f{rank:04x}"]
        if odd and rank == 2:
            body = [*body[:-2], "--> train:40 save_checkpoint", "    train.py:41: torch.save(state, path)"]
        _write_trace(d, "node-a" if rank < 2 else "node-b", rank, 1000 + rank, body)


def test_tail_groups_the_odd_rank_apart(tmp_path):
    _synthetic(tmp_path)
    r = mldebug("trace-tail", str(tmp_path), "-n", "3", "--json")
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    jsonschema.validate(doc, SCHEMA)
    res = doc["result"]
    assert not res["ok"]
    assert [(g["size"], g["odd"], g["ranks"]) for g in res["groups"]] == [(3, False, [0, 1, 3]), (1, True, [2])]
    assert res["groups"][1]["ending"][-2] == "--> train:40 save_checkpoint"
    assert res["groups"][0]["ending"][-1] == "    train.py:31: dist.all_reduce(t)  # t at 0x?"
    assert res["odd_files"] == [str(tmp_path / "trace-node-b-2-1002.txt")]
    assert "rank 2 (node-b pid 1002)" in res["summary"] and "torch.save" in res["summary"]
    f2 = next(f for f in res["files"] if f["rank"] == 2)
    assert (f2["host"], f2["pid"], f2["group"], len(f2["tail"])) == ("node-b", 1002, "B", 3)


def test_tail_all_agree_exit_0_and_grep_counts(tmp_path):
    _synthetic(tmp_path, odd=False)
    r = mldebug("trace-tail", str(tmp_path), "--grep", r"all_reduce|train_step", "--json")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)["result"]
    assert res["ok"] and len(res["groups"]) == 1 and res["groups"][0]["size"] == 4
    assert [f["grep_count"] for f in res["files"]] == [2, 2, 2, 2]
    assert res["summary"].startswith("all 4 trace files end the same way")


def test_tail_main_thread_only_unless_asked(tmp_path):
    _write_trace(tmp_path, "h", 0, 10, [*COMMON, "{loader} --> data:5 fetch"])
    _write_trace(tmp_path, "h", 1, 11, [*COMMON, "{loader} --> data:9 decode"])
    assert mldebug("trace-tail", str(tmp_path), "-n", "2").returncode == 0
    r = mldebug("trace-tail", str(tmp_path), "-n", "2", "--all-threads", "--json")
    assert r.returncode == 1
    assert len(json.loads(r.stdout)["result"]["groups"]) == 2


def test_tail_reads_a_ring_dump(tmp_path, script):
    traced = mldebug("trace", "-o", str(tmp_path / "r"), "--ring", "3", str(script), "plain", cwd=tmp_path)
    assert traced.returncode == 0, traced.stderr
    r = mldebug("trace-tail", str(tmp_path / "r"), "--json")
    assert r.returncode == 0, r.stderr  # one file: it agrees with itself
    res = json.loads(r.stdout)["result"]
    jsonschema.validate(json.loads(r.stdout), SCHEMA)
    [f] = res["files"]
    assert (f["mode"], f["dump_reason"], f["rank"], len(f["tail"])) == ("ring(3)", "end", None, 3)
    assert f["last_event_unix"] is not None and f["silent_for_s"] >= 0


@pytest.mark.parametrize(("args", "msg"), [
    (["{d}/nowhere"], "no such file or directory"),
    (["{d}"], "no trace files"),
    (["{d}", "--grep", "("], "bad --grep pattern"),
])
def test_tail_usage_errors(tmp_path, args, msg):
    r = mldebug("trace-tail", *[a.format(d=tmp_path) for a in args])
    assert r.returncode == 2
    assert msg in r.stderr and "hint:" in r.stderr


GOLDEN = """\
3 of 4 trace files end the same way (train.py:31: dist.all_reduce(t)  # t at 0x?); different: rank 2 (node-b pid 1002) at: train.py:41: torch.save(state, path)

group A (majority): 3 files: rank 0 (node-a pid 1000), rank 1 (node-a pid 1001), rank 3 (node-b pid 1003)
      train.py:11: loss = model(batch)
  --> train:30 sync
      train.py:31: dist.all_reduce(t)  # t at 0x?

group B (odd one out): 1 file: rank 2 (node-b pid 1002)
      train.py:11: loss = model(batch)
  --> train:40 save_checkpoint
      train.py:41: torch.save(state, path)

files
group ┃ rank ┃ host   ┃ pid  ┃ mode   ┃ last event ┃ silent for ┃ file
━━━━━━╇━━━━━━╇━━━━━━━━╇━━━━━━╇━━━━━━━━╇━━━━━━━━━━━━╇━━━━━━━━━━━━╇━━━━━━━━━━━━━━━━━━━━━━━━━━
A     │ 0    │ node-a │ 1000 │ stream │ +S.SSSs    │ -          │ DIR/trace-node-a-0-1000.txt
A     │ 1    │ node-a │ 1001 │ stream │ +S.SSSs    │ -          │ DIR/trace-node-a-1-1001.txt
B     │ 2    │ node-b │ 1002 │ stream │ +S.SSSs    │ -          │ DIR/trace-node-b-2-1002.txt
A     │ 3    │ node-b │ 1003 │ stream │ +S.SSSs    │ -          │ DIR/trace-node-b-3-1003.txt
"""


def test_tail_human_golden(tmp_path):
    d = tmp_path / "t"
    d.mkdir()
    _synthetic(d)
    r = mldebug("trace-tail", "t", "-n", "3", cwd=tmp_path)
    assert r.returncode == 1
    text = re.sub(r"\+\d\.\d{3}s", "+S.SSSs", r.stdout).replace("t/trace-", "DIR/trace-")
    got = "\n".join(x.rstrip() for x in text.splitlines()) + "\n"
    assert got == GOLDEN
