"""Command options declared once, as dataclass fields.

A command's configuration is a dataclass whose fields carry an :class:`Opt` in their metadata
(written with :func:`option`). That one declaration gives:

- the command-line option (``ml_debug.cli.params`` turns the fields into Typer options);
- the words that rebuild the same configuration in another process (:func:`to_argv`), which is how
  self-launched ranks and remote nodes receive it: ``mldebug <command> <to_argv(config)>``.

So adding an option to a command is one edit: a field. This module is torch-, typer- and rich-free;
library packages import it to declare their configurations.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import stat
import types
import typing
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field
from pathlib import Path, PurePath
from typing import Any


@dataclass(frozen=True)
class Opt:
    """How a configuration field appears on the command line."""

    flags: tuple[str, ...]
    """Option names, e.g. ("--max-bytes", "-e"); a switch with a negative form: ("--check/--no-check",)."""
    help: str
    metavar: str | None = None
    min: float | None = None
    max: float | None = None
    envvar: str | None = None
    """Also read from this environment variable (the help says so)."""
    panel: str | None = None
    """Help panel that groups the option (e.g. "Targets")."""
    hidden: bool = False
    parse: Callable[[str], Any] | None = None
    """Command-line word -> field value (for each item of a list field)."""
    format: Callable[[Any], str] | None = None
    """Field value -> command-line word; the inverse of ``parse``."""
    forward: bool = True
    """Passed on to self-launched ranks and remote nodes (launch and target options are not)."""
    multiple: bool | None = None
    """Repeatable (one word per item). Default: when the field is a list; False for a list parsed from one word."""
    argument: bool = False
    """A positional argument (``mldebug core-bt CORE...``) rather than an option; it has no flags."""
    file_okay: bool = True
    dir_okay: bool = True
    renamed_from: tuple[str, ...] = ()
    """Earlier names of this option: still accepted, each use with one deprecation line on stderr, and
    left out of --help, so that scripts written for them keep working while people learn the new name."""

    @property
    def name(self) -> str:
        return self.flags[0].split("/")[0]

    @property
    def negative(self) -> str | None:
        _, _, off = self.flags[0].partition("/")
        return off or None


def option(default: Any = MISSING, *, help: str, flags: tuple[str, ...] = (),
           default_factory: Callable[[], Any] | None = None, **kw: Any) -> Any:
    """A dataclass field that is also a command-line option (``flags`` default to ``--field-name``)."""
    meta = {"cli": Opt(flags=tuple(flags), help=help, **kw)}
    if default_factory is not None:
        return field(default_factory=default_factory, metadata=meta)
    return field(default=default, metadata=meta)


def argument(default: Any = MISSING, *, help: str, default_factory: Callable[[], Any] | None = None,
             **kw: Any) -> Any:
    """A dataclass field that is a positional command-line argument."""
    return option(default, help=help, default_factory=default_factory, argument=True, **kw)


@dataclass(frozen=True)
class CliField:
    """One option of a configuration class: its field, its Opt (with the flags filled in) and its type."""

    name: str
    opt: Opt
    type: Any
    default: Any

    @property
    def is_list(self) -> bool:
        """The option is repeatable: each word is one item of the field's list."""
        if self.opt.multiple is not None:
            return self.opt.multiple
        return typing.get_origin(strip_optional(self.type)) is list


def cli_fields(cls: type) -> list[CliField]:
    """The fields of ``cls`` that are command-line options, in declaration order."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        opt = f.metadata.get("cli")
        if opt is None:
            continue
        if not opt.flags and not opt.argument:
            opt = dataclasses.replace(opt, flags=("--" + f.name.rstrip("_").replace("_", "-"),))
        if f.default is not MISSING:
            default = f.default
        elif f.default_factory is not MISSING:
            default = f.default_factory()
        else:
            default = MISSING
        out.append(CliField(f.name, opt, hints[f.name], default))
    return out


def deprecation_line(command: str, old: str, new: str) -> str:
    """The one line on stderr that a use of an option's earlier name costs."""
    return f"mldebug {command}: warning: {old} is deprecated, use {new} (same meaning); {old} will be removed"


def from_options(cls: type, values: dict[str, Any]) -> Any:
    """Build ``cls`` from parsed command-line values (keyed by field name), applying each ``parse``."""
    kwargs: dict[str, Any] = {}
    for cf in cli_fields(cls):
        if cf.name not in values:
            continue
        value = values[cf.name]
        if cf.is_list:
            value = [cf.opt.parse(v) if cf.opt.parse else v for v in value or []]
        elif value is not None and cf.opt.parse is not None:
            value = cf.opt.parse(value)
        kwargs[cf.name] = value
    return cls(**kwargs)


def _word(cf: CliField, value: Any) -> str:
    if cf.opt.format is not None:
        return cf.opt.format(value)
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, PurePath):
        return str(value)
    return str(value)


