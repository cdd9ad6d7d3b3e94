"""The page around the views: head, the verdict first, the sections, the style and the script inline.

One file that opens anywhere, an air-gapped laptop included: no network, no CDN. The Content Security
Policy says so to the browser as well: nothing may be fetched (``default-src 'none'``), and only the
page's own script runs (``script-src 'sha256-...'`` of that script), so even a string that escaped
:func:`ml_debug.page.text.esc` could not run as a script.
"""

from __future__ import annotations

import base64
import hashlib
import time
from dataclasses import dataclass, field
from functools import cache
from importlib import resources

from ml_debug.page.text import esc

GENERATOR = "mldebug"


@dataclass(frozen=True)
class Section:
    """One part of the page: a heading that folds (``<details>``) over HTML made by a view."""

    id: str
    title: str
    body: str  # HTML, every job string in it already through text.esc
    open: bool = True
    note: str = ""  # a few words beside the title (counts)


@dataclass(frozen=True)
class Page:
    """What every page has: which command made it, the verdict, a few facts, and the sections."""

    title: str
    command: str
    verdict: str
    tone: str  # problem | partial | ok: the colour of the verdict
    facts: list[str] = field(default_factory=list)
    sections: list[Section] = field(default_factory=list)
    created: float | None = None
    find_rank: bool = True  # the rank finder (JavaScript) in the header


@cache
def _asset(name: str) -> str:
    return resources.files("ml_debug.page").joinpath(name).read_text(encoding="utf-8")


def _csp(script: str) -> str:
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    return ("default-src 'none'; style-src 'unsafe-inline'; img-src data:; "
            f"script-src 'sha256-{digest}'; base-uri 'none'; form-action 'none'")


def _section(s: Section) -> str:
    note = f' <span class="dim">{esc(s.note)}</span>' if s.note else ""
    return (f'<section id="{esc(s.id)}"><details{" open" if s.open else ""}>'
            f"<summary><h2>{esc(s.title)}</h2>{note}</summary>"
            f"<div>{s.body}</div></details></section>")


def render(page: Page) -> str:
    """The whole HTML document of `page`."""
    script = _asset("page.js")
    when = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(page.created or time.time()))
    facts = "".join(f"<span>{esc(f)}</span>" for f in [*page.facts, f"made by {GENERATOR} {page.command} at {when}"])
    finder = ('<div class="toolbar"><label>find rank <input id="find-rank" size="7" inputmode="numeric" '
              'placeholder="e.g. 3"></label><span id="find-count" class="dim"></span></div>'
              if page.find_rank else "")
    return "".join([
        "<!DOCTYPE html>\n<html lang=\"en\" class=\"nojs\"><head><meta charset=\"utf-8\">",
        f'<meta http-equiv="Content-Security-Policy" content="{_csp(script)}">',
        '<meta name="referrer" content="no-referrer">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{esc(page.title)}</title><style>{_asset('page.css')}</style></head><body>",
        f"<header><h1>{esc(page.title)}</h1>",
        f'<div class="verdict {esc(page.tone)}" id="verdict">{esc(page.verdict)}</div>',
        f'<div class="facts">{facts}</div>{finder}</header><main>',
        "".join(_section(s) for s in page.sections),
        f"</main><script>{script}</script></body></html>\n",
    ])
