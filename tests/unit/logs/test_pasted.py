"""`mldebug logs` on logs as people paste them: every real launcher console of tests/data/logs_corpus, damaged
the ways issue threads damage them, must give the same answer as the original, and say what was mended."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from ml_debug.logs.triage import triage
from tests.conftest import REPO, validate_schema
from tests.unit.logs.test_launchers import REAL

CORPUS = REPO / "tests" / "data" / "logs_corpus"
BAR = "Epoch 1:  12%|█▏        | 12/100 [00:01<00:08, 10.50it/s, loss=2.31]"
RICH = "Epoch 0/0  ━━━━━━━━╸                          2/8 0:00:05 • 0:00:01 160.41it/s "


def _quoted(text: str) -> str:
    return "".join(f"> {line}\n" if line else ">\n" for line in text.splitlines())


def _numbered(text: str) -> str:
    return "".join(f"{i:>4} | {line}\n" for i, line in enumerate(text.splitlines(), 1))


def _bracket_numbered(text: str) -> str:
    return "".join(f"[{i}] {line}\n" for i, line in enumerate(text.splitlines(), 1780))


def _wrapped(text: str, width: int = 100) -> str:
    out = []
    for line in text.splitlines():
        out += [line[i:i + width] for i in range(0, len(line), width)] or [""]
    return "\n".join(out) + "\n"


def _reversed(text: str) -> str:
    return "\n".join(reversed(text.splitlines())) + "\n"


def _glued_bars(text: str) -> str:
    """A progress bar (tqdm; rich, as Lightning draws it) without a newline before every fifth line, and the
    carriage returns of a bar redrawn in place before others."""
    out = []
    for i, line in enumerate(text.splitlines()):
        if i % 5 == 2:
            line = BAR + line
        elif i % 5 == 4:
            line = RICH + line
        elif i % 7 == 3:
            line = f"\r{BAR}\r{line}"
        out.append(line)
    return "\n".join(out) + "\n"


def _tmux(text: str) -> str:
    return "".join(f"{line}[{i}/3456]\n" if i % 9 == 0 and line.strip() else f"{line}\n"
                   for i, line in enumerate(text.splitlines()))


def _indented(text: str) -> str:
    """Pasted as a markdown code block by indentation (4 spaces in front of every line)."""
    return "".join(f"    {line}\n" if line.strip() else "\n" for line in text.splitlines())


def _dedented(text: str) -> str:
    return "".join(line.strip() + "\n" for line in text.splitlines())


def _quoted_numbered_wrapped(text: str) -> str:
    """Wrapped by the terminal, saved, shown by a viewer with its line numbers, pasted as a quote."""
    return _quoted(_numbered(_wrapped(text, 120)))


DAMAGE: dict[str, tuple[Callable[[str], str], str | None]] = {
    "quoted": (_quoted, "markdown quoting"),
    "numbered": (_numbered, "viewer line numbers"),
    "bracket-numbered": (_bracket_numbered, "viewer line numbers"),
    "wrapped": (_wrapped, "hard-wrapped at 100 columns"),
    "reversed": (_reversed, "bottom-to-top"),
    "progress-bars": (_glued_bars, "progress bar cut off"),
    "tmux": (_tmux, "tmux counter cut off"),
    "indented": (_indented, "an indentation of 4 spaces on every line removed"),
    "dedented": (_dedented, None),
    "quoted+numbered+wrapped": (_quoted_numbered_wrapped, "markdown quoting"),
}
# a few files reach every damage; the others are wrapped, quoted and reversed (the commonest)
EVERY = ("torchrun-segv.log", "srun-torchrun.log", "deepspeed.log", "mpirun.log", "lightning.log", "pdsh.log")
CASES = [(name, d) for name in sorted(REAL) for d in DAMAGE if name in EVERY or d in ("wrapped", "quoted", "reversed")]


def _answer(path: Path) -> tuple[int | None, str]:
    v = triage([str(path)]).verdict
    assert v.primary is not None, v.summary
    return v.primary.who.rank, v.primary.message


@pytest.mark.parametrize(("name", "damage"), CASES)
def test_a_damaged_copy_gives_the_same_answer(tmp_path: Path, name: str, damage: str) -> None:
    hurt, said = DAMAGE[damage]
    original = CORPUS / name
    copy = tmp_path / name
    copy.write_text(hurt(original.read_text()))
    report = triage([str(copy)])
    v = report.verdict
    assert v.primary is not None, v.summary
    rank, message = REAL[name][0], REAL[name][1]
    assert (v.primary.who.rank, v.primary.message) == _answer(original), v.summary
    assert v.primary.who.rank == rank and message in v.primary.message, v.summary
    # fewer than 3 lines over the terminal's width: no sign of the wrap (repair.py), yet the answer holds
    seen = damage != "wrapped" or sum(len(line) > 100 for line in original.read_text().splitlines()) >= 3
    if said is not None and seen:
        repairs = "; ".join(report.sources[0].repairs)
        assert said in repairs, repairs


def test_a_cut_last_line_is_tolerated_and_said(tmp_path: Path) -> None:
    """The copy ends in the middle of torchrun's failure summary (no newline at the end)."""
    text = (CORPUS / "torchrun-segv.log").read_text()
    cut = text[:text.index("exitcode  : -11") + len("exitcode  : -1")]
    copy = tmp_path / "cut.log"
    copy.write_text(cut)
    report = triage([str(copy)])
    v = report.verdict
    assert v.primary is not None and v.primary.who.rank == 2, v.summary
    assert any("cut short" in r for r in report.sources[0].repairs), report.sources[0].repairs


def test_clean_logs_are_not_mended(tmp_path: Path) -> None:
    for name in sorted(REAL):
        report = triage([str(CORPUS / name)])
        assert not [r for s in report.sources for r in s.repairs if "pdsh" not in r], (name, report.sources[0].repairs)


def test_the_cli_says_what_was_mended_and_how_sure_and_its_json_holds_it(tmp_path: Path) -> None:
    copy = tmp_path / "pasted.md"
    copy.write_text(_quoted(_wrapped(_reversed((CORPUS / "torchrun-agent1.log").read_text()))))
    env = {k: v for k, v in os.environ.items() if k not in ("MLDEBUG_JSON", "COLUMNS")}
    human = subprocess.run([sys.executable, "-m", "ml_debug", "logs", str(copy)], capture_output=True, text=True,
                           timeout=60, env=env)
    assert human.returncode == 1, human.stderr
    lines = human.stdout.splitlines()
    assert lines[0].startswith("first failure: rank 3, reported at "), lines[:3]
    assert lines[1] == "  how sure: high (the only primary failure)", lines[:3]
    assert any(ln.startswith(f"  repaired {copy}: markdown quoting ('> ') removed; ") and "read in reverse" in ln
               for ln in lines), lines[:8]
    assert "written by torchrun" in human.stdout
    got = subprocess.run([sys.executable, "-m", "ml_debug", "--json", "logs", str(copy)], capture_output=True,
                         text=True, timeout=60, env=env)
    doc = json.loads(got.stdout)
    validate_schema(doc, "logs")
    result = doc["result"]
    assert result["launchers"] == ["torchrun"] and result["verdict"]["confidence"] == "high"
    assert "pasted bottom-to-top: read in reverse" in result["sources"][0]["repairs"]