def to_argv(config: Any, *, forwarded_only: bool = True, changed_only: bool = False) -> list[str]:
    """The command-line words that rebuild ``config`` (every set value, explicitly; with ``changed_only``,
    only the values that differ from the defaults: what a person would type)."""
    argv: list[str] = []
    positional: list[str] = []
    defaults = type(config)() if changed_only else None
    for cf in cli_fields(type(config)):
        if forwarded_only and not cf.opt.forward:
            continue
        value = getattr(config, cf.name)
        if value is None or (defaults is not None and value == getattr(defaults, cf.name)):
            continue
        if cf.opt.argument:
            positional += [_word(cf, v) for v in value] if cf.is_list else [_word(cf, value)]
        elif isinstance(value, bool):
            if value:
                argv.append(cf.opt.name)
            elif cf.opt.negative:
                argv.append(cf.opt.negative)
        elif cf.is_list:
            for item in value:
                argv += [cf.opt.name, _word(cf, item)]
        else:
            argv += [cf.opt.name, _word(cf, value)]
    return argv + (["--", *positional] if positional else [])


def strip_optional(tp: Any) -> Any:
    """``X | None`` -> ``X``; anything else unchanged."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if typing.get_origin(tp) in (typing.Union, types.UnionType) and len(args) == 1:
        return args[0]
    return tp


# ---- path values: checked before any rank starts, since a path that fails after a run loses the run ----

def parse_out_dir(word: str) -> Path:
    """--out-dir: where results are also written as they arrive."""
    return _parse_dir(word, "--out-dir", "results/")


def parse_bundle_dir(word: str) -> Path:
    """--bundle-dir: where the evidence a command gathers (an incident's, a drill's) goes."""
    return _parse_dir(word, "--bundle-dir", "incidents/")


def _parse_dir(word: str, flag: str, example: str) -> Path:
    """A directory to write in; an empty word (an unset shell variable) would write into the current one."""
    from ml_debug.core.errors import UsageError

    if not word.strip():
        raise UsageError(f"{flag} is empty", f"give a directory (made when missing), e.g. {flag} {example}")
    path = Path(word)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return path  # made when the command starts
    except OSError as e:  # a loop of links, a name too long, a part of the path that is a file
        raise UsageError(f"{flag} {word}: {e.strerror}", "name a directory (made when missing)") from None
    if not stat.S_ISDIR(st.st_mode):
        raise UsageError(f"{flag} {word} is not a directory", "name a directory (made when missing)")
    _probe_write(path, word, flag)
    return path


def _probe_write(path: Path, word: str, flag: str) -> None:
    """A directory that exists but takes no new file (/proc/self, a read-only mount): said now, before the
    command runs, rather than as an internal error when its first result is written."""
    import tempfile

    from ml_debug.core.errors import UsageError

    try:
        fd, name = tempfile.mkstemp(prefix=".mldebug-probe-", dir=path)
    except OSError as e:
        raise UsageError(f"{flag} {word}: cannot create a file there ({e.strerror or e})",
                         "name a directory you can write (made when missing)") from None
    os.close(fd)
    os.unlink(name)


def output_file(flag: str, path: str | os.PathLike[str]) -> None:
    """A file the command will write: not a directory; the file writable, or its directory where it is new."""
    from ml_debug.core.errors import UsageError

    target = Path(path)
    try:
        if target.is_dir():
            raise UsageError(f"{flag} {target} is a directory", "name a file inside it")
        if target.exists():
            writable = os.access(target, os.W_OK)
        elif target.parent.is_dir():
            writable = os.access(target.parent, os.W_OK | os.X_OK)
        else:
            raise UsageError(f"{flag} {target}: directory {target.parent} does not exist",
                             "create it first, or choose another path")
    except OSError as e:  # a name too long, a loop of links
        raise UsageError(f"{flag} {target}: {e.strerror}", "choose another path") from None
    if not writable:
        raise UsageError(f"{flag} {target}: not writable by this user", "choose a path you can write")


def output_dir(flag: str, path: str | os.PathLike[str]) -> None:
    """A directory the command will write in: made now (``mkdir -p``) when missing, and writable."""
    from ml_debug.core.errors import UsageError

    target = Path(path)
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"{flag} {target}: cannot create {e.filename or target}: {e.strerror}",
                         "choose a directory you can create or write") from None
    if not os.access(target, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {target}: not writable by this user", "choose a directory you can write")


def input_file(flag: str, path: str | os.PathLike[str]) -> None:
    """A file the command will read: it exists, is a file, and we may read it."""
    from ml_debug.core.errors import UsageError

    target = Path(path)
    if not target.is_file():
        what = "is a directory" if target.is_dir() else "does not exist"
        raise UsageError(f"{flag} {target} {what}", "give the path of an existing file")
    if not os.access(target, os.R_OK):
        raise UsageError(f"{flag} {target}: not readable by this user", "check its permissions")
