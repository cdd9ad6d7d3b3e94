"""Start-up cost: `mldebug --help` and `mldebug env` against `python -c pass` and a bare Typer app."""

from __future__ import annotations

import subprocess
import sys

from benchmarks.common import Result, timeit

BARE_TYPER = """
import typer
app = typer.Typer(add_completion=False)
@app.command()
def hello(name: str = "x") -> None:
    print(name)
@app.command()
def bye() -> None:
    pass
app()
"""


def _cmd(argv: list[str]) -> float:
    def once() -> None:
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, timeout=120)

    return timeit(once, repeat=5)


def run() -> list[Result]:
    py = sys.executable
    base = _cmd([py, "-c", "pass"])
    typer_help = _cmd([py, "-c", BARE_TYPER, "--help"])
    help_ = _cmd([py, "-m", "ml_debug", "--help"])
    env_light = _cmd([py, "-m", "ml_debug", "env", "--no-torch", "--json"])
    env_full = _cmd([py, "-m", "ml_debug", "env", "--json"])
    ms = lambda s: f"{s * 1000:.0f} ms"  # noqa: E731
    return [
        Result("startup: mldebug --help / python -c pass", help_ / base, f"{ms(help_)} vs {ms(base)}"),
        Result("startup: mldebug --help / bare Typer --help", help_ / typer_help, f"{ms(help_)} vs {ms(typer_help)}"),
        Result("startup: mldebug env --no-torch / python", env_light / base, f"{ms(env_light)} vs {ms(base)}"),
        Result("startup: mldebug env (torch) / python", env_full / base, f"{ms(env_full)} vs {ms(base)}"),
    ]


if __name__ == "__main__":
    for r in run():
        print(r.line())
