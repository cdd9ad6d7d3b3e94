"""The documentation holds together: links resolve, help texts point at pages that exist, the README stays short."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import REPO

README_MAX_LINES = 300  # what mldebug is, the question table, install, tests, conventions, five examples

FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
# [text](target "title") and ![alt](target); the target stops at whitespace or the closing parenthesis
INLINE_LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s.*)?$")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
DOCS_PATH = re.compile(r"\bdocs/[\w./{}-]*[\w}/]")


def doc_files() -> list[Path]:
    """Every markdown file whose links this test checks."""
    files = [REPO / "README.md", REPO / "benchmarks" / "README.md", REPO / "tests" / "rig" / "README.md"]
    files += sorted((REPO / "docs").rglob("*.md"))
    return [f for f in files if f.is_file()]


def _prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, text) of the lines outside fenced code blocks, with inline code spans removed."""
    out: list[tuple[int, str]] = []
    fence: str | None = None
    for number, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if m:
            if fence is None:
                fence = m.group(1)
            elif m.group(1) == fence:
                fence = None
            continue
        if fence is None:
            out.append((number, CODE_SPAN.sub("", line)))
    return out


def links(path: Path) -> list[tuple[int, str]]:
    """(line number, target) of every link in a markdown file, code excluded."""
    found: list[tuple[int, str]] = []
    for number, line in _prose_lines(path.read_text(encoding="utf-8")):
        found += [(number, m.group(1)) for m in INLINE_LINK.finditer(line)]
        m = REFERENCE_DEF.match(line)
        if m:
            found.append((number, m.group(1)))
    return found


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: link markup and punctuation dropped, lower case, spaces to '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # [text](url) -> text
    text = re.sub(r"[*_`~]", lambda m: "_" if m.group(0) == "_" else "", text)
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors GitHub makes for a markdown file's headings (a repeated one gets -1, -2, ...)."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    fence: str | None = None
    for line in path.read_text(encoding="utf-8").splitlines():
        m = FENCE.match(line)
        if m:
            fence = m.group(1) if fence is None else (None if m.group(1) == fence else fence)
            continue
        h = HEADING.match(line) if fence is None else None
        if h:
            base = slug(h.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def broken_links(files: list[Path], root: Path = REPO) -> list[str]:
    """'file:line: target (reason)' for every relative link whose file or heading does not exist."""
    problems: list[str] = []
    for md in files:
        where = md.relative_to(root) if md.is_relative_to(root) else md
        for number, target in links(md):
            if SCHEME.match(target) or target.startswith("//"):
                continue  # http(s), mailto: not checked here (no network in tests)
            file_part, _, anchor = target.partition("#")
            dest = (md.parent / file_part).resolve() if file_part else md
            if not dest.exists():
                problems.append(f"{where}:{number}: {target} (no such file)")
            elif not dest.resolve().is_relative_to(root.resolve()):
                problems.append(f"{where}:{number}: {target} (outside the repository)")
            elif anchor and dest.is_file() and dest.suffix == ".md" and anchor not in anchors(dest):
                problems.append(f"{where}:{number}: {target} (no heading #{anchor} in {dest.name})")
    return problems


def command_names() -> list[str]:
    from ml_debug.cli.app import COMMANDS

    return list(COMMANDS)


def docs_paths_in_source() -> dict[str, list[str]]:
    """Every ``docs/...`` path written in ml_debug's source, with '{name}' expanded to each command."""
    found: dict[str, list[str]] = {}
    for py in sorted((REPO / "ml_debug").rglob("*.py")):
        for m in DOCS_PATH.finditer(py.read_text(encoding="utf-8")):
            raw = m.group(0).rstrip("/.")
            paths = [raw.replace("{name}", name) for name in command_names()] if "{name}" in raw else [raw]
            for p in paths:
                found.setdefault(p, []).append(str(py.relative_to(REPO)))
    return found


def test_docs_tree_exists():
    assert (REPO / "docs" / "README.md").is_file()
    assert len(doc_files()) > 10


def test_every_relative_link_resolves():
    problems = broken_links(doc_files())
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_readme_is_short():
    lines = (REPO / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move detail into docs/"


def test_every_command_has_its_page():
    missing = [name for name in command_names() if not (REPO / "docs" / "commands" / f"{name}.md").is_file()]
    assert not missing, f"no docs/commands/<name>.md for: {missing}"


def test_docs_paths_named_in_the_source_exist():
    found = docs_paths_in_source()
    assert found, "expected the CLI's help texts to name docs/ pages"
    missing = {p: files for p, files in found.items() if not (REPO / p).exists()}
    assert not missing, f"docs/ paths named in ml_debug/ that do not exist: {missing}"


def test_readme_links_every_command_page():
    readme_targets = {t.partition("#")[0] for _, t in links(REPO / "README.md")}
    missing = [n for n in command_names() if f"docs/commands/{n}.md" not in readme_targets]
    assert not missing, f"README.md does not link the pages of: {missing}"


def test_readme_table_groups_the_commands_as_help_does():
    """The README's question table: the questions of `mldebug --help`, in its order, each followed by its
    commands in the same order."""
    from ml_debug.cli.app import GROUPS

    rows = [line for line in (REPO / "README.md").read_text(encoding="utf-8").splitlines() if line.startswith("| ")]
    seen: dict[str, list[str]] = {}
    question = None
    for row in rows:
        heading = re.fullmatch(r"\| \*\*(.+?)\*\* \| \|", row)
        if heading:
            question = heading.group(1)
            seen[question] = []
        elif question is not None:
            seen[question] += [c for c in re.findall(r"\[`mldebug ([\w-]+)`\]", row) if c not in seen[question]]
    assert seen == {q: list(names) for q, names in GROUPS.items()}, seen



# `mldebug CMD ... --flag` in a page, a sbatch template or a help text: up to the program's own arguments
# (after `--`, trace's `-m`/`-c`), a comment or the sentence's next clause; a flag inside another's value
# (--sbatch-arg=--gres=...) is not CMD's
COMMAND_LINE = re.compile(r"mldebug ([a-z][a-z-]+)([^|`;&>\n]*)")
COMMAND_END = re.compile(r" -- | -m | -c | ?#|, |\. ")
FLAG = re.compile(r"(?<![\w=-])(--[a-z][a-z0-9-]*)")
# hidden options the docs show on purpose: an earlier name's deprecation line, the agents a page explains
HIDDEN_SHOWN = {("gpu-test", "--timeout"), ("top", "--agent"), ("attach", "--dap-agent")}


def visible_flags() -> dict[str, set[str]]:
    """Each command's flags as its --help lists them (hidden ones, earlier names included, left out)."""
    import typer.main

    from ml_debug.cli.app import build_app

    group = typer.main.get_command(build_app([]))
    return {name: {o for p in cmd.params if getattr(p, "param_type_name", "") == "option" and not p.hidden
                   for o in (*p.opts, *p.secondary_opts)} | {"--help", "-h"}
            for name, cmd in group.commands.items()}  # type: ignore[attr-defined]


def unknown_flags(files: list[Path], flags: dict[str, set[str]], root: Path = REPO) -> list[str]:
    """'file:line: mldebug CMD --flag' for every flag a command line in ``files`` gives that CMD does not show."""
    problems = []
    for f in files:
        for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
            for m in COMMAND_LINE.finditer(line):
                name = m.group(1)
                if name not in flags:
                    continue
                for flag in FLAG.findall(COMMAND_END.split(m.group(2))[0]):
                    if flag not in flags[name] and (name, flag) not in HIDDEN_SHOWN:
                        problems.append(f"{f.relative_to(root)}:{n}: mldebug {name} {flag}")
    return problems


def test_every_flag_the_docs_show_is_one_the_command_shows():
    """A renamed or removed flag leaves no page, template or help text behind (docs/conventions.md: one name
    per meaning)."""
    files = doc_files() + sorted((REPO / "slurm").glob("*.sbatch")) + sorted((REPO / "ml_debug").rglob("*.py"))
    problems = unknown_flags(files, visible_flags())
    assert not problems, "flags no command shows:\n" + "\n".join(problems)


# ---- the checker itself must be able to fail


def test_checker_finds_a_broken_file_link_and_a_broken_anchor(tmp_path: Path):
    (tmp_path / "there.md").write_text("# Real heading\n\n## `--flag` and more\n", encoding="utf-8")
    md = tmp_path / "index.md"
    md.write_text(
        "# Index\n"
        "[ok](there.md) [ok anchor](there.md#real-heading) [ok code anchor](there.md#--flag-and-more)\n"
        "[self](#index) [web](https://example.org/missing)\n"
        "[gone](missing.md) and [bad anchor](there.md#no-such-heading)\n"
        "```\n[in a code block](not-checked.md)\n```\n"
        "`[in a code span](not-checked.md)`\n"
        "[ref]: also-missing.md\n",
        encoding="utf-8")
    problems = broken_links([md], root=tmp_path)
    assert problems == [
        "index.md:4: missing.md (no such file)",
        "index.md:4: there.md#no-such-heading (no heading #no-such-heading in there.md)",
        "index.md:9: also-missing.md (no such file)",
    ]


@pytest.mark.parametrize(("heading", "anchor"), [
    ("Install and first run", "install-and-first-run"),
    ("[mldebug check](docs/commands/check.md)", "mldebug-check"),
    ("Example: `--pairwise`", "example---pairwise"),
    ("What listens where", "what-listens-where"),
])
def test_slug_matches_github(heading: str, anchor: str):
    assert slug(heading) == anchor


def test_flag_checker_finds_a_gone_flag_and_leaves_a_programs_own_alone(tmp_path: Path):
    md = tmp_path / "page.md"
    md.write_text("mldebug logs --jobs 2 DIR\n"
                  "`mldebug logs --json DIR` and mldebug logs --nosuch\n"
                  "mldebug launch --nproc-per-node 2 -- python train.py --lr 3e-4  # torchrun --tee 3\n"
                  "mldebug drill --sbatch-arg=--gres=gpu:8\n"
                  "give what mldebug logs read, or --jobs 1\n", encoding="utf-8")
    flags = {"logs": {"--json"}, "launch": {"--nproc-per-node"}, "drill": {"--sbatch-arg"}}
    assert unknown_flags([md], flags, root=tmp_path) == ["page.md:1: mldebug logs --jobs", "page.md:2: mldebug logs --nosuch"]
