"""Typer commands built from configuration dataclasses (see :mod:`ml_debug.core.options`).

A command is declared as a function that takes its configuration objects::

    command(app, "gpu-test", run_gpu_test, help=HELP, examples=EXAMPLES,
            config=GpuTestOptions, launch=SpawnOptions)

and this module derives the Typer options from the dataclass fields, builds the objects from what
was parsed, adds the options every command has (``--json``), and ends the help with the same
examples + docs epilog everywhere. The function returns an exit code.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import sys
import typing
from collections.abc import Callable, Sequence
from dataclasses import MISSING
from typing import Annotated, Any

import typer

from ml_debug.core.options import (
    CliField,
    cli_fields,
    deprecation_line,
    from_options,
    refuse_empty_envvars,
    strip_optional,
)

DOCS = "docs/commands/{name}.md"
"""Each command's page, relative to the root of the mldebug repository."""

JSON_HELP = ("Print one JSON document (stable, versioned schema) on stdout instead of tables. "
             "Same as the global `mldebug --json`.")


def epilog(name: str, examples: Sequence[str]) -> str:
    """The end of every `--help`: examples kept line by line (\\b stops re-wrapping), then the docs."""
    lines = ["Examples:", "", "\b"] + [f"  {e}" for e in examples] if examples else []
    return "\n".join([*lines, "", f"Docs: {DOCS.format(name=name)} in the mldebug repository."])


def _typer_type(cf: CliField) -> Any:
    """The type Typer parses: the field's own, or str (list[str]) where the field parses its words."""
    if cf.opt.parse is None and not cf.is_path:
        return cf.type
    base: Any = list[str] if cf.is_list else str
    optional = type(None) in typing.get_args(cf.type)
    return (base | None) if optional or cf.is_list else base


CONFIGURE: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {}
"""Each registered command's step from parsed values (Typer's, keyed by parameter name) to its
configuration objects: what the command runs with."""

LARGEST = 1e9
"""The largest number a float option takes (about 31 years in seconds): no timeout, rate or threshold
means more, and a larger timeout overflows the clock in a wait (OverflowError deep in a run)."""


def _finite(value: float | None) -> float | None:
    """Every float option's check: Typer's ranges let inf through (and nan, where there is no minimum),
    and no timeout, rate or threshold means anything infinite: it only fails later, deep in a run."""
    if value is not None and not math.isfinite(value):
        raise typer.BadParameter(f"{value} is not a finite number")
    if value is not None and abs(value) > LARGEST:
        raise typer.BadParameter(f"{value:g} is more than {LARGEST:g}, the most a number option takes")
    return value


def _bounded(value: Any) -> Any:
    """Every integer option's check (each item of a repeatable one): Python's ints have no end, the C calls
    behind a count, a pid or a size do (`--pid 10**30` ended in OverflowError deep in a run)."""
    for v in value if isinstance(value, (list, tuple)) else [value]:
        if v is not None and abs(v) > LARGEST:
            raise typer.BadParameter(f"{v} is more than {LARGEST:g}, the most a number option takes")
    return value


def _parameter(cf: CliField) -> inspect.Parameter:
    o = cf.opt
    if o.metavar is None and cf.is_path:  # parsed as a word (so that an empty one is seen): still a PATH in --help
        o = dataclasses.replace(o, metavar="PATH")
    extra: dict[str, Any] = {}
    if o.min is not None:
        extra["min"] = o.min
    if o.max is not None:
        extra["max"] = o.max
    tp = _typer_type(cf)
    if strip_optional(tp) is float:
        extra["callback"] = _finite
    elif strip_optional(tp) is int or strip_optional(tp) == list[int]:
        extra["callback"] = _bounded
    if o.argument:
        info = typer.Argument(help=o.help, metavar=o.metavar, show_default=False, hidden=o.hidden, **extra)
    else:
        info = typer.Option(*o.flags, help=o.help, metavar=o.metavar, envvar=o.envvar,
                            show_envvar=bool(o.envvar), rich_help_panel=o.panel, hidden=o.hidden, **extra)
    if cf.is_list:  # Typer wants None, not [], for a repeatable option given no times
        default: Any = None
        tp = strip_optional(tp) | None
    elif cf.default is MISSING:
        default = ...
    elif (cf.opt.parse is not None or cf.is_path) and cf.default is not None:
        default = cf.opt.format(cf.default) if cf.opt.format else str(cf.default)  # the word parse reads back
    else:
        default = cf.default
    return inspect.Parameter(cf.name, inspect.Parameter.KEYWORD_ONLY, default=default,
                             annotation=Annotated[tp, info])


CONFIGS: dict[str, dict[str, type]] = {}
"""Each registered command's configuration classes (group name -> class): what the options layer's tests
and the flag registry's walk, so that a new command's options are checked without a list to keep."""


def command(app: typer.Typer, name: str, run: Callable[..., int | None], *, help: str,
            examples: Sequence[str] = (), context_settings: dict[str, Any] | None = None, **configs: type) -> None:
    """Register ``mldebug <name>``: options from the ``configs`` classes; ``run(**objects)`` -> exit code."""
    CONFIGS[name] = dict(configs)
    params = [inspect.Parameter("json_", inspect.Parameter.KEYWORD_ONLY, default=False,
                                annotation=Annotated[bool, typer.Option("--json", help=JSON_HELP)])]
    owner: dict[str, str] = {}
    earlier: dict[str, tuple[str, str, str]] = {}  # hidden parameter -> (field, earlier name, name)
    for group, cls in configs.items():
        for cf in cli_fields(cls):
            if cf.name in owner:
                raise TypeError(f"{name}: option field {cf.name!r} is in both {owner[cf.name]} and {group}")
            owner[cf.name] = group
            params.append(_parameter(cf))
            for i, old in enumerate(cf.opt.renamed_from):
                alias = f"{cf.name}__was{i}"
                earlier[alias] = (cf.name, old.split("/")[0], cf.opt.name)
                params.append(_parameter(dataclasses.replace(
                    cf, name=alias, default=None,
                    opt=dataclasses.replace(cf.opt, flags=(old,), hidden=True, envvar=None, renamed_from=()))))

    def configure(values: dict[str, Any]) -> dict[str, Any]:
        """The configuration objects that the parsed values give (an earlier option name costs one line)."""
        for alias, (field, old, new) in earlier.items():
            value = values.pop(alias, None)
            if value is None or (isinstance(value, (list, tuple)) and not value):  # not given
                continue
            sys.stderr.write(deprecation_line(name, old, new) + "\n")
            values[field] = value
        return {group: from_options(cls, {k: v for k, v in values.items() if owner.get(k) == group})
                for group, cls in configs.items()}

    def handler(**values: Any) -> None:
        from ml_debug.core import output

        if values.pop("json_"):
            output.configure(json=True)
        refuse_empty_envvars(list(configs.values()))
        code = run(**configure(values))
        if code:
            raise typer.Exit(int(code))

    CONFIGURE[name] = configure
    handler.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    handler.__annotations__ = {p.name: p.annotation for p in params}
    handler.__name__ = name.replace("-", "_")
    from ml_debug.cli.app import group_of

    app.command(name, help=help, epilog=epilog(name, examples), no_args_is_help=False,
                context_settings=context_settings, rich_help_panel=group_of(name))(handler)

