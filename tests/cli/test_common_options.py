"""The CLI skeleton: help without torch, version, one-line errors with hints and exit code 2."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from ml_debug import __version__
from ml_debug.cli.app import COMMAND_MODULES, COMMANDS
from tests.conftest import REPO, mldebug

PROBE = """
import sys
from ml_debug.cli.app import run
rc = run(sys.argv[1:])
heavy = sorted(m for m in ("torch", "paramiko", "numpy", "pynvml") if m in sys.modules)
print("RC", rc, "HEAVY", ",".join(heavy) or "-", file=sys.stderr)
"""


def _probe(*args: str) -> tuple[int, str, str]:
    out = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True,
                         timeout=120, cwd=REPO)
    last = out.stderr.strip().splitlines()[-1]
    _, rc, _, heavy = last.split()
    return int(rc), heavy, out.stdout


def _commands() -> list[str]:
    from ml_debug.cli.app import build_app

    app = build_app()
    return sorted(c.name or c.callback.__name__.replace("_", "-") for c in app.registered_commands)


def test_help_lists_commands_and_imports_nothing_heavy():
    rc, heavy, out = _probe("--help")
    assert rc == 0 and heavy == "-"
    assert "Exit codes" in out and "env" in out


@pytest.mark.parametrize("command", _commands())
def test_every_command_help_is_cheap(command: str):
    rc, heavy, out = _probe(command, "--help")
    assert rc == 0, out
    assert heavy == "-", f"`mldebug {command} --help` imported {heavy}"
    assert "Usage: mldebug " + command in out


def test_env_without_torch_does_not_import_torch():
    rc, heavy, _ = _probe("env", "--no-torch", "--json")
    assert rc == 0 and "torch" not in heavy.split(",")


def test_every_command_module_registers():
    # exactly the commands the app advertises, each registered by its own module and nothing else
    assert _commands() == sorted(COMMANDS)
    for module in COMMAND_MODULES:
        from ml_debug.cli.app import build_app

        names = [c.name for c in build_app([next(k for k, v in COMMANDS.items() if v == module)]).registered_commands]
        assert sorted(names) == sorted(k for k, v in COMMANDS.items() if v == module), module


def test_version_and_python_dash_m():
    out = mldebug("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"mldebug {__version__}"


def test_json_version_is_one_document():
    from tests.conftest import validate_schema

    for argv in (["--json", "--version"], ["--version", "--json"]):
        out = mldebug(*argv)
        assert out.returncode == 0, out.stderr
        doc = json.loads(out.stdout)  # the whole of stdout is the one document
        validate_schema(doc, "version")
        assert doc["result"] == {"ok": True, "summary": f"mldebug {__version__}", "version": __version__}


def _run_with_streams(argv: list[str], *, stdin: object = None, stdout: object = None, close: tuple[int, ...] = (),
                      env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m ml_debug ARGV` with odd standard streams: `close` names descriptors closed in the child
    before it starts (as `>&-` does), the others as given."""
    import os

    def closing() -> None:
        for fd in close:
            os.close(fd)

    return subprocess.run([sys.executable, "-m", "ml_debug", *argv], stdin=stdin, stdout=stdout,
                          stderr=subprocess.PIPE, text=True, timeout=120, cwd=REPO, preexec_fn=closing,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


@pytest.mark.parametrize("argv", [["--help"], ["env", "--no-torch"], ["--json", "env", "--no-torch"], ["--version"]])
def test_odd_standard_streams_are_no_internal_error(argv: list[str], tmp_path) -> None:  # type: ignore[no-untyped-def]
    """stdout on /dev/full: one line and exit 3 (was: internal error: OSError). stdout or stdin closed
    (`>&-`, `<&-`): the command runs (was: internal error: AttributeError, or a traceback)."""
    with open("/dev/full", "w") as full:
        proc = _run_with_streams(argv, stdout=full)
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.splitlines()[0] == "mldebug: error: cannot write to standard output: No space left on device"
    assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr
    for fds in ((1,), (0,), (0, 1)):
        proc = _run_with_streams(argv, close=fds, stdin=subprocess.DEVNULL if 0 not in fds else None,
                                 stdout=subprocess.PIPE if 1 not in fds else None)
        assert proc.returncode == 0, (fds, proc.stderr)
        assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr, (fds, proc.stderr)


def test_an_ascii_only_stdout_shows_what_it_cannot_encode(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """PYTHONIOENCODING=ascii (and LANG=C): a job's log line with é and → was an internal
    UnicodeEncodeError; it is written as \\xe9 and \\u2192, and --help still prints."""
    log = tmp_path / "job.log"
    log.write_text("[rank0]: caf\u00e9 \u2192 boom\n[rank0]: RuntimeError: x\n", encoding="utf-8")
    env = {"PYTHONIOENCODING": "ascii", "LANG": "C", "LC_ALL": "C"}
    lines = _run_with_streams(["logs", "--rank", "0", str(log)], stdout=subprocess.PIPE, env=env)
    assert lines.returncode == 0 and "caf\\xe9 \\u2192 boom" in lines.stdout, lines.stderr
    verdict = _run_with_streams(["logs", str(log)], stdout=subprocess.PIPE, env=env)
    assert verdict.returncode == 1 and "RuntimeError: x" in verdict.stdout, verdict.stderr
    helped = _run_with_streams(["--help"], stdout=subprocess.PIPE, env=env)
    assert helped.returncode == 0 and "Usage: mldebug" in helped.stdout, helped.stderr
    for proc in (lines, verdict, helped):
        assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("argv, needle", [
    (["no-such-command"], "No such command 'no-such-command'"),
    (["env", "--bogus"], "No such option: --bogus"),
    (["--json"], "Missing command"),
    (["health", "--level", "9"], "Invalid value for '--level'"),
    (["allreduce-bench", "-b", "10X"], "bad --min-bytes '10X'"),
    (["exec", "--hosts", "/nonexistent/hostfile", "--", "true"], "hostfile '/nonexistent/hostfile' does not exist"),
    (["dump-stacks", "--hosts", "missing-hosts.txt"], "hostfile 'missing-hosts.txt' does not exist"),
])
def test_bad_usage_is_one_line_with_hint_and_exit_2(argv: list[str], needle: str):
    out = mldebug(*argv)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 2, out.stderr
    assert lines[0].startswith("mldebug: error: ") and needle in lines[0]
    assert lines[1].startswith("hint: ")
    if "--json" in argv:  # a script that asked for JSON gets one document on every path
        assert json.loads(out.stdout)["result"]["exit_code"] == 2
    else:
        assert out.stdout == ""


def test_debug_shows_the_traceback():
    out = mldebug("--debug", "no-such-command")
    assert out.returncode == 2
    assert "Traceback (most recent call last)" in out.stderr
    assert "mldebug: error: No such command" in out.stderr


def test_library_errors_become_one_line_with_their_exit_code():
    code = ("import sys, typer\n"
            "from ml_debug.cli import app as a\n"
            "from ml_debug.core.errors import EnvironmentProblem\n"
            "def boom():\n"
            "    raise EnvironmentProblem('py-spy is not installed', 'pip install py-spy')\n"
            "orig = a.build_app\n"
            "def build(argv=None):\n"
            "    app = orig(); app.command('boom')(boom); return app\n"
            "a.build_app = build\n"
            "sys.exit(a.run(['boom']))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.returncode == 3
    assert out.stderr == "mldebug: error: py-spy is not installed\nhint: pip install py-spy\n"



HELPS = """
import contextlib, io, json, sys
from ml_debug.cli.app import run
pages = {}
for name in sys.argv[1:]:
    page = io.StringIO()
    with contextlib.redirect_stdout(page):
        code = run([name, "--help"])
    pages[name] = (code, page.getvalue())
print(json.dumps(pages))
"""


@pytest.fixture(scope="module")
def taking_dirs() -> dict[str, list[str]]:
    """The commands whose `--help` offers --out-dir (results also written as they arrive) and --bundle-dir
    (where gathered evidence goes): every page from one interpreter (the same text as `mldebug C --help`,
    which the help tests above run one by one), not twenty more interpreters."""
    commands = _commands()
    proc = subprocess.run([sys.executable, "-c", HELPS, *commands], capture_output=True, text=True, timeout=120,
                          cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    pages = json.loads(proc.stdout)
    assert sorted(pages) == commands and all(code == 0 and f"Usage: mldebug {c}" in text
                                             for c, (code, text) in pages.items()), proc.stderr[-3000:]
    return {flag: [c for c, (_, text) in pages.items() if re.search(rf"^\s+(-\w, )?{flag} ", text, re.M)]
            for flag in ("--out-dir", "--bundle-dir")}


@pytest.mark.parametrize(("word", "said"), [("", "{flag} is empty"), ("/etc/hostname", "is not a directory")])
def test_every_out_dir_refuses_an_empty_word_and_a_file(word: str, said: str, taking_dirs: dict[str, list[str]],
                                                        tmp_path) -> None:  # type: ignore[no-untyped-def]
    """An unset shell variable (`--out-dir "$OUT"`) wrote exec's and watch's files into the current
    directory (gpu-test's, dump-stacks' and drill's too): every command's --out-dir and --bundle-dir refuses
    it, before any work."""
    assert {"check", "health", "dump-stacks", "gpu-test", "exec", "trace"} <= set(taking_dirs["--out-dir"]), taking_dirs
    assert {"watch", "drill"} <= set(taking_dirs["--bundle-dir"]), taking_dirs
    for flag, taking in taking_dirs.items():
        for name in taking:
            args = [name, flag, word] + {"exec": ["--", "true"], "trace": [__file__]}.get(name, [])
            proc = subprocess.run([sys.executable, "-m", "ml_debug", *args], capture_output=True, text=True,
                                  timeout=60, cwd=tmp_path, stdin=subprocess.DEVNULL)
            assert proc.returncode == 2, (name, proc.stderr)
            assert proc.stderr.startswith("mldebug: error: "), (name, proc.stderr)
            assert said.format(flag=flag) in proc.stderr.splitlines()[0], (name, proc.stderr)
            assert list(tmp_path.iterdir()) == [], name
