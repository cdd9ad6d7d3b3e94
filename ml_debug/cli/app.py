"""The `mldebug` command: global options, command registration and the one error handler."""

from __future__ import annotations

import os
import signal
import sys
import traceback
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from ml_debug import __version__
from ml_debug.core import lifecycle, output
from ml_debug.core.errors import ExitCode, MLDebugError

# The commands grouped by the question they answer, in --help order (plain and rich help alike, and the
# README's table).
GROUPS: dict[str, tuple[str, ...]] = {
    "Is this node fit?": ("check", "env", "health", "gpu-test", "allreduce-bench"),
    "What is my job doing now?": ("top", "watch", "exporter", "dump-stacks", "attach"),
    "Why did it fail?": ("logs", "core-bt", "trace", "trace-tail", "history"),
    "Run and rehearse": ("launch", "exec", "train", "drill", "tflops"),
}
# command name -> the module in ml_debug/cli that registers it (in --help order). Importing a module
# must stay cheap; building a command's options costs Typer ~20 ms per option, so a run of one
# command builds only that command.
_MODULES = {"trace-tail": "trace", "exec": "remote_exec"}
COMMANDS = {name: _MODULES.get(name, name.replace("-", "_")) for names in GROUPS.values() for name in names}
COMMAND_MODULES = tuple(dict.fromkeys(COMMANDS.values()))
# Commands whose `--` introduces a program to run (`mldebug exec -- CMD`, `mldebug trace -- x.py`).
# For every other command a `--` only shields its options from a launcher
# (`torchrun --no-python mldebug gpu-test -- --stage-timeout 5`) and is dropped.
TAKES_COMMAND = ("exec", "trace", "launch")

HELP = """mldebug: find what is wrong with a distributed PyTorch job.

Start with `mldebug check` (this node), then the command for your question, below:
`mldebug COMMAND --help` shows its options and examples.

Exit codes: 0 all good; 1 a problem was found; 2 bad usage or input; 3 the environment
lacks something (GPU, py-spy, ptrace permission); 4 partial result (some ranks/nodes never
answered); 130 interrupted."""


def group_of(command: str) -> str | None:
    """The question a command answers (its --help group)."""
    return next((question for question, names in GROUPS.items() if command in names), None)


class _GroupedHelp(TyperGroup):
    """`mldebug --help` in plain text lists the commands under their questions, as rich help does with
    each command's rich_help_panel (Typer's plain help has one flat list)."""

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        shown = [(name, cmd) for name in self.list_commands(ctx)
                 if (cmd := self.get_command(ctx, name)) is not None and not cmd.hidden]
        if not shown:
            return
        width = max(len(name) for name, _ in shown)  # one column for every group
        limit = formatter.width - 6 - width
        for question in [*GROUPS, None]:
            rows = [(name.ljust(width), cmd.get_short_help_str(limit)) for name, cmd in shown
                    if group_of(name) == question]
            if rows:
                formatter.write_paragraph()
                formatter.write_text(question or "Other commands")  # a question: no ':' after it
                formatter.indent()
                formatter.write_dl(rows)
                formatter.dedent()


def _version(value: bool) -> None:
    if value:
        if output.MODE.json:  # a script that asks for JSON gets one document, here too
            output.emit("mldebug.version", 1, {"ok": True, "summary": f"mldebug {__version__}",
                                               "version": __version__})
        else:
            typer.echo(f"mldebug {__version__}")
        raise typer.Exit()


