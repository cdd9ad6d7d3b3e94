"""The options layer's rules, walked over every option of every command (issue 41, "Values").

Every command registers its options through `ml_debug.cli.params.command`, which records its configuration
classes in `CONFIGS`: this harness finds them there, so a new command or option is fuzzed without a list to
keep. For each option it gives the values a script or a fuzzer gives by mistake (an empty word from an unset
shell variable, control characters, huge and negative numbers, not-a-number) and checks the rules:

- never an internal error, always an exit code of the documented set (0 accepted, 2 refused);
- an empty word (or an empty `MLDEBUG_*` variable) is refused, unless the option says it may be empty;
- a number beyond any real one (1e30) is refused by every number option;
- a refusal is one line plus a hint, and names the option (or the variable) it refuses.

The values are parsed by the real options layer and Typer, with each command's work replaced by a function
that returns 0: a value that is accepted starts nothing. Every refusal is then run again through the real
command, in process, which must refuse it the same way (so before doing anything). All in process: about
10 CPU-seconds for every option of every command.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import MISSING, dataclass

import pytest
import typer

from ml_debug.cli import app as cli_app
from ml_debug.cli.params import CONFIGS, command
from ml_debug.core.options import CliField, cli_fields, strip_optional

DOCUMENTED = {0, 2}
"""What parsing an option may end in: accepted (the stub's 0) or bad usage."""

REAL_BUILD = cli_app.build_app
CONTROL = "a\x1b]0;T\x07b\nc\x9bd"
HUGE = str(10**30)


@dataclass(frozen=True)
class Case:
    command: str
    cf: CliField

    @property
    def id(self) -> str:
        return f"{self.command}:{self.cf.label}"


def _registered() -> dict[str, dict[str, type]]:
    cli_app.build_app()  # every command module registers, and so records its classes
    return dict(CONFIGS)


REGISTERED = _registered()  # once: building every command's options is most of a test's time


def _cases() -> list[Case]:
    out = []
    for name, groups in sorted(REGISTERED.items()):
        for cls in groups.values():
            for cf in cli_fields(cls):
                if strip_optional(cf.type) is not bool:
                    out.append(Case(name, cf))
    return out


CASES = _cases()


def _filler(name: str, skip: str) -> list[str]:
    """Words for the command's required arguments other than the one fuzzed (trace's PROGRAM)."""
    words = []
    for cls in CONFIGS[name].values():
        for cf in cli_fields(cls):
            if cf.opt.argument and cf.name != skip and cf.default is MISSING:
                words.append("prog.py")
    return words


@pytest.fixture
def stubbed(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """`mldebug` whose commands parse their options for real and then return 0 without doing anything."""
    monkeypatch.setattr(cli_app, "build_app", _stub_builder(REGISTERED))
    yield
    CONFIGS.clear()
    CONFIGS.update(REGISTERED)


def _stub_builder(registered: dict[str, dict[str, type]]) -> Callable[[list[str] | None], typer.Typer]:
    def build(argv: list[str] | None = None) -> typer.Typer:
        stub = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None)
        stub.callback()(cli_app._global_options)
        invoked = next(a for a in argv or [] if not a.startswith("-"))  # only it: Typer builds options slowly
        command(stub, invoked, lambda **_objects: 0, help=invoked, **registered[invoked])
        return stub
    return build


def _argv(case: Case, word: str) -> list[str]:
    if case.cf.opt.argument:
        # the fuzzed word first (a program's name may not be empty even where its arguments may)
        return [case.command, "--", word] if case.command in cli_app.TAKES_COMMAND else [case.command, word]
    return [case.command, case.cf.opt.name, word, *_filler(case.command, case.cf.name)]


def _values(cf: CliField) -> list[str]:
    tp = strip_optional(cf.type)
    words = ["", CONTROL]
    if tp in (int, float) or cf.opt.min is not None:
        words += ["-1", HUGE, f"-{HUGE}", "nan"]
    return words


def _outcome(argv: list[str], capsys: pytest.CaptureFixture[str], env: dict[str, str] | None = None,
             monkeypatch: pytest.MonkeyPatch | None = None) -> tuple[int, str]:
    if env and monkeypatch is not None:
        for k, v in env.items():
            monkeypatch.setenv(k, v)
    rc = cli_app.run(list(argv))
    _out, err = capsys.readouterr()
    return rc, err


def _refusal_names_it(err: str, names: tuple[str, ...]) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("mldebug: error: ") and lines[1].startswith("hint: "), err
    assert any(n in lines[0] for n in names), f"the refusal does not name {names}: {lines[0]!r}"


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_every_option_refuses_bad_values_by_name(case: Case, stubbed: None, capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    names = tuple(n for n in (case.cf.label, *case.cf.opt.flags) if n)
    for word in _values(case.cf):
        argv = _argv(case, word)
        rc, err = _outcome(argv, capsys)
        assert "internal error" not in err, (argv, err)
        assert rc in DOCUMENTED, (argv, rc, err)
        if word == "" and not case.cf.opt.empty:
            assert rc == 2, f"{argv}: an empty word was taken as the default"
        if word.lstrip("-") == HUGE:  # no count, size, id or time of 1e30 exists: C calls overflow on it
            assert rc == 2, f"{argv}: a number beyond any real one was taken"
        if rc == 2:
            _refusal_names_it(err, names)
            # the real command refuses it the same way, so before any work (the stub did none)
            with monkeypatch.context() as m:
                m.setattr(cli_app, "build_app", REAL_BUILD)
                assert _outcome(argv, capsys) == (rc, err), argv


def _envvar_cases() -> list[Case]:
    seen: dict[str, Case] = {}
    for c in CASES:
        if c.cf.opt.envvar and c.cf.opt.envvar not in seen:
            seen[c.cf.opt.envvar] = c
    return list(seen.values())


@pytest.mark.parametrize("case", _envvar_cases(), ids=[c.cf.opt.envvar or "" for c in _envvar_cases()])
def test_every_empty_mldebug_variable_is_refused_by_name(case: Case, stubbed: None, capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """`MLDEBUG_HOSTS= mldebug exec ...` ran on this node: Typer reads an empty variable as not set."""
    envvar = case.cf.opt.envvar
    assert envvar is not None
    rc, err = _outcome([case.command, *_filler(case.command, "")], capsys, {envvar: ""}, monkeypatch)
    assert rc == 2, err
    _refusal_names_it(err, (envvar,))
