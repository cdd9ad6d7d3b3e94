"""What NicerTrace traces: package, directory and module filters, and how a call site is named.

Standard library only: :mod:`ml_debug.nicertrace` imports it into user programs.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from collections.abc import Iterable
from typing import Any


def real(path: str) -> str:
    return os.path.normcase(os.path.realpath(path))


def python_dirs() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(site-packages dirs, standard-library dirs), real paths, longest first."""
    site_dirs: set[str] = set()
    std_dirs: set[str] = set()
    for paths in (sysconfig.get_paths(),
                  sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_exec_prefix,
                                            "installed_base": sys.base_prefix,
                                            "installed_platbase": sys.base_exec_prefix})):
        site_dirs.update(paths[k] for k in ("purelib", "platlib") if paths.get(k))
        std_dirs.update(paths[k] for k in ("stdlib", "platstdlib") if paths.get(k))
    try:
        import site

        site_dirs.update(site.getsitepackages())
        site_dirs.add(site.getusersitepackages())
    except Exception:  # a stripped-down site module (embedded Pythons) has neither
        pass
    site_dirs.update(p for p in sys.path if os.path.basename(p) in ("site-packages", "dist-packages"))

    def norm(dirs: Iterable[str]) -> tuple[str, ...]:
        return tuple(sorted({real(d) for d in dirs if d}, key=len, reverse=True))

    return norm(site_dirs), norm(std_dirs)


def own_code() -> tuple[frozenset[str], tuple[str, ...]]:
    """Files of the tracer itself: never traced (its dump code must not record itself), nor the
    helpers it calls inside the traced program (the rank lookup, at start and at each fork; mldebug's
    stdout, which the program's prints go through under `mldebug trace`: ml_debug/core/streams.py)."""
    tracing = os.path.dirname(real(__file__))
    package = os.path.dirname(tracing)
    files = frozenset({os.path.join(package, "nicertrace.py"), os.path.join(package, "cli", "trace.py"),
                       os.path.join(package, "core", "rankvars.py"), os.path.join(package, "core", "streams.py")})
    return files, (tracing + os.sep,)


class TraceFilter:
    """Decides, once per code object, whether it is traced and how its call line names it.

    As in ``trace.Trace``, code whose module has no ``__file__`` (namedtuple's generated
    methods, ``python -c``) is not traced; code compiled from a string inside a module
    (``<string>``) is judged by that module's file.
    """

    def __init__(self, packages_to_include: Iterable[str] | None, ignoremods: Iterable[str],
                 ignoredirs: Iterable[str]) -> None:
        self.packages_to_include = tuple(packages_to_include) if packages_to_include is not None else None
        self._ignoremods = tuple(ignoremods)
        self._ignoredirs = tuple(real(d) + os.sep for d in ignoredirs)
        self._site_dirs, self._std_dirs = python_dirs()
        self._own_files, self._own_dirs = own_code()

    def where(self, code: Any, globals_: dict[str, Any] | None) -> str | None:
        """How a call line names the code's location, or None when it is not traced.

        Installed and standard-library code: its dotted module name (``json.encoder``). Your own
        code (a script, a checkout, ``pip install -e``): its file as Python compiled it (the full
        path for anything imported from ``sys.path``), so two checkouts with the same module names
        stay apart and the file can be opened as written.
        """
        filename = code.co_filename or ""
        module = globals_.get("__name__") if globals_ is not None else None
        if module == "__main__" and globals_ is not None:
            # `python -m pkg.mod` / `mldebug trace -m pkg.mod`: the spec keeps the real name.
            module = getattr(globals_.get("__spec__"), "name", None) or module
        gfile = globals_.get("__file__") if globals_ is not None else None
        if not (isinstance(gfile, str) and gfile):
            return None
        real_file = bool(filename) and not filename.startswith("<")
        kind = self.kind(filename if real_file else gfile, module)
        if kind is None:
            return None
        if kind == "user" and real_file:
            return filename
        return filename if module in (None, "__main__") else module

    def kind(self, filename: str, module: str | None) -> str | None:
        """``"user"``, ``"site"`` or ``"stdlib"`` for traced code; None when it is excluded."""
        path = real(filename)
        if path in self._own_files or path.startswith(self._own_dirs):
            return None
        kind, top = "user", (module or "").split(".")[0]
        for kind_name, roots in (("site", self._site_dirs), ("stdlib", self._std_dirs)):
            root = next((r for r in roots if path.startswith(r + os.sep)), None)
            if root is not None:
                kind, top = kind_name, path[len(root) + 1:].split(os.sep)[0].split(".")[0]
                break
        if path.startswith(self._ignoredirs):
            return None
        if self.packages_to_include is not None and kind != "user" and top not in self.packages_to_include:
            return None
        if self._ignoremods:
            names = {os.path.splitext(os.path.basename(filename))[0]}
            if module:
                names.add(module)
            for mod in self._ignoremods:
                if any(n == mod or n.startswith(mod + ".") for n in names):
                    return None
        return kind
