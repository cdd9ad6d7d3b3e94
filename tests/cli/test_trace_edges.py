"""`mldebug trace` and `trace-tail` at their edges: -m like python -m, the documented examples, option
names in errors, signals that cannot be caught, files that are not trace files."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from ml_debug.cli.trace import TRACE_EXAMPLES
from ml_debug.tracing.command_options import TraceCommandOptions
from tests.conftest import REPO, mldebug
from tests.fakes import pythonpath

# The installed `mldebug` script: unlike `python -m ml_debug`, it does not put the current directory
# on sys.path, so a module found there was found by `mldebug trace -m` itself.
CONSOLE_SCRIPT = "import sys; del sys.path[0]; sys.argv[0] = 'mldebug'; from ml_debug.cli.app import main; main()"
ARGV_PROGRAM = "import json, sys\nprint('argv', json.dumps(sys.argv[1:]))\n"


def _console(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = pythonpath(env)
    for var in ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        env.pop(var, None)
    return subprocess.run([sys.executable, "-c", CONSOLE_SCRIPT, *args], cwd=cwd, env=env, text=True,
                          capture_output=True, timeout=120)


def _program_argv(stdout: str) -> list[str]:
    [line] = [x for x in stdout.splitlines() if x.startswith("argv ")]
    return json.loads(line[5:])


def _usage_error(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 2 and lines[0].startswith("mldebug: error: ") and lines[1].startswith("hint: "), r.stderr
    assert "internal error" not in r.stderr
    return lines[0]


def _programs(d: Path) -> None:
    """train.py, mymod.py and mypkg/train.py, each printing the arguments it got."""
    (d / "mypkg").mkdir()
    (d / "mypkg" / "__init__.py").write_text("")
    for p in (d / "train.py", d / "mymod.py", d / "mypkg" / "train.py"):
        p.write_text(ARGV_PROGRAM)


# ------------------------------------------------------------------ mldebug trace -m


@pytest.mark.parametrize("module", ["mymod", "mypkg.train"])
def test_module_in_the_current_directory_runs_as_with_python_m(tmp_path, module):
    _programs(tmp_path)
    r = _console("trace", "-o", "t", "-m", module, "--x", "1", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert _program_argv(r.stdout) == ["--x", "1"]
    assert len(list((tmp_path / "t").glob("trace-*.txt"))) == 1


@pytest.mark.parametrize(("module", "missing"), [
    ("nonexist_parent.child", "nonexist_parent"),
    ("mypkg.nope.deeper", "mypkg.nope"),
    ("no_such_module_zz", "no_such_module_zz"),
])
def test_missing_module_or_parent_package_is_a_usage_error(tmp_path, module, missing):
    _programs(tmp_path)
    line = _usage_error(_console("trace", "-o", "t", "-m", module, cwd=tmp_path))
    assert f"no module named {missing!r}" in line
    assert not (tmp_path / "t").exists() or not list((tmp_path / "t").iterdir())


# ------------------------------------------------------------------ examples as written


def _trace_flags() -> set[str]:
    flags: set[str] = set()
    for f in fields(TraceCommandOptions):
        opt = f.metadata["cli"]
        if not opt.argument:
            flags.update(opt.flags or (f"--{f.name.replace('_', '-')}",))
    return flags


def _documented_examples() -> list[str]:
    """`mldebug trace` command lines of the help and of docs/commands/trace*.md that run locally."""
    docs = [line.strip() for page in (REPO / "docs" / "commands").glob("trace*.md")
            for line in page.read_text().splitlines()]
    lines = [*TRACE_EXAMPLES, *docs]
    return sorted({x for x in lines if x.startswith("mldebug trace ") and ("train.py" in x or "mypkg" in x)})


@pytest.mark.parametrize("example", _documented_examples())
def test_examples_give_trace_options_before_the_program(tmp_path, example):
    """An option of mldebug trace written after the program would reach the program instead."""
    _programs(tmp_path)
    words = shlex.split(example, comments=True)
    program = next(i for i, w in enumerate(words) if w in ("train.py", "mypkg.train"))
    r = _console(*words[1:], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    got = _program_argv(r.stdout)
    assert got == words[program + 1:]
    assert not _trace_flags() & set(got), f"{example}: mldebug trace's options go to the program: {got}"
    [trace] = re.findall(r"wrote (\S+)", r.stderr)
    ring = words[words.index("--ring") + 1] if "--ring" in words else None
    assert f" mode={f'ring({ring})' if ring else 'stream'} " in Path(trace).read_text().splitlines()[0]


# ------------------------------------------------------------------ errors name the CLI option


@pytest.mark.parametrize("sig", ["KILL", "9", "STOP", "SIGSTOP"])
def test_uncatchable_dump_signal_is_a_usage_error(tmp_path, sig):
    (tmp_path / "loop.py").write_text("print('ran')\n")
    r = mldebug("trace", "--ring", "100", "--dump-signal", sig, "-o", "d", "--", "loop.py", cwd=tmp_path)
    line = _usage_error(r)
    assert "--dump-signal" in line and "cannot be caught" in line
    assert "ran" not in r.stdout


def test_bad_include_names_the_option(tmp_path):
    (tmp_path / "t1.py").write_text("pass\n")
    line = _usage_error(mldebug("trace", "-o", "d", "--include", "a b", "t1.py", cwd=tmp_path))
    assert line.startswith("mldebug: error: --include: ") and "packages_to_include" not in line


# ------------------------------------------------------------------ trace-tail: what is not a trace file

HEAD = "# nicertrace pid={pid} host=h rank=0 python=3.11.7 mode=stream argv=train.py\n"


def _real_trace(d: Path, pid: int = 100) -> Path:
    p = d / f"trace-h-0-{pid}.txt"
    p.write_text(HEAD.format(pid=pid) + "0:00:01.000 --> train:1 main\n0:00:01.250     train.py:2: step()\n")
    return p


def test_tail_empty_path_is_a_usage_error(tmp_path):
    _real_trace(tmp_path)
    assert "an empty PATH argument" in _usage_error(mldebug("trace-tail", "", cwd=tmp_path))


@pytest.mark.parametrize(("name", "data"), [
    ("slurm-100.out", b"step 1 loss 2.3\nstep 2 loss 2.1\nsrun: error: node1: task 0: Killed\n"),
    ("random.bin", bytes(range(256)) * 4),
    ("empty.txt", b""),
    ("trace-h-0-7.txt", b"step 1 loss 2.3\n"),  # named like one, no header
])
def test_tail_refuses_a_file_that_is_not_a_trace(tmp_path, name, data):
    (tmp_path / name).write_bytes(data)
    line = _usage_error(mldebug("trace-tail", name, cwd=tmp_path))
    assert "is not a trace file" in line


def test_tail_lists_skipped_files_with_their_reason(tmp_path):
    d = tmp_path / "traces"
    d.mkdir()
    real = _real_trace(d)
    (d / "trace-notes.txt").write_text(HEAD.format(pid=1))  # a header, but not trace-HOST-RANK-PID.txt
    (d / "trace-h-1-101.txt").write_text("srun: error: node1: task 1: Killed\n")
    (tmp_path / "slurm-100.out").write_text("step 1\n")
    r = mldebug("--json", "trace-tail", "traces", "slurm-100.out", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)["result"]
    assert [f["path"] for f in result["files"]] == [f"traces/{real.name}"]
    skipped = {s["path"]: s["reason"] for s in result["skipped"]}
    assert set(skipped) == {"traces/trace-notes.txt", "traces/trace-h-1-101.txt", "slurm-100.out"}
    assert "not named trace-HOST-RANK-PID.txt" in skipped["traces/trace-notes.txt"]
    assert "is not a trace file" in skipped["traces/trace-h-1-101.txt"]
    assert "is not a trace file" in skipped["slurm-100.out"]
    assert "skipped 3 file(s)" in result["summary"]


def test_tail_directory_of_misnamed_files_only_is_a_usage_error(tmp_path):
    (tmp_path / "trace-notes.txt").write_text(HEAD.format(pid=1))
    assert "not named trace-HOST-RANK-PID.txt" in _usage_error(mldebug("trace-tail", ".", cwd=tmp_path))


# The mldebug process plants a link at the very name its trace file will have (its own pid), then execs
# mldebug trace: the pid, and so the name, stay the same, as if another user had planted it beforehand.
PLANT_THEN_TRACE = """\
import os, sys
from ml_debug.tracing.identity import trace_file_name
out, victim = sys.argv[1], sys.argv[2]
os.symlink(victim, os.path.join(out, trace_file_name()))
os.execv(sys.executable, [sys.executable, "-m", "ml_debug", *sys.argv[3:-1], "trace", "-o", out, "--", sys.argv[-1]])
"""


@pytest.mark.parametrize("json_mode", [False, True])
def test_a_link_planted_at_the_trace_files_name_is_refused_and_blamed(tmp_path, json_mode):
    """Once: a traceback, a false "wrote ..." and a JSON document that blamed the program (exit 1). Now
    one line that names the link, exit 2, the program not run, the link's target untouched."""
    out, victim, ran = tmp_path / "shared", tmp_path / "victim", tmp_path / "ran"
    out.mkdir()
    victim.write_text("root's file\n")
    program = tmp_path / "p.py"
    program.write_text(f"open({str(ran)!r}, 'w').close()\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = pythonpath(env)
    for var in ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        env.pop(var, None)
    proc = subprocess.run([sys.executable, "-c", PLANT_THEN_TRACE, str(out), str(victim),
                           *(["--json"] if json_mode else []), str(program)],
                          env=env, text=True, capture_output=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "wrote" not in proc.stderr, proc.stderr
    [error] = [line for line in proc.stderr.splitlines() if line.startswith("mldebug: error:")]
    assert f"a symbolic link (to {victim}): not written, the program not run" in error, proc.stderr
    assert victim.read_text() == "root's file\n" and not ran.exists()
    if json_mode:
        doc = json.loads(proc.stdout)
        assert doc["schema"] == "mldebug.error" and doc["result"]["error"]["kind"] == "usage", doc
        assert "symbolic link" in doc["result"]["error"]["message"], doc
