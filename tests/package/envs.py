"""Real environments that lack one optional part, made cheaply from the test venv.

A missing module is made the way pip makes one: a fresh venv (``python -m venv --without-pip``) whose
site-packages holds a link to every entry of the test venv's site-packages except the files that pip
lists for the distributions left out (``importlib.metadata``'s RECORD, exactly what ``pip uninstall``
removes, console scripts in bin/ included). Nothing is patched: Python in that venv cannot find the
module, its metadata says it is not installed, and a binary it shipped is not in bin/. Building one
takes ~0.1 s (links only), against ~20 s for ``pip install`` of the rest.

A missing program (gdb) is a PATH whose directories hold everything of the real ones but that
program: the system's bin directories are mirrored with links, less the names left out.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

SITE = Path(sysconfig.get_paths()["purelib"])
BIN = Path(sys.executable).parent
SYSTEM_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")


@dataclass(frozen=True)
class ScratchEnv:
    root: Path
    python: Path
    path: str  # PATH for commands run in it: its own bin/, then the system's (mirrored when programs are left out)

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a command run here: this venv's PATH, nothing of the test venv."""
        base = {k: v for k, v in os.environ.items()
                if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME") and not k.startswith("MLDEBUG_")}
        return {**base, "PATH": self.path, "VIRTUAL_ENV": str(self.root), "MLDEBUG_WIDTH": "200", **extra}

    def mldebug(self, *args: str, cwd: Path | None = None, timeout: float = 240,
                **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.python), "-m", "ml_debug", *args], capture_output=True, text=True,
                              timeout=timeout, cwd=cwd, env=self.env(**extra), stdin=subprocess.DEVNULL)


def _dist_entries(names: Iterable[str]) -> tuple[set[str], set[str]]:
    """The top-level site-packages entries and bin/ names that pip installed for these distributions."""
    site_entries: set[str] = set()
    bin_names: set[str] = set()
    for name in names:
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        for f in dist.files or ():
            full = Path(os.path.normpath(SITE / f))
            if full.parent == BIN.resolve() or full.parent == BIN:
                bin_names.add(full.name)
            elif full.is_relative_to(SITE):
                site_entries.add(full.relative_to(SITE).parts[0])
    return site_entries, bin_names


def _mirror(src: Path, dst: Path, leave_out: set[str]) -> None:
    dst.mkdir(parents=True, exist_ok=True)
    for entry in src.iterdir():
        if entry.name not in leave_out and not (dst / entry.name).exists():
            (dst / entry.name).symlink_to(entry)


def scratch_env(root: Path, without: Iterable[str] = (), without_programs: Iterable[str] = ()) -> ScratchEnv:
    """A venv at ``root`` with everything of the test venv but the distributions ``without`` (pip names),
    and a PATH without the programs ``without_programs``."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=60)
    left_site, left_bin = _dist_entries(without)
    site = Path(sysconfig.get_paths(vars={"base": str(root), "platbase": str(root)})["purelib"])
    _mirror(SITE, site, left_site | {"__pycache__"})
    # a program of its own (py-spy) is linked; a console script is written anew with this venv's Python on
    # its first line, as pip writes it (the test venv's Python would bring the left-out modules back)
    for entry in BIN.iterdir():
        target = root / "bin" / entry.name
        if entry.name in left_bin or target.exists() or not entry.is_file():
            continue
        data = entry.read_bytes()
        if data.startswith(b"#!"):
            target.write_bytes(b"#!" + bytes(root / "bin" / "python") + b"\n" + data.split(b"\n", 1)[1])
            target.chmod(0o755)
        else:
            target.symlink_to(entry)
    dirs = [str(root / "bin")]
    programs = set(without_programs)
    if programs:
        seen: set[Path] = set()
        for i, d in enumerate(p for p in SYSTEM_PATH if Path(p).is_dir()):
            real = Path(d).resolve()
            if real in seen:
                continue
            seen.add(real)
            mirror = root / "path" / str(i)
            _mirror(real, mirror, programs)
            dirs.append(str(mirror))
    else:
        dirs += list(SYSTEM_PATH)
    return ScratchEnv(root, root / "bin" / "python", os.pathsep.join(dirs))