def _global_options(
    json: Annotated[bool, typer.Option("--json", envvar="MLDEBUG_JSON",
                                       help="Machine-readable output: one JSON document on stdout.")] = False,
    debug: Annotated[bool, typer.Option("--debug", envvar="MLDEBUG_DEBUG",
                                        help="Show tracebacks and debug logs.")] = False,
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    output.configure(json=json or None, debug=debug)  # run() may have seen --json where Typer does not yet
    if debug:  # the ranks and local agents this command starts show their tracebacks too
        os.environ["MLDEBUG_DEBUG"] = "1"


def build_app(argv: list[str] | None = None) -> typer.Typer:
    """The Typer app; given the command line, only the invoked command's module is registered."""
    import importlib

    app = typer.Typer(
        name="mldebug",
        cls=_GroupedHelp,
        help=HELP,
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        rich_markup_mode=None,
        context_settings={"help_option_names": ["-h", "--help"]},
    )
    app.callback()(_global_options)
    invoked = next((a for a in argv or [] if not a.startswith("-")), None)
    for name in (COMMANDS[invoked],) if invoked in COMMANDS else COMMAND_MODULES:
        importlib.import_module(f"ml_debug.cli.{name}").register(app)
    return app


def _debug_requested(argv: list[str]) -> bool:
    return "--debug" in argv or os.environ.get("MLDEBUG_DEBUG", "").lower() in ("1", "true", "yes")


def _fail(message: str, hint: str | None) -> None:
    from ml_debug.core.visible import visible  # a message may quote a job's path or string

    message, hint = visible(message, keep="\n"), hint and visible(hint, keep="\n")
    try:
        sys.stdout.flush()
    except (OSError, MLDebugError):  # the output itself failed (ml_debug.core.streams): said below
        pass
    sys.stderr.write(f"mldebug: error: {message}\n")
    if hint:
        sys.stderr.write(f"hint: {hint}\n")
    sys.stderr.flush()


_TRUE = ("1", "true", "t", "yes", "y", "on")


def _json_requested(argv: list[str], invoked: str | None) -> bool:
    """--json asked for, even where the command line did not parse far enough to say so (a usage error):
    the global or command option (not a word after `--` of exec/trace/launch, which is the program's), or
    MLDEBUG_JSON."""
    words = argv[:argv.index("--")] if invoked in TAKES_COMMAND and "--" in argv else argv
    return "--json" in words or os.environ.get("MLDEBUG_JSON", "").strip().lower() in _TRUE


def _ended(command: str | None, code: int, message: str, hint: str | None, **kw: object) -> int:
    """The one way a command ends without its own answer: the human line on stderr and, with --json, one
    error document on stdout (unless the command already printed its document)."""
    _fail(message, hint)
    output.emit_error(command, code, message, hint, **kw)
    return code


def run(argv: list[str] | None = None) -> int:
    """Run the CLI and return the exit code (tests call this; :func:`main` exits with it)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        argv = ["--help"]
    debug = _debug_requested(argv)
    invoked = next((a for a in argv if not a.startswith("-")), None)
    command = invoked if invoked in COMMANDS else None
    # a fresh command: its --json as this command line asks, and no document printed yet
    output.configure(json=_json_requested(argv, invoked) and "--help" not in argv and "-h" not in argv)
    output.MODE.documents = 0
    if invoked in COMMANDS and invoked not in TAKES_COMMAND and "--" in argv:
        argv.remove("--")
    try:
        rv = build_app(argv)(args=argv, prog_name="mldebug", standalone_mode=False)
        if rv == ExitCode.INTERRUPTED:  # Typer turns a Ctrl-C inside a command into Exit(130)
            return _interrupted(command)
        code = rv if isinstance(rv, int) else ExitCode.OK
        if code != ExitCode.OK and not output.MODE.documents:  # a command that ended with a code and no answer
            output.emit_error(command, code, f"mldebug {command or ''} ended with exit code {code}".replace("  ", " "))
        return code
    except MLDebugError as e:
        if debug:
            traceback.print_exc()
        return _ended(command, int(e.exit_code), e.message, e.hint, details=e.details)
    except typer.TyperException as e:  # Typer's usage errors: unknown command/option, bad value
        if debug:
            traceback.print_exc()
        ctx = getattr(e, "ctx", None)
        where = ctx.command_path if ctx is not None else "mldebug"
        return _ended(command, int(getattr(e, "exit_code", ExitCode.USAGE)), e.format_message().replace("\n", " "),
                      f"try '{where} --help'")
    except (KeyboardInterrupt, typer.Abort):
        return _interrupted(command)
    except BrokenPipeError:
        # stdout closed early (`mldebug ... | head`): not an error worth a traceback.
        try:
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115
        except OSError:
            pass
        return ExitCode.OK
    except ImportError as e:  # an optional part that no require() asked for first: still named, exit 3
        if debug:
            traceback.print_exc()
        from ml_debug.core.extras import missing_from_import_error

        missing = missing_from_import_error(e, command)
        if missing is None:
            return _internal(command, e, debug)
        return _ended(command, int(missing.exit_code), missing.message, missing.hint, details=missing.details)
    except Exception as e:
        if debug:
            traceback.print_exc()
        return _internal(command, e, debug)


def _internal(command: str | None, e: BaseException, debug: bool) -> int:
    """A bug in mldebug: the only way to end with `internal error`."""
    return _ended(command, ExitCode.PROBLEM, f"internal error: {type(e).__name__}: {e}",
                  None if debug else "run again with --debug for the traceback, and report it as a bug",
                  kind="internal")


def _interrupted(command: str | None) -> int:
    sig = lifecycle.interrupting_signal()
    message = "interrupted" if sig == "SIGINT" else f"interrupted by {sig}"
    return _ended(command, ExitCode.INTERRUPTED, message, None, signal=sig)


# The commands whose processes are ranks when a launcher (torchrun, srun, mpirun) started them: their
# launcher stops them with SIGTERM, which keeps its default meaning there (gpu-test first finishes its
# verdict, see gputest.stages).
RANK_COMMANDS = ("gpu-test", "allreduce-bench", "train")
# `mldebug trace PROGRAM` runs the user's program in this process: SIGTERM keeps the program's own meaning
# (the tracer writes its ring, then the process dies of SIGTERM as the untraced program would).
OWN_SIGTERM = ("trace",)


def main() -> None:
    from ml_debug.cli.exits import exit_cli
    from ml_debug.core import streams
    from ml_debug.dist.world import is_launched

    streams.prepare()  # closed, ASCII-only or unwritable streams are not internal errors
    lifecycle.adopt_parent_tie()  # a command that mldebug started (check's steps, drill's jobs) dies with it
    invoked = next((a for a in sys.argv[1:] if not a.startswith("-")), None)
    lifecycle.install(terminate=not ((invoked in RANK_COMMANDS and is_launched()) or invoked in OWN_SIGTERM))
    code = run()
    if code == ExitCode.INTERRUPTED:
        # Ctrl-C has been answered; a second one (`timeout -s INT` signals the process and its group)
        # must not break Python's exit, which joins worker threads, into a traceback.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
    exit_cli(code)
