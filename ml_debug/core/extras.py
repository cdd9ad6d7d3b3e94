"""The optional parts of an install, what each is for, and the one error that says one is missing.

`pip install mldebug` gives every command that does not need PyTorch (health level 1 and the Slurm
hook, history, dump-stacks, core-bt, top, watch, logs, exec, env, trace); gpu-test, allreduce-bench,
train, drill and health's stress levels need the ``torch`` extra (torch and numpy). A part that is
missing is an environment problem (exit 3) that names the part and the command that installs it,
never an internal error: commands call :func:`require` before they need a part, and the CLI's error
handler turns an ImportError of a part that slipped past into the same error
(:func:`missing_from_import_error`).

The parts are data (``PARTS``): a new optional module or program is one entry.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from dataclasses import dataclass

from ml_debug.core.errors import EnvironmentProblem

TORCH_EXTRA = "mldebug[torch]"


@dataclass(frozen=True)
class Part:
    """One optional module or program: its name as the user sees it, how to install it, what it is for."""

    name: str
    kind: str  # "python module" (importable beside mldebug) or "program" (on PATH or beside sys.executable)
    install: str  # the command that installs it
    used_for: str  # said after "<command> needs it", where the command alone does not say why
    module: str | None = None  # the import name, where it differs from ``name``


PARTS: dict[str, Part] = {p.name: p for p in (
    Part("torch", "python module", f"pip install '{TORCH_EXTRA}'", ""),
    Part("numpy", "python module", f"pip install '{TORCH_EXTRA}' (keeps your torch)",
         "beside torch: torch's object collectives (all_gather_object) use it"),
    Part("torchao", "python module", "pip install 'mldebug[train]'", "for torchao's float8 training"),
    Part("matplotlib", "python module", "pip install 'mldebug[plot]'", "to draw the plot"),
    Part("pystack", "program", "pip install 'mldebug[stacks]'", ""),
    Part("debugpy", "python module", "pip install 'mldebug[debug]'", "to start a debug server in the process"),
    Part("prometheus_client", "python module", "pip install 'prometheus_client>=0.20' (a dependency of mldebug)",
         "for the /metrics HTTP server"),
    Part("py-spy", "program", "pip install py-spy (a dependency of mldebug, into the environment that runs it)",
         "to read the Python stacks"),
    Part("gdb", "program", "apt-get install gdb (Debian/Ubuntu) or dnf install gdb (RHEL)", ""),
)}


class MissingPart(EnvironmentProblem):
    """An optional part that this command needs is not installed here (exit 3)."""

    def __init__(self, part: Part, needed_by: str, instead: str | None = None) -> None:
        hint = part.install + (f"; or {instead}" if instead else "")
        super().__init__(f"missing {part.name}: {needed_by} needs it" + (f" {part.used_for}" if part.used_for else ""),
                         hint)
        self.part = part
        self.details = {"missing": {"name": part.name, "kind": part.kind, "install": part.install,
                                    "needed_by": needed_by}}


def have_module(name: str) -> bool:
    """Importable here, without importing it (``find_spec`` raises for a broken parent package)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def find_program(name: str) -> str | None:
    """A program on PATH, else next to sys.executable (pip puts py-spy into the venv's bin/, which is not on
    PATH when mldebug runs as .venv/bin/mldebug)."""
    found = shutil.which(name)
    if found:
        return found
    here = os.path.join(os.path.dirname(sys.executable), name)
    if os.path.isfile(here) and os.access(here, os.X_OK):
        return here
    return None


def find_lldb() -> str | None:
    """An lldb with its Python module (debugpy's lldb route scripts it): the newest ``lldb-NN`` on PATH (Debian's
    and Ubuntu's names; their plain ``lldb`` 14 lacks its module), else ``lldb``."""
    versions = []
    for d in os.environ.get("PATH", "").split(os.pathsep):
        try:
            names = os.listdir(d or ".")
        except OSError:
            continue
        versions += [(int(n[5:]), os.path.join(d, n)) for n in names if n.startswith("lldb-") and n[5:].isdigit()]
    return max(versions)[1] if versions else shutil.which("lldb")


def is_present(part: Part) -> bool:
    if part.kind == "program":
        return find_program(part.name) is not None
    return have_module(part.module or part.name)


def require(name: str, needed_by: str, instead: str | None = None) -> None:
    """Raise :class:`MissingPart` (exit 3, the part and its install command named) when ``name`` is not here."""
    part = PARTS[name]
    if not is_present(part):
        raise MissingPart(part, needed_by, instead)


def require_torch(what: str) -> None:
    """The ``torch`` extra, both halves: torch, and numpy beside it (without numpy torch imports, warns, and
    fails at the first object collective)."""
    require("torch", what, instead="install the torch build you train with")
    require("numpy", what)


def missing_parts() -> list[Part]:
    """The optional parts that are not installed here, in catalogue order."""
    return [p for p in PARTS.values() if not is_present(p)]


def missing_from_import_error(e: ImportError, command: str | None) -> MissingPart | None:
    """The MissingPart for an ImportError of a catalogued module that no :func:`require` caught first."""
    top = (getattr(e, "name", None) or "").split(".")[0]
    for part in PARTS.values():
        if part.kind == "python module" and (part.module or part.name) == top:
            return MissingPart(part, f"mldebug {command}" if command else "mldebug")
    return None
