"""One word, one meaning: every flag of every command against the registry (ml_debug/cli/flag_names.py),
the earlier names of renamed flags (still accepted, one deprecation line, not in --help), and the
commands grouped by question in `mldebug --help`."""

from __future__ import annotations

import enum
import json
import pathlib
import re
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from ml_debug.cli import params
from ml_debug.cli.app import COMMANDS, GROUPS, build_app, run
from ml_debug.cli.flag_names import FLAGS, SHORT_BORROWED, SHORT_FLAGS, UNIT_METAVARS
from ml_debug.core.options import CliField, cli_fields, strip_optional
from tests.conftest import REPO


@pytest.fixture(scope="module")
def app() -> typer.Typer:
    return build_app(None)  # every command registered (params.CONFIGS, params.CONFIGURE filled)


def _kind(cf: CliField) -> str:
    """The registry's word for a field's type: the type without None and without a repeatable's list."""
    tp = strip_optional(cf.type)
    if typing.get_origin(tp) is list:
        tp = typing.get_args(tp)[0]
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return "choice"
    if tp is pathlib.Path:
        return "path"
    if typing.get_origin(tp) is tuple:
        return "tuple"
    return getattr(tp, "__name__", str(tp))


def _uses(app: typer.Typer) -> list[tuple[str, CliField]]:
    """(command, field) for every flag a person can type: hidden internal flags and arguments left out."""
    return [(command, cf) for command, configs in params.CONFIGS.items() for cls in configs.values()
            for cf in cli_fields(cls) if not cf.opt.argument and not cf.opt.hidden]


def test_every_command_and_its_options_are_walked(app: typer.Typer) -> None:
    assert sorted(params.CONFIGS) == sorted(COMMANDS)


def test_every_flag_has_the_registrys_type_unit_metavar_and_meaning(app: typer.Typer) -> None:
    """A flag missing from the registry, or one whose type, metavar (which carries the unit) or help (the
    registry's words) differs in some command: each named with its command, all at once."""
    wrong: list[str] = []
    for command, cf in _uses(app):
        name = cf.opt.name
        entry = FLAGS.get(name)
        if entry is None:
            wrong.append(f"{command} {name}: not in ml_debug/cli/flag_names.py")
            continue
        if command not in entry.exceptions:
            if _kind(cf) != entry.type:
                wrong.append(f"{command} {name}: type {_kind(cf)}, the registry says {entry.type}")
            if cf.opt.metavar != entry.metavar:
                wrong.append(f"{command} {name}: metavar {cf.opt.metavar}, the registry says {entry.metavar}")
        missing = [w for w in entry.words if w.lower() not in cf.opt.help.lower()]
        if missing:
            wrong.append(f"{command} {name}: its help does not say {missing} ({entry.meaning})")
        if _kind(cf) == "float" and re.search(r"\bseconds?\b", cf.opt.help, re.I) and entry.unit != "s" \
                and command not in entry.exceptions:
            wrong.append(f"{command} {name}: its help counts seconds, the registry's unit is {entry.unit!r}")
    assert not wrong, "\n".join(wrong)


def test_every_one_letter_flag_stands_for_one_long_flag(app: typer.Typer) -> None:
    """`-g` was top's GPU rows and exec's --group, `-i` --identity and trace's --include: a letter means
    one flag in every command, except in the commands that keep another tool's letters (named, with why)."""
    wrong = [f"{command} {letter}: {cf.opt.name}, the registry says {SHORT_FLAGS.get(letter)}"
             for command, cf in _uses(app) if command not in SHORT_BORROWED
             for letter in cf.opt.flags if re.fullmatch(r"-\w", letter) and SHORT_FLAGS.get(letter) != cf.opt.name]
    assert not wrong, "\n".join(wrong)
    assert set(SHORT_BORROWED) <= set(params.CONFIGS)


def test_the_registry_holds_only_flags_in_use_and_each_unit_has_its_metavar(app: typer.Typer) -> None:
    used = {cf.opt.name for _, cf in _uses(app)}
    assert not set(FLAGS) - used, f"registry entries no command has: {sorted(set(FLAGS) - used)}"
    for name, entry in FLAGS.items():
        assert entry.meaning and "\n" not in entry.meaning, name
        if entry.unit in UNIT_METAVARS:
            assert entry.metavar == UNIT_METAVARS[entry.unit], (name, entry)
        if entry.metavar in UNIT_METAVARS.values():
            assert entry.unit == next(u for u, m in UNIT_METAVARS.items() if m == entry.metavar), (name, entry)


def test_no_flag_name_is_a_bare_timeout_or_a_count_without_its_thing(app: typer.Typer) -> None:
    """The conflicts the registry ended: `--timeout` (8 scopes), `--jobs`, `--gpu` and top's `--gpus`
    switch have no current meaning anywhere; each lives on only as an earlier name."""
    names = {cf.opt.name for _, cf in _uses(app)}
    assert not names & {"--timeout", "--jobs", "--gpu"}, names & {"--timeout", "--jobs", "--gpu"}
    kinds = {_kind(cf) for _, cf in _uses(app) if cf.opt.name == "--gpus"}
    assert kinds == {"int"}, kinds
    dirs = {command for command, cf in _uses(app) if cf.opt.name == "--bundle-dir"}
    assert dirs == {"watch", "drill"}, dirs


