"""`mldebug health --slurm-check`, parsed without building the Typer command.

Slurm runs the hook every few minutes on every node. Building a command's options through Typer 0.29
imports pydantic (Typer's value adapters): about 0.45 s of a 1 s run, on every node, every time.
This parser reads the same option dataclasses (declared once, in ``health/options.py`` and
``slurmhook/options.py``) and takes only a command line it fully understands: anything else (an
unknown or misspelt option, a value out of range, --help, a target option or its environment
variable) returns None and goes through Typer as before, which then says what is wrong.
"""

from __future__ import annotations

import os
import typing
from typing import Any

from ml_debug.core.options import CliField, cli_fields, from_options, strip_optional

_TRUE = ("1", "true", "yes", "y", "on", "t")
_FALSE = ("", "0", "false", "no", "n", "off", "f")


def _env_flag(name: str) -> bool | None:
    """A global switch from the environment; None when its value is not one Typer reads plainly."""
    value = os.environ.get(name, "").strip().lower()
    if value in _TRUE:
        return True
    return False if value in _FALSE else None


def _scalar(cf: CliField, word: str) -> tuple[bool, Any]:
    """(ok, value) for one option word: numbers converted and range-checked, the rest left to `parse`."""
    tp = strip_optional(cf.type)
    if typing.get_origin(tp) is list:
        tp = typing.get_args(tp)[0] if typing.get_args(tp) else str
    if tp in (int, float):
        try:
            value: Any = tp(word)
        except ValueError:
            return False, None
        if (cf.opt.min is not None and value < cf.opt.min) or (cf.opt.max is not None and value > cf.opt.max):
            return False, None
        return True, value
    return (tp in (str,) or cf.opt.parse is not None), word


def parse(words: list[str], *classes: type) -> list[Any] | None:
    """The option objects for `words`, or None when Typer should parse them."""
    fields = [(cls, cf) for cls in classes for cf in cli_fields(cls)]
    by_flag: dict[str, tuple[CliField, bool | None]] = {}  # flag -> field, switch value (None: takes a word)
    for _, cf in fields:
        if cf.opt.argument:
            return None
        for flag in cf.opt.flags:
            pos, _, neg = flag.partition("/")
            if strip_optional(cf.type) is bool:
                by_flag[pos] = (cf, True)
                if neg:
                    by_flag[neg] = (cf, False)
            else:
                by_flag[pos] = (cf, None)
    values: dict[str, Any] = {}
    i = 0
    while i < len(words):
        word = words[i]
        name, eq, inline = word.partition("=")
        if name not in by_flag:
            return None
        cf, switch = by_flag[name]
        if switch is not None:
            if eq:
                return None
            values[cf.name] = switch
            i += 1
            continue
        if eq:
            text = inline
        elif i + 1 < len(words):
            text = words[i + 1]
            i += 1
        else:
            return None
        ok, value = _scalar(cf, text)
        if not ok:
            return None
        if cf.is_list:
            values.setdefault(cf.name, []).append(value)
        elif cf.name in values:
            return None  # given twice: Typer's rule (the last wins) is not guessed at
        else:
            values[cf.name] = value
        i += 1
    for _, cf in fields:  # environment variables, as Typer reads them
        if cf.name not in values and cf.opt.envvar and os.environ.get(cf.opt.envvar, "") != "":
            if strip_optional(cf.type) is bool or cf.is_list:
                return None
            ok, value = _scalar(cf, os.environ[cf.opt.envvar])
            if not ok:
                return None
            values[cf.name] = value
    return [from_options(cls, {cf.name: values[cf.name] for c, cf in fields if c is cls and cf.name in values})
            for cls in classes]


def slurm_check(argv: list[str]) -> int | None:
    """Run `[--json] [--debug] health --slurm-check ...` at once; None for any other command line."""
    if "health" not in argv:
        return None
    at = argv.index("health")
    before, words = argv[:at], argv[at + 1:]
    if "--slurm-check" not in words or any(w in ("-h", "--help", "--", "--version") for w in argv):
        return None
    if any(w not in ("--json", "--debug") for w in before):
        return None
    json_env, debug_env = _env_flag("MLDEBUG_JSON"), _env_flag("MLDEBUG_DEBUG")
    if json_env is None or debug_env is None:
        return None
    json_ = "--json" in before or json_env
    if "--json" in words:
        words = [w for w in words if w != "--json"]
        json_ = True
    from ml_debug.health.options import HealthOptions
    from ml_debug.remote.options import TargetOptions
    from ml_debug.slurmhook.options import SlurmCheckOptions

    if any(os.environ.get(cf.opt.envvar, "") for cf in cli_fields(TargetOptions) if cf.opt.envvar):
        return None  # a target from the environment: Typer's path says --slurm-check checks this node only
    objects = parse(words, HealthOptions, SlurmCheckOptions)
    if objects is None:
        return None
    from ml_debug.cli.health import health
    from ml_debug.core import output

    output.configure(json=json_, debug="--debug" in before or debug_env)
    opts, slurm = objects
    return health(opts, TargetOptions(), slurm)
