"""docs/architecture.md is true to the tree: every package and every module is named in its package's row,
the module role words hold, and the library's "never prints, never exits" has exactly the exceptions the
page names."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.conftest import REPO

PACKAGE = REPO / "ml_debug"
DOC = REPO / "docs" / "architecture.md"
ROLES = ("options.py", "run.py", "verdict.py", "result.py", "render.py")
# The modules the page names as the exceptions to "the library never prints and never exits".
PRINTS_OR_EXITS = {"debugger/rank.py", "debugger/injector/__main__.py", "debugger/injector/lldb_call.py"}  # printflock writes to its file, it does not call print()
HARD_EXITS = {"gputest/stages.py", "tracing/watchdog.py", "train/faults.py", "debugger/session.py"}


def _packages() -> list[Path]:
    return sorted(p for p in PACKAGE.iterdir() if (p / "__init__.py").is_file())


def _row(text: str, package: str) -> str:
    """The packages table's row of `package/`."""
    rows = [line for line in text.splitlines() if line.startswith(f"| `{package}/` |")]
    assert len(rows) == 1, f"docs/architecture.md has {len(rows)} rows for {package}/"
    return rows[0]


def test_every_package_and_its_modules_are_named_in_their_row() -> None:
    text = DOC.read_text()
    missing: list[str] = []
    for package in _packages():
        row = _row(text, package.name)
        missing += [f"{package.name}/{m.name}" for m in sorted(package.glob("*.py"))
                    if m.name != "__init__.py" and f"`{m.name}`" not in row and f"{m.name}`" not in row]
    assert (PACKAGE / "schemas").is_dir() and _row(text, "schemas")
    assert not missing, f"modules docs/architecture.md does not name in their package's row: {missing}"


def test_every_cli_module_and_command_is_named() -> None:
    from ml_debug.cli.app import COMMAND_MODULES

    row = _row(DOC.read_text(), "cli")
    assert set(COMMAND_MODULES) <= {m.stem for m in (PACKAGE / "cli").glob("*.py")}
    assert all(f"`{m}.py`" in row for m in COMMAND_MODULES), COMMAND_MODULES


def test_the_layers_drawing_names_every_package_and_top_level_module() -> None:
    text = DOC.read_text()
    drawing = text[text.index("```"):text.index("```", text.index("```") + 3)]
    assert not [p.name for p in _packages() if f"{p.name}/" not in drawing], drawing
    tops = [m.name for m in PACKAGE.glob("*.py") if not m.name.startswith("_")]
    assert not [m for m in tops if m not in drawing], tops


def test_modules_named_for_a_role_exist_where_the_page_says() -> None:
    """Each role word is a module somewhere, and no package outside those the page excuses still uses an
    older word for a role (`model.py` for data, `view.py` or `report.py` for a renderer)."""
    text = DOC.read_text()
    for role in ROLES:
        assert f"| `{role}` |" in text, role
        assert list(PACKAGE.glob(f"*/{role}")), role
    older = sorted(str(m.relative_to(PACKAGE)) for word in ("model.py", "view.py", "report.py", "runner.py")
                   for m in PACKAGE.glob(f"*/{word}"))
    excused = {"train/model.py", "remote/runner.py"}
    assert set(older) == excused, set(older) ^ excused
    assert all(f"`{m.split('/')[0]}/{m.split('/')[1]}`" in text or m.split("/")[1] in text for m in excused)


def _calls(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Name) and f.id == "print":
                names.add("print")
            elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and \
                    (f.value.id, f.attr) in (("sys", "exit"), ("os", "_exit")):
                names.add(f"{f.value.id}.{f.attr}")
    return names


def test_the_library_prints_and_exits_only_where_the_page_says() -> None:
    """Outside cli/ (and printing shims), no module calls print() or sys.exit(); os._exit only in the
    processes the page names. A new one is either a bug or a line on the page and here."""
    found: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = str(path.relative_to(PACKAGE))
        if rel.startswith("cli/") or rel == "__main__.py":
            continue
        calls = _calls(ast.parse(path.read_text()))
        if calls:
            found[rel] = calls
    prints = {m for m, c in found.items() if c & {"print", "sys.exit"}}
    hard = {m for m, c in found.items() if "os._exit" in c}
    assert prints == PRINTS_OR_EXITS, prints ^ PRINTS_OR_EXITS
    assert hard == HARD_EXITS, hard ^ HARD_EXITS
    rule = DOC.read_text()
    rule = rule[rule.index("**The library never prints and never exits.**"):]
    rule = rule[:rule.index("\n- **")]
    assert all(f"`{m}`" in rule for m in PRINTS_OR_EXITS | HARD_EXITS), rule
    assert not re.search(r"\bnext\b", DOC.read_text().split("## Packages")[0]), "a plan in the layers drawing"
