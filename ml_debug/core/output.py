"""The one rendering sink: human (rich) or ``--json`` on stdout; logs and progress on stderr.

Library code returns data; a CLI command hands it to :func:`emit` together with
a function that draws the human view. Every JSON document has the same envelope::

    {"schema": "mldebug.<name>", "schema_version": N, "mldebug_version": "...",
     "created": "<UTC ISO time>", "environment": {...}, "result": {...}}

rich is imported only when something is drawn.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import enum
import json
import math
import os
import re
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import PurePath
from typing import TYPE_CHECKING, Any

from ml_debug import __version__

if TYPE_CHECKING:
    from rich.console import Console


@dataclasses.dataclass
class Mode:
    json: bool = False
    debug: bool = False
    documents: int = 0
    """JSON documents written so far: the top-level handler adds an error document only where there is none."""


MODE = Mode()


def configure(*, json: bool | None = None, debug: bool | None = None) -> None:
    """Set the global output mode (called by the CLI's top-level callback)."""
    if json is not None:
        MODE.json = json
    if debug is not None:
        MODE.debug = debug


def to_jsonable(obj: Any) -> Any:
    """Dataclasses, enums, paths, sets and tuples to plain JSON values; NaN/inf to None."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, enum.Enum):
        return to_jsonable(obj.value)
    if isinstance(obj, Mapping):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, (set, frozenset)):
        return sorted(to_jsonable(v) for v in obj)
    if isinstance(obj, PurePath):
        return str(obj)
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    if hasattr(obj, "item"):  # numpy / torch scalars
        return to_jsonable(obj.item())
    return str(obj)


def document(
    schema: str, version: int, result: Any, environment: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The versioned JSON envelope around one command's result."""
    if environment is None:
        from ml_debug.core.environment import summary

        environment = summary()
    return {
        "schema": schema,
        "schema_version": version,
        "mldebug_version": __version__,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "environment": to_jsonable(environment),
        "result": to_jsonable(result),
    }


def dumps(doc: Mapping[str, Any]) -> str:
    return json.dumps(doc, indent=2, sort_keys=False, allow_nan=False)


def emit(
    schema: str,
    version: int,
    result: Any,
    human: Callable[[Console], None] | None = None,
    *,
    environment: Mapping[str, Any] | None = None,
) -> None:
    """Write one command's result to stdout: the JSON document (with --json), or the human view."""
    try:
        if MODE.json:
            write_document(document(schema, version, result, environment))
        elif human is not None:
            human(stdout_console())
            sys.stdout.flush()  # out before any launcher can stop this process (torchrun's SIGTERM)
    except BrokenPipeError:
        reader_gone()


def rank_document_path() -> str | None:
    """Where a self-launched rank puts its JSON document: its launcher prints one document for the whole
    run (the rank's, or one that says why there is none), so a script gets exactly one."""
    launch_dir = os.environ.get("MLDEBUG_LAUNCH_DIR")
    rank = os.environ.get("RANK")
    return os.path.join(launch_dir, f"rank{rank}.json") if launch_dir and rank and rank.isdigit() else None


def write_document(doc: Mapping[str, Any], *, compact: bool = False) -> None:
    """Write one JSON document: to stdout, or in a self-launched rank to the file its launcher reads."""
    text = json.dumps(doc, separators=(",", ":"), allow_nan=False) if compact else dumps(doc)
    MODE.documents += 1
    path = rank_document_path()
    if path is not None:
        with open(path + ".tmp", "w") as fh:
            fh.write(text + "\n")
        os.replace(path + ".tmp", path)
        return
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


ERROR_SCHEMA = "mldebug.error"
ERROR_SCHEMA_VERSION = 1
ERROR_KINDS = {1: "problem", 2: "usage", 3: "environment", 4: "partial", 130: "interrupted"}


def error_result(command: str | None, exit_code: int, message: str, hint: str | None = None, *,
                 kind: str | None = None, signal: str | None = None, partial: Any = None,
                 details: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The result of a command that ended without its own document: a usage error, an internal error, an
    interrupt (see ml_debug/schemas/error.json). ``partial`` is what the command had gathered (its own
    document when there is one)."""
    return {
        "ok": False,
        "summary": message,
        "command": command,
        "exit_code": int(exit_code),
        "error": {"kind": kind or ERROR_KINDS.get(int(exit_code), "problem"), "message": message, "hint": hint,
                  "signal": signal},
        "partial": to_jsonable(partial),
        "details": to_jsonable(dict(details or {})),
    }


def emit_error(command: str | None, exit_code: int, message: str, hint: str | None = None, **kw: Any) -> None:
    """With --json, the one document of a run that printed none: ``result.ok`` false, the error, the exit code.
    A rank of a job started by torchrun/srun/mpirun other than rank 0 leaves it to rank 0 (one document per
    job); the human line is on stderr either way."""
    if not MODE.json or MODE.documents:
        return
    rank = os.environ.get("RANK") or os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ.get("PMI_RANK")
    if rank_document_path() is None and rank not in (None, "", "0"):
        return
    try:
        write_document(document(ERROR_SCHEMA, ERROR_SCHEMA_VERSION,
                                error_result(command, exit_code, message, hint, **kw)))
    except (BrokenPipeError, OSError):
        pass


def reader_gone() -> None:
    """stdout's reader went away (`mldebug logs x | head -1`): what is left to print goes nowhere, and the
    command still ends with its own exit code (its verdict), not an error."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


_consoles: dict[str, Console] = {}


UNLIMITED = 10_000
"""Width of output that is not a terminal: a pipe or a file gets every column whole, never cut."""


def _width(stream: Any) -> int | None:
    """MLDEBUG_WIDTH or COLUMNS when set (golden tests), a terminal's own width, else unlimited.
    A width must be a positive number: 0 or garbage is ignored (a width of 0 printed nothing at all)."""
    for name in ("MLDEBUG_WIDTH", "COLUMNS"):
        value = os.environ.get(name, "").strip()
        if value.isascii() and value.isdigit() and int(value) > 0:
            return int(value)
    return None if stream.isatty() else UNLIMITED


_TRAILING_SPACES = re.compile(r" +$", re.MULTILINE)


def console_class() -> type[Console]:
    """rich's Console that never lets a control character of the text through.

    What mldebug shows comes largely from jobs (process and file names, frames, log lines, host names,
    environment values): each piece of text is passed through :func:`ml_debug.core.visible.visible`
    as it is written, so ``ESC``, ``\\r``, ``\\b`` or U+009B print as ``\\e``, ``\\r``... and cannot drive
    the reader's terminal. rich's own style codes are added after, in control segments and styles, so
    colours still work. Every console that draws text for people is made from this class (the
    terminal, and files meant for reading such as the watch bundle's ``dump-stacks.txt``)."""
    if "class" not in _classes:
        import rich.text
        from rich.console import Console
        from rich.segment import Segment

        from ml_debug.core.visible import visible

        # rich's Text silently drops BEL, \b, \v, \f and \r when it is made (before any console sees
        # it): a line that overwrote itself would lose the evidence. They are made visible instead, as
        # everything else is (Text is built from mldebug's own strings or a job's, never from rich's
        # terminal codes, which travel as control segments)
        rich.text.strip_control_codes = lambda text, *_a, **_k: visible(text, keep="\n\t")

        class SafeConsole(Console):
            def render_str(self, text: str, **kwargs: Any) -> Any:  # before rich drops \r, \b, BEL unseen
                return super().render_str(visible(text, keep="\n\t"), **kwargs)

            def _render_buffer(self, buffer: Any) -> str:
                safe = [seg if seg.control or seg.text.isprintable() else
                        Segment(visible(seg.text, keep="\n\t"), seg.style, seg.control) for seg in buffer]
                text: str = super()._render_buffer(safe)
                return text

        _classes["class"] = SafeConsole
    return _classes["class"]


_classes: dict[str, type[Console]] = {}


def text_console(file: Any, **kwargs: Any) -> Console:
    """A console that draws into `file` (a report meant for reading), control characters made visible."""
    return console_class()(file=file, **kwargs)


def stdout_console() -> Console:
    if "out" not in _consoles:
        class StdoutConsole(console_class()):  # type: ignore[misc]
            def on_broken_pipe(self) -> None:  # rich's own exits 1, which reads as "a problem was found"
                self.quiet = True
                reader_gone()

            def _render_buffer(self, buffer: Any) -> str:  # rich pads table cells and titles to the width
                text: str = super()._render_buffer(buffer)
                return text if self.is_terminal else _TRAILING_SPACES.sub("", text)  # kept out of files and diffs

        _consoles["out"] = StdoutConsole(file=sys.stdout, width=_width(sys.stdout), highlight=False, soft_wrap=False)
    return _consoles["out"]


def stderr_console() -> Console:
    if "err" not in _consoles:
        _consoles["err"] = console_class()(file=sys.stderr, width=_width(sys.stderr), highlight=False)
    return _consoles["err"]


def times(n: int) -> str:
    """How often, in words: 'once', 'twice', '3 times'."""
    return {1: "once", 2: "twice"}.get(n, f"{n} times")


def log(message: str) -> None:
    """One line for the person at the terminal: always stderr, never mixed into data. Control characters
    and newlines are made visible: a message may quote a job's path or string, and a name with a newline
    must not add a line that reads as mldebug's own."""
    from ml_debug.core.visible import visible

    sys.stderr.write(visible(message.rstrip("\n"), keep="\t") + "\n")
    sys.stderr.flush()


def warn(message: str) -> None:
    log(f"mldebug: warning: {message}")


class _Progress:
    """A progress handle; a no-op unless stderr is a terminal and output is human."""

    def __init__(self, bar: Any = None, task: Any = None) -> None:
        self._bar, self._task = bar, task

    def advance(self, n: float = 1, description: str | None = None) -> None:
        if self._bar is not None:
            kw = {"description": description} if description else {}
            self._bar.update(self._task, advance=n, **kw)


@contextmanager
def progress(total: float | None, description: str) -> Iterator[_Progress]:
    """Progress on stderr for long work, when a person is watching."""
    if MODE.json or not sys.stderr.isatty():
        yield _Progress()
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=stderr_console(), transient=True) as bar:
        yield _Progress(bar, bar.add_task(description, total=total))
