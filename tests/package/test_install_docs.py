"""The install commands of README.md and docs/install.md, run exactly as written on a fresh checkout.

The commands are read from the documents at test time (never copied here), and each runs in
``bash -c`` in a new directory holding the checkout's tracked files, with a fresh venv and none of
the test environment's variables: what a new user on a machine of this kind types and sees.

Why a copy of the tracked files and not ``git clone``: a clone takes HEAD, so a README edited but not
yet committed would be tested in its old form; the tracked files as they are in the working tree are
what the next commit holds, and, as in a clone, untracked files are left out (a module that was never
``git add``-ed fails here as it would for a user). On CI, a fresh clone, the two are the same.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import REPO

README = REPO / "README.md"
INSTALL = REPO / "docs" / "install.md"
# Install commands the documents show that these tests do not run, and why. Any other command in a bash
# block of the README's install section or of docs/install.md must be run below, or the inventory fails.
NOT_RUN = {
    "python3 -m venv .venv && . .venv/bin/activate": "the CPU-index block's first line; its second needs the index",
    "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu && pip install -e '.[torch]' && "
    "mldebug check": "PyTorch's CPU index is not reachable from the test machines (only PyPI is)",
    "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu": "the same CPU index",
    "pip install -e '.[torch]'": "the second line of the CPU-index block (the README's command installs the same)",
    "sudo apt-get install -y python3-venv": "changes the machine (python3-venv is there already)",
}


def section(text: str, heading: str) -> str:
    """The text under a markdown heading, to the next heading of the same or a higher level."""
    m = re.search(rf"^(#+) {re.escape(heading)}\s*$", text, re.M)
    assert m, f"no heading {heading!r}"
    level = len(m.group(1))
    end = re.search(rf"^#{{1,{level}}} ", text[m.end():], re.M)
    return text[m.end():m.end() + end.start()] if end else text[m.end():]


def bash_blocks(text: str) -> list[str]:
    """Every ```bash block, an indented one (in a list item) too."""
    return [textwrap.dedent(b).strip() for b in re.findall(r"^[ \t]*```bash\n(.*?)^[ \t]*```", text, re.M | re.S)]


def readme_first_block() -> str:
    return bash_blocks(section(README.read_text(), "Install and first run"))[0]


def install_block(heading: str, index: int = 0) -> str:
    return bash_blocks(section(INSTALL.read_text(), heading))[index]


def clean_copy(dst: Path) -> Path:
    """The checkout's tracked files, as they are in the working tree, at ``dst`` (see the docstring)."""
    names = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    for name in names.decode().split("\0"):
        src = REPO / name
        if name and (src.is_file() or src.is_symlink()):
            (dst / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / name, follow_symlinks=False)
    return dst


def fresh_env(**extra: str) -> dict[str, str]:
    """A login shell's environment on this machine: no venv on PATH, no test or mldebug variables (the
    machine's own pip settings stay: they are what a user here gets). pip skips compiling bytecode
    (``PIP_COMPILE=0``; pip reads ``PIP_NO_COMPILE=1`` as "compile"): Python compiles what it imports anyway,
    and compiling all of torch took 13 of the 20 s of each torch install here."""
    inside = (Path(sys.prefix), Path(os.environ.get("VIRTUAL_ENV") or sys.prefix))
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep)
            if p and not any(Path(p).is_relative_to(v) for v in inside)]
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MLDEBUG_", "PYTHON", "PYTEST", "VIRTUAL_ENV", "OMP_", "COV_"))}
    return {**env, "PATH": os.pathsep.join(path), "PIP_COMPILE": "0", **extra}


def run_shell(command: str, cwd: Path, timeout: float = 540, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", command], cwd=cwd, env=fresh_env(**extra), capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def last_line(text: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def test_every_install_command_is_run_or_says_why_not() -> None:
    shown = [*bash_blocks(section(README.read_text(), "Install and first run")), *bash_blocks(INSTALL.read_text())]
    run = {readme_first_block(), install_block("Without torch (the nodes)"),
           install_block("Without torch (the nodes)", 1), install_block("Extras")}
    lines = {ln.strip() for block in shown if block not in run for ln in block.splitlines() if ln.strip()}
    assert lines - set(NOT_RUN) == set(), "an install command that no test runs: run it below or add it to NOT_RUN"
    assert set(NOT_RUN) <= lines, f"NOT_RUN names commands the documents no longer show: {set(NOT_RUN) - lines}"


@pytest.mark.timeout(600)
def test_the_readme_command_works_verbatim_on_a_fresh_checkout(tmp_path: Path) -> None:
    block = readme_first_block()
    assert block.startswith("python3 -m venv .venv && ") and block.endswith("mldebug check"), block
    proc = run_shell(block, clean_copy(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert last_line(proc.stdout).startswith("OK "), proc.stdout
    assert "internal error" not in proc.stdout + proc.stderr


@pytest.mark.timeout(600)
def test_the_torch_free_install_then_the_torch_extra_then_the_others(tmp_path: Path) -> None:
    """docs/install.md's node install, then each extra as the page adds it, in the same environment."""
    checkout = clean_copy(tmp_path)
    node = run_shell(install_block("Without torch (the nodes)"), checkout)
    assert node.returncode == 0, node.stdout[-3000:] + node.stderr[-3000:]
    assert last_line(node.stdout).startswith("OK 2/2 steps passed"), node.stdout
    assert "skipped gpu-test, allreduce-bench: no torch here; pip install 'mldebug[torch]' adds it" in node.stdout
    refused = run_shell(". .venv/bin/activate && mldebug gpu-test", checkout)
    assert refused.returncode == 3 and "missing torch: " in refused.stderr, refused.stderr

    add_torch = install_block("Without torch (the nodes)", 1)
    assert add_torch == "pip install 'mldebug[torch]'", add_torch
    # "in the same environment": activated, as the page says. The open torch range would take this index's
    # newest torch, a CUDA build with GBs of NVIDIA wheels; the page says to pin it, the constraint pins it
    # (2.13.0 is the CPU build on this machine's disk) without changing the command.
    pin = tmp_path / "pin-torch.txt"
    pin.write_text("torch==2.13.0\n")
    torch = run_shell(f". .venv/bin/activate && {add_torch}", checkout, PIP_CONSTRAINT=str(pin))
    assert torch.returncode == 0, torch.stdout[-3000:] + torch.stderr[-3000:]
    ranks = run_shell(". .venv/bin/activate && mldebug gpu-test --nproc-per-node 1", checkout)  # all_gather_object
    assert ranks.returncode == 0 and "1/1 ranks OK" in ranks.stdout, ranks.stdout + ranks.stderr

    extras = run_shell(f". .venv/bin/activate && {install_block('Extras')}", checkout, PIP_CONSTRAINT=str(pin))
    assert extras.returncode == 0, extras.stdout[-3000:] + extras.stderr[-3000:]
    found = "import importlib.util as u, sys; sys.exit(not all(map(u.find_spec, ('matplotlib', 'torchao', 'debugpy'))))"
    probe = run_shell(f". .venv/bin/activate && python -c \"{found}\" && command -v pystack", checkout)
    assert probe.returncode == 0 and probe.stdout.strip().startswith(str(checkout)), probe.stdout + probe.stderr
