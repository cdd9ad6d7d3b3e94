"""`mldebug core-bt`: backtraces (native and Python) of crashed processes' core files, grouped."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from ml_debug.stacks.core_options import CoreBtOptions

if TYPE_CHECKING:
    from rich.console import Console

    from ml_debug.stacks.cores import CoreBtResult

HELP = """Show where crashed processes died: every thread's backtrace plus the Python frames, from core files.

A directory given (as CORE or with --dir) is searched, subdirectories too, for every core file
whatever its name (ELF type core; symbolic links are not followed). With neither, looks where
/proc/sys/kernel/core_pattern writes cores (a relative pattern such as 'core' means the crashing
process's working directory: this one). Each core is matched to its executable (from the core's
own notes) and read with gdb and the interpreter's py-bt helper, or with pystack. Cores with the
same crash are grouped.


  mldebug core-bt                     # cores in this directory (per core_pattern)
  mldebug core-bt core.4242           # one core
  mldebug core-bt --dir /scratch/run7 --newest 20

Exit codes: 0 no core found; 1 crash backtraces shown; 2 a bad path (missing, empty, not a core,
--exe not an executable); 3 neither gdb nor pystack installed; 4 some cores could not be (fully)
read, e.g. a truncated core; 130 interrupted (Ctrl-C): the cores read before it are shown."""

EXAMPLES = (
    "mldebug core-bt                     # cores in this directory (per core_pattern)",
    "mldebug core-bt core.4242           # one core",
    "mldebug core-bt --dir /scratch/run7 --newest 20",
)


def register(app: typer.Typer) -> None:
    from ml_debug.cli.params import command

    command(app, "core-bt", core_bt, help=HELP, examples=EXAMPLES, opts=CoreBtOptions)


def core_bt(opts: CoreBtOptions) -> int:
    from ml_debug.core import output
    from ml_debug.stacks.cores import core_bt_result, find_cores, read_cores

    found, search = find_cores(list(opts.cores), list(opts.dirs) or None, opts.newest)
    reports, interrupted = read_cores(found, opts.timeout, opts.exe)
    result = core_bt_result(reports, search, len(found) if interrupted else None)
    output.emit("mldebug.core-bt", 1, result, lambda console: _human(console, result, opts.all_threads))
    return result.exit_code


def _human(console: Console, result: CoreBtResult, all_threads: bool) -> None:
    from rich.text import Text

    from ml_debug.core.visible import visible

    for note in result.notes:
        console.print(f"note: {visible(note)}")
    cores = {c.path: c for c in result.cores}
    for g in result.groups:
        first = cores[g.cores[0]]
        console.print(Text(f"group {g.id}: {g.count} core(s), {g.signal or 'signal ?'}, "
                           f"{visible(first.executable or '?')}", style="bold"))
        for path in g.cores[:5]:
            c = cores[path]
            console.print(f"  {visible(path)}  pid {c.pid}  {visible(c.cmdline or '')}".rstrip(),
                          soft_wrap=True)  # a path cut in two by the width would read as two
        if len(g.cores) > 5:
            console.print(f"  ... and {len(g.cores) - 5} more")
        threads = first.threads if all_threads else first.threads[:1]
        for i, t in enumerate(threads):
            title = "crashing thread" if i == 0 else "thread"
            console.print(f"  {title} {t.os_thread_id} {visible(t.name or '')}".rstrip() + ":")
            if t.frames:
                console.print("    Python (innermost first):")
                for f in t.frames:
                    console.print(f"      {f.where(brief=True)}")
            console.print("    native (innermost first):")
            for f in t.native_frames[:25]:
                loc = f.filename or f.library or ""
                line = f":{f.line}" if f.line else ""
                console.print(f"      {visible(f.name)}  {visible(loc.rsplit('/', 1)[-1])}{line}")
            if len(t.native_frames) > 25:
                console.print(f"      ... {len(t.native_frames) - 25} more frames (--json has them all)")
        console.print()
    for c in result.cores:
        if not c.ok:
            console.print(Text(f"{'not fully read' if c.threads else 'not read'}: {visible(c.path)}: {visible(c.error or '')}",
                               style="red"))
    style = "bold red" if result.groups else "bold green"
    console.print(Text(visible(result.summary), style=style), soft_wrap=True)
