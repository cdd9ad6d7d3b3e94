"""Option values every command checks at parse time, before any rank starts: finite numbers, usable paths,
and help that says what the command really does."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from ml_debug.cli.app import run
from tests.conftest import require


def _usage_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run in-process; assert the one-line error, its hint, exit 2 and an empty stdout; the error line."""
    assert run(list(argv)) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("mldebug: error: ") and lines[1].startswith("hint: "), err
    assert out == ""
    return lines[0]


@pytest.mark.parametrize("argv", [
    ["gpu-test", "--stage-timeout", "inf"],
    ["allreduce-bench", "--collective-timeout", "inf", "-b", "1K", "-e", "2K"],
    ["allreduce-bench", "--expect-busbw", "inf"],
    ["check", "--step-timeout", "inf"],
    ["train", "--lr", "inf"],
    ["train", "--grad-clip", "Infinity"],
    ["watch", "--stall", "inf"],
    ["health", "--memtest-fraction", "nan"],  # no minimum, so no range caught nan either
])
def test_every_float_option_wants_a_finite_number(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    line = _usage_error(capsys, *argv)
    assert f"Invalid value for '{argv[1]}'" in line and "is not a finite number" in line


def test_a_number_too_large_for_a_clock_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """gpu-test --stage-timeout 1e12 died of OverflowError in the launcher's wait."""
    assert "1e+12 is more than 1e+09" in _usage_error(capsys, "gpu-test", "--stage-timeout", "1e12")


def test_minus_inf_is_refused_too(capsys: pytest.CaptureFixture[str]) -> None:
    assert "'--lr'" in _usage_error(capsys, "train", "--lr", "-inf")
    assert "'--attach-timeout'" in _usage_error(capsys, "dump-stacks", "--attach-timeout", "-inf")


def test_an_infinite_straggler_factor_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert "finite factor" in _usage_error(capsys, "train", "--inject", "straggler@step=1,rank=0,factor=inf")


def test_train_paths_are_checked_before_training(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "missing.pt"
    assert f"--init-from {missing} does not exist" in _usage_error(capsys, "train", "--init-from", str(missing))
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    # walked by safefs (no link of another user followed), which names the component in the way
    line = _usage_error(capsys, "train", "--checkpoint-dir", str(blocker / "ckpt"))
    assert f"--checkpoint-dir: {blocker / 'ckpt'}: a-file is a regular file, not a directory" in line
    line = _usage_error(capsys, "train", "--metrics-dir", str(blocker / "m"), "--steps", "1")
    assert line.startswith(f"mldebug: error: --metrics-dir: {blocker / 'm'}: a-file is a regular file, not a directory")


def test_train_checkpoint_dir_must_be_writable() -> None:
    """As root (who may write anywhere) the check runs as nobody, on a directory root owns."""
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        locked = Path(tmp) / "locked"
        locked.mkdir()
        os.chmod(tmp, 0o755)
        if os.geteuid() == 0:
            require(shutil.which("setpriv") is not None, "setpriv (to drop root, who may write anywhere)")
            prefix = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        else:
            locked.chmod(0o500)
            prefix = []
        proc = subprocess.run([*prefix, sys.executable, "-m", "ml_debug", "train", "--checkpoint-dir", str(locked)],
                              capture_output=True, text=True, timeout=60, cwd="/")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(f"mldebug: error: --checkpoint-dir {locked}: not writable"), proc.stderr


def test_train_checkpoint_dir_is_made_up_front(tmp_path: Path) -> None:
    from ml_debug.train.config import TrainConfig

    TrainConfig(checkpoint_dir=tmp_path / "a" / "b").validate()
    assert (tmp_path / "a" / "b").is_dir()


@pytest.mark.parametrize(("command", "default"), [
    ("train", "default: none: one plain process, no ranks"),
    ("gpu-test", "default: one per visible GPU, or 2 CPU ranks"),
    ("allreduce-bench", "default: one per visible GPU, or 2 CPU ranks"),
])
def test_nproc_per_node_help_says_what_each_command_does(command: str, default: str,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert run([command, "--help"]) == 0
    help_text = " ".join(capsys.readouterr().out.split())
    start = help_text.index("--nproc-per-node")
    assert default in help_text[start:start + 200]


@pytest.mark.parametrize(("argv", "said"), [
    (["train", "--metrics-dir", ""], "--metrics-dir is empty"),  # wrote into the current directory
    (["train", "--checkpoint-dir", ""], "--checkpoint-dir is empty"),
    (["train", "--kill-switch", ""], "--kill-switch is empty"),  # refused to start, naming nothing
    (["launch", "--rdzv-backend", "", "--", "x.py"], "--rdzv-backend is empty"),
    (["exec", "--", "", "x"], "an empty CMD argument"),  # the program's arguments may be empty, its name not
])
def test_an_empty_value_is_refused_never_read_as_the_default(argv: list[str], said: str,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert said in _usage_error(capsys, *argv)


def test_an_empty_mldebug_variable_is_refused(capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """`MLDEBUG_HOSTS= mldebug exec ...` ran the command on this node: Typer reads an empty variable as unset."""
    monkeypatch.setenv("MLDEBUG_HOSTS", "")
    assert "MLDEBUG_HOSTS is set but empty" in _usage_error(capsys, "exec", "--", "hostname")


def test_a_program_argument_may_be_empty(tmp_path: Path) -> None:
    """What `Opt.empty` is for: `mldebug exec -- printf '%s|' a '' b` passes the empty word on."""
    proc = subprocess.run([sys.executable, "-m", "ml_debug", "exec", "--", "printf", "%s|", "a", "", "b"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[-1].endswith("a||b|"), proc.stdout


def test_drill_refuses_more_ranks_than_this_node_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """`drill --nproc-per-node 9` on 2 cores started the drill's job, which was refused, and scored the drill
    as missed: refused before anything starts, like every other command that starts ranks here."""
    from ml_debug.dist.limits import node_limit

    monkeypatch.chdir(tmp_path)
    limit, _ = node_limit()
    too_many = str(min(limit + 1, 64))
    if limit + 1 > 64:  # a node this large runs every count the option takes: the user's own limit then
        line = _usage_error(capsys, "drill", "--nproc-per-node", too_many, "--max-nproc-per-node", "63")
    else:
        line = _usage_error(capsys, "drill", "--nproc-per-node", too_many, "--only", "hang")
    assert f"--nproc-per-node {too_many} is more ranks than this node can run" in line
    assert list(tmp_path.iterdir()) == []  # no drill folder made