# ---- earlier names ------------------------------------------------------------------------------------

def _renamed(app: typer.Typer) -> list[tuple[str, CliField, str]]:
    return [(command, cf, old) for command, configs in params.CONFIGS.items() for cls in configs.values()
            for cf in cli_fields(cls) for old in cf.opt.renamed_from]


def _word(cf: CliField, tmp: Path) -> list[str]:
    """A value the option takes (none for a switch)."""
    kind = _kind(cf)
    if kind == "bool":
        return []
    if kind == "path":
        return [str(tmp / "dir")]
    if kind == "choice":
        return [next(str(m.value) for m in strip_optional(cf.type) if m != cf.default)]
    if kind in ("int", "float"):
        low = cf.opt.min if cf.opt.min is not None else 0
        return [str(int(max(low, 7) + 1))]
    return ["H100"]


def test_every_earlier_name_sets_the_same_field_with_one_line_and_is_not_in_help(
        app: typer.Typer, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Each renamed flag: parsed by the command's own Typer parser under its earlier name, it gives the
    field the value the new name gives, with exactly one deprecation line on stderr; the new name prints
    none; `--help` shows the new name and not the earlier one."""
    group = typer.main.get_command(app)
    renamed = _renamed(app)
    assert len(renamed) >= 18, renamed
    for command, cf, old in renamed:
        cmd = group.commands[command]  # type: ignore[attr-defined]
        objects: dict[str, dict[str, Any]] = {}
        for flag in (old.split("/")[0], cf.opt.name):
            ctx = cmd.make_context(command, [flag, *_word(cf, tmp_path), *(["--", "true"] if command == "exec" else [])])
            configured = params.CONFIGURE[command](dict(ctx.params))
            objects[flag] = {g: getattr(o, cf.name) for g, o in configured.items() if hasattr(o, cf.name)}
            err = capsys.readouterr().err
            said = [line for line in err.splitlines() if "deprecated" in line]
            if flag == cf.opt.name:
                assert said == [], (command, flag, err)
            else:
                assert said == [f"mldebug {command}: warning: {flag} is deprecated, use {cf.opt.name} (same meaning); "
                                f"{flag} will be removed"], (command, flag, err)
        first, second = objects.values()
        assert first == second and first, (command, old, objects)
        default = cf.default
        assert list(first.values())[0] != default, (command, old, "the value given was the default: not a test")
        helptext = cmd.get_help(cmd.make_context(command, [], resilient_parsing=True))
        assert re.search(rf"(?<![\w-]){re.escape(cf.opt.name)}\b", helptext), (command, cf.opt.name)
        assert not re.search(rf"(?<![\w-]){re.escape(old.split('/')[0])}(?![\w-])", helptext), (command, old)


def test_an_earlier_name_runs_the_command_end_to_end(capsys: pytest.CaptureFixture[str]) -> None:
    """`mldebug tflops --gpu H100 --dtype fp8` as an old script types it: the same answer as the new
    names, one line per earlier name on stderr, the JSON document on stdout untouched."""
    words = ["--params", "7B", "--seq-len", "2048", "--global-batch", "8", "--iter-time", "1"]
    assert run(["tflops", "--json", *words, "--gpu", "H100", "--dtype", "fp8"]) == 0
    old_out, old_err = capsys.readouterr()
    assert run(["tflops", "--json", *words, "--gpu-model", "H100", "--peak-dtype", "fp8"]) == 0
    new_out, new_err = capsys.readouterr()
    old, new = json.loads(old_out)["result"], json.loads(new_out)["result"]
    assert old == new and "H100" in json.dumps(new), (old, new)
    assert new_err == ""
    assert old_err.splitlines() == [
        "mldebug tflops: warning: --gpu is deprecated, use --gpu-model (same meaning); --gpu will be removed",
        "mldebug tflops: warning: --dtype is deprecated, use --peak-dtype (same meaning); --dtype will be removed",
    ], old_err


# ---- commands grouped by question ---------------------------------------------------------------------

def test_help_lists_every_command_once_under_its_question_plain_and_rich(app: typer.Typer) -> None:
    grouped = [name for names in GROUPS.values() for name in names]
    assert sorted(grouped) == sorted(COMMANDS) and len(grouped) == len(set(grouped)), grouped
    group = typer.main.get_command(app)
    for question, names in GROUPS.items():  # rich help: each command's panel
        for name in names:
            assert group.commands[name].rich_help_panel == question, name  # type: ignore[attr-defined]
    text = subprocess.run([sys.executable, "-m", "ml_debug", "--help"], capture_output=True, text=True,
                          timeout=60, cwd=REPO, check=True).stdout
    lines = text.splitlines()
    for question, names in GROUPS.items():  # plain help: the question, then its commands, in order
        at = lines.index(question)
        listed = [line.split()[0] for line in lines[at + 1:at + 1 + len(names)]]
        assert listed == list(names), (question, listed)
    assert "Commands" not in text, text
    rich_app = build_app(None)
    rich_app.rich_markup_mode = "rich"  # what Typer's rich help makes of the same panels
    shown = CliRunner().invoke(rich_app, ["--help"], terminal_width=100).output
    boxes = [line for line in shown.splitlines() if line.startswith("╭─ ")]
    assert [b.split(" ─")[0][3:] for b in boxes] == ["Options", *GROUPS], boxes
