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

from ml_debug.core.errors import UsageError


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
    empty: bool = False
    """The value may be the empty word (a program's own arguments: ``mldebug exec -- printf ''``; the first word,
    the program, still may not). Every other
    option refuses one, on the command line or from its environment variable: an empty word is an unset
    shell variable (``--metrics-dir "$DIR"``), never a request for the default."""

    @property
    def name(self) -> str:
        return self.flags[0].split("/")[0] if self.flags else ""

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
    def label(self) -> str:
        """How errors name it: its flag, or an argument's metavar."""
        if self.opt.argument:
            return (self.opt.metavar or self.name.upper()).split()[0].rstrip(".")
        return self.opt.name

    @property
    def is_path(self) -> bool:
        """A path value that the options layer converts itself (Typer's own conversion reads '' as '.')."""
        tp = strip_optional(self.type)
        return self.opt.parse is None and (tp is Path or (typing.get_origin(tp) is list
                                                          and typing.get_args(tp) == (Path,)))

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
    """Build ``cls`` from parsed command-line values (keyed by field name), applying each ``parse``.
    An empty word is refused (UsageError) unless the option says it may be empty (``Opt.empty``)."""
    kwargs: dict[str, Any] = {}
    for cf in cli_fields(cls):
        if cf.name not in values:
            continue
        value = values[cf.name]
        try:
            if cf.is_list:
                if cf.opt.argument and value and value[0] == "":  # a program's arguments may be empty, its name not
                    refuse_empty(dataclasses.replace(cf, opt=dataclasses.replace(cf.opt, empty=False)))
                value = [_value(cf, v) for v in value or []]
            elif value is not None:
                value = _value(cf, value)
        except UsageError as e:
            raise _named(cf, e) from None
        kwargs[cf.name] = value
    return cls(**kwargs)


def _named(cf: CliField, e: UsageError) -> UsageError:
    """A refusal of ``cf``'s value, in one line that names the option (a parse's "no collective given" does not
    say which option it was about); a newline or escape in the word it quotes is shown, not printed."""
    from ml_debug.core.visible import visible

    message = e.message if cf.label in e.message or any(f in e.message for f in cf.opt.flags) \
        else f"{cf.label}: {e.message}"
    return UsageError(visible(message), e.hint and visible(e.hint))


PARSED_LARGEST = 2**63 - 1
"""The largest number an option's own parse may give (sizes in bytes go beyond the 1e9 of Typer's numbers)."""


def _value(cf: CliField, word: Any) -> Any:
    """One command-line word -> the field's value (or one item of its list)."""
    if word == "" and not cf.opt.empty:
        refuse_empty(cf)
    if cf.opt.parse is not None:
        value = cf.opt.parse(word)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) > PARSED_LARGEST:
            # a size or count the option's own parse took (1e30 bytes): no C call takes it
            raise UsageError(f"{cf.label} {word}: {value:g} is more than a 64-bit number", "give a real size or count")
        return value
    if cf.is_path and isinstance(word, str):
        return _path(cf, word)
    return word


def refuse_empty(cf: CliField, envvar: str | None = None) -> None:
    """An empty word for ``cf`` (from ``envvar`` when given): its own parse names it when it can (with its
    own hint), otherwise one message for all: it is never read as the default."""
    from ml_debug.core.errors import UsageError

    if cf.opt.parse is not None and envvar is None:
        cf.opt.parse("")  # raises the option's own "is empty" (a better hint) where it has one
    if envvar is not None:
        raise UsageError(f"{envvar} is set but empty (it would stand for {cf.label})",
                         f"unset {envvar} to use the default, or give it a value")
    if cf.opt.argument:
        raise UsageError(f"an empty {cf.label} argument was given", f"give each {cf.label} a value "
                         "(an unset shell variable?)")
    raise UsageError(f"{cf.label} is empty", f"give {cf.opt.metavar or 'it a value'} (an unset shell variable?), "
                     f"or leave {cf.label} out for its default")


def refuse_empty_envvars(classes: list[type], environ: Any = None) -> None:
    """Refuse an ``MLDEBUG_*`` variable of these options that is set but empty: Typer reads one as not set,
    so ``MLDEBUG_HOSTS= mldebug exec ...`` would silently run on this node."""
    env = os.environ if environ is None else environ
    for cls in classes:
        for cf in cli_fields(cls):
            if cf.opt.envvar and env.get(cf.opt.envvar) == "" and not cf.opt.empty:
                refuse_empty(cf, cf.opt.envvar)


def _path(cf: CliField, word: str) -> Path:
    """What Typer's path type checked: a path that exists must be of the kind the option takes."""
    from ml_debug.core.errors import UsageError

    path = Path(word)
    if not cf.opt.dir_okay and path.is_dir():
        raise UsageError(f"{cf.label} {word} is a directory", "name a file")
    if not cf.opt.file_okay and path.exists() and not path.is_dir():
        raise UsageError(f"{cf.label} {word} is not a directory", "name a directory (made when missing)")
    return path


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
