"""Targets: hostfile formats, --hosts resolution, and bad input as one-line errors with exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from ml_debug.cli.app import run
from ml_debug.core.errors import UsageError
from ml_debug.remote.options import resolve_targets
from ml_debug.remote.runner import agent_argv, build_script, run_everywhere
from ml_debug.remote.targets import Target, parse_hostfile


def _file(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "hostfile"
    p.write_text(text)
    return p


def test_hostfile_formats(tmp_path: Path) -> None:
    p = _file(tmp_path, """
# ours
node1
node2:2222            # port
root@node3 port=2200
# DeepSpeed
worker-1 slots=8
# Open MPI
mpi1 slots=4 max_slots=8
mpi2 slots=2 max-slots=4
# MPICH host:N (a small N is a process count)
mpich1:8
ssh22:22
10.0.0.5
""")
    assert parse_hostfile(p) == [
        Target("node1"), Target("node2", port=2222), Target("node3", port=2200, user="root"),
        Target("worker-1", slots=8), Target("mpi1", slots=4), Target("mpi2", slots=2),
        Target("mpich1", slots=8), Target("ssh22", port=22), Target("10.0.0.5"),
    ]
    assert Target("node2", port=2222).label == "node2:2222"


@pytest.mark.parametrize("text, words", [
    ("", "names no host"),
    ("# only comments\n\n", "names no host"),
    ("node1\nnode2 slots=x\n", ":2: slots='x' is not a positive whole number"),
    ("node1 gpus=4\n", ":1: unknown setting 'gpus'"),
    ("node1 extra\n", ":1: unexpected 'extra'"),
    ("node1:99999\n", ":1: port '99999'"),
    ("node1:abc\n", ":1: 'node1:abc'"),
    ("bad;host\n", ":1: 'bad;host' is not a valid host name"),
    ("a b=1 slots=0\n", "unknown setting 'b'"),
])
def test_bad_hostfiles_name_file_and_line(tmp_path: Path, text: str, words: str) -> None:
    p = _file(tmp_path, text)
    with pytest.raises(UsageError) as e:
        parse_hostfile(p)
    assert words in e.value.message
    assert str(p) in e.value.message


def test_resolve_hosts_file_or_expression(tmp_path: Path) -> None:
    p = _file(tmp_path, "a\nb:2222\na\n")
    spec = resolve_targets(hosts=str(p))
    assert spec.kind == "ssh" and spec.labels == ["a", "b:2222"]  # repeats dropped
    spec = resolve_targets(hosts="node[01-02],root@gpu-a,127.0.0.1:2223")
    assert spec.targets == [Target("node01"), Target("node02"), Target("gpu-a", user="root"),
                            Target("127.0.0.1", port=2223)]
    assert resolve_targets().kind == "local"


@pytest.mark.parametrize("args, words", [
    (["--hosts", "{tmp}/missing"], "does not exist"),
    (["--hosts", "{tmp}"], "is a directory, not a file"),
    (["--hosts", "{tmp}/empty"], "names no host"),
    (["--hosts", "{tmp}/malformed"], "malformed:1: unknown setting"),
    (["--hosts", "node[01-"], "bad hostlist 'node[01-' at character 5: '[' is never closed"),
    (["--hosts", "node[3-1]"], "goes backwards"),
    (["--hosts", "a", "--slurm-job", "1"], "--hosts and --slurm-job cannot be combined"),
    (["--slurm-job", "12x"], "'12x' is not a Slurm job id"),
    (["--hosts", "a", "--ssh-config", "{tmp}/nope"], "ssh config"),
    (["--hosts", "a", "-i", "{tmp}/nokey"], "identity file"),
    (["--local", "--node-timeout", "0"], "Invalid value"),
])
def test_bad_input_is_exit_2_with_one_line(tmp_path: Path, capsys, args: list[str], words: str) -> None:
    (tmp_path / "empty").write_text("# nothing\n")
    (tmp_path / "malformed").write_text("node1 color=blue\n")
    argv = ["exec", *[a.format(tmp=tmp_path) for a in args], "--", "true"]
    assert run(argv) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert lines[0].startswith("mldebug: error: ") and words in lines[0], err
    assert len(lines) == 2 and lines[1].startswith("hint: ")


def test_no_command_is_a_usage_error(capsys) -> None:
    assert run(["exec", "--local", "--"]) == 2


def test_scripts_quote_every_argument() -> None:
    assert build_script(["echo", "a;b", "$(x)"]) == "echo 'a;b' '$(x)'"
    assert build_script(["echo", "hi"], "source venv/bin/activate") == "source venv/bin/activate && echo hi"
    probe, cmd = agent_argv(["dump-stacks", "--pattern", "x", "--", "extra"], "/opt/py")
    assert probe == ["/opt/py", "-m", "ml_debug", "--version"]
    assert cmd == ["/opt/py", "-m", "ml_debug", "--json", "dump-stacks", "--pattern", "x", "--local", "--", "extra"]


def test_local_transport_runs_and_times_out(tmp_path: Path) -> None:
    spec = resolve_targets(local=True)
    [r] = run_everywhere(spec, ["sh", "-c", "echo $0; echo e >&2; exit 5", "x y"], timeout_s=20)
    assert (r.exit_code, r.stdout, r.stderr, r.failure) == (5, "x y\n", "e\n", "command failed")
    [r] = run_everywhere(spec, ["sleep", "30"], timeout_s=0.5, out_dir=tmp_path / "o")
    assert r.failure == "timed out" and r.duration_s < 10
    assert (tmp_path / "o" / f"{r.host}.json").exists()


def test_exec_local_prints_prefixed_lines(capsys) -> None:
    import socket

    assert run(["exec", "--", "echo", "hello"]) == 0
    assert capsys.readouterr().out == f"[{socket.gethostname()}] hello\n"
