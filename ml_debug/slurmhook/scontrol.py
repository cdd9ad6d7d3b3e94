"""Read and change a node's state through ``scontrol`` (argument lists, never a shell).

Shell equivalents::

    scontrol show node NAME
    scontrol update nodename=NAME state=drain reason="mldebug: gpu3 row_remap pending"
    scontrol update nodename=NAME state=resume
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass

from ml_debug.core.errors import EnvironmentProblem, UsageError

TIMEOUT_S = 20.0
NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_DENIED = ("access/permission denied", "invalid user id", "permission denied", "not authorized")


@dataclass
class NodeState:
    name: str
    state: str              # "IDLE+DRAIN", "MIXED", "DOWN*+DRAIN"
    reason: str | None      # the drain reason without Slurm's "[user@time]" suffix
    reason_user: str | None

    @property
    def flags(self) -> set[str]:
        return set(self.state.rstrip("*").replace("*", "").split("+"))

    @property
    def drained(self) -> bool:
        """Drained or draining: no new job lands here."""
        return "DRAIN" in self.flags or self.state.upper().startswith("DRAIN")


def scontrol_path() -> str:
    path = shutil.which("scontrol")
    if path is None:
        raise EnvironmentProblem("scontrol not found on PATH: the health hook drains and resumes nodes through it",
                                 "run it where Slurm's client commands are installed (slurmd's nodes have "
                                 "them), or add their directory to PATH; --dry-run works without acting")
    return path


def check_node_name(name: str) -> str:
    if not NODE_NAME.match(name):
        raise UsageError(f"not a Slurm node name: {name!r}",
                         "give the node as Slurm knows it (`sinfo -N`), e.g. --node node17")
    return name


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL,
                              env={**os.environ, "LC_ALL": "C"})
    except subprocess.TimeoutExpired:
        raise EnvironmentProblem(f"`{' '.join(argv[:3])} ...` did not answer within {TIMEOUT_S:.0f} s",
                                 "is slurmctld up? `scontrol ping`") from None
    except OSError as e:
        raise EnvironmentProblem(f"cannot run {argv[0]}: {e.strerror}", "check Slurm's client install") from None


_REASON = re.compile(r"^\s*Reason=(.*?)(?: \[([^\]@]*)@[^\]]*\])?\s*$")


def parse_show_node(name: str, text: str) -> NodeState:
    """``scontrol show node NAME`` -> its state and drain reason (Reason= is a line of its own)."""
    state = ""
    reason = user = None
    for line in text.splitlines():
        m = _REASON.match(line)
        if m:
            reason, user = m.group(1), m.group(2)
            continue
        for word in line.split():
            if word.startswith("State="):
                state = word[len("State="):]
    return NodeState(name, state, reason, user)


def show_node(name: str) -> NodeState:
    proc = _run([scontrol_path(), "show", "node", check_node_name(name)])
    if proc.returncode != 0:
        err = (proc.stderr or proc.stdout).strip().splitlines()
        text = err[0] if err else f"exit {proc.returncode}"
        if "not found" in text.lower():
            raise UsageError(f"Slurm knows no node {name!r} ({text})",
                             "give the node as `sinfo -N` names it with --node (the default is SLURMD_NODENAME, "
                             "else this host's short name)")
        raise EnvironmentProblem(f"scontrol show node {name}: {text}", "is slurmctld up? `scontrol ping`")
    return parse_show_node(name, proc.stdout)


def update(name: str, *words: str) -> None:
    """``scontrol update nodename=NAME WORDS...``; refused permission is exit 3 with what to do."""
    proc = _run([scontrol_path(), "update", f"nodename={check_node_name(name)}", *words])
    if proc.returncode == 0:
        return
    text = " ".join((proc.stderr or proc.stdout).split()) or f"exit {proc.returncode}"
    if any(d in text.lower() for d in _DENIED):
        raise EnvironmentProblem(f"this user may not update Slurm nodes ({text})",
                                 "run the hook as root or SlurmUser (slurmd runs HealthCheckProgram, Prolog and "
                                 "Epilog as root), or use --dry-run")
    raise EnvironmentProblem(f"scontrol update nodename={name} {' '.join(words)}: {text}",
                             "is slurmctld up? `scontrol ping`")


def drain(name: str, reason: str) -> None:
    update(name, "state=drain", f"reason={reason}")


def resume(name: str) -> None:
    update(name, "state=resume")
