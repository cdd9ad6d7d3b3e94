"""Control characters made visible in text meant for reading (a terminal, a .txt report).

A job controls many strings that mldebug shows: process and file names, stack frames, locals, log
lines, environment values, host names, Slurm fields. Printed raw, an escape sequence in one of them
(``ESC ] 0 ; title BEL``, ``ESC [ 31m``, the one-character CSI U+009B) drives the reader's terminal:
it sets the window title, recolours or hides text, and ``\\r`` or ``\\b`` make a line overwrite
itself. Here every such character is written as an escape that reads as what it is (``\\e``, ``\\r``,
``\\x9b``), so the reader sees the string and the terminal gets only printable characters.

JSON keeps the exact value: ``json.dumps`` already escapes control characters, so scripts get what
the job wrote. Only text for people goes through :func:`visible`.
"""

from __future__ import annotations

from functools import lru_cache

_NAMED = {"\a": "\\a", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\v": "\\v", "\f": "\\f", "\r": "\\r", "\x1b": "\\e"}

# C0, DEL, C1; the bidirectional overrides and isolates (they reorder what follows on the line, so a
# name can read as another: "Trojan Source"); lone surrogates, which stand for bytes that were not UTF-8
_CONTROLS = [*range(0x20), 0x7F, *range(0x80, 0xA0), 0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F),
             *range(0x2066, 0x206A), *range(0xD800, 0xE000)]


def _escape(code: int) -> str:
    char = chr(code)
    if char in _NAMED:
        return _NAMED[char]
    if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8 (surrogateescape): shown as that byte
        return f"\\x{code - 0xDC00:02x}"
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}"


_TABLE = {code: _escape(code) for code in _CONTROLS}


@lru_cache(maxsize=8)
def _table(keep: str) -> dict[int, str]:
    return {code: text for code, text in _TABLE.items() if chr(code) not in keep}


def visible(text: str, keep: str = "") -> str:
    """`text` with every control character written as a visible escape (``\\e``, ``\\r``, ``\\x9b``).

    `keep` names characters to leave as they are: ``"\\n"`` for a block of several lines, ``"\\t"``
    where tabs lay out columns. Printable text comes back unchanged (the same object)."""
    if text.isprintable() or not text:
        return text
    return text.translate(_table(keep) if keep else _TABLE)


def visible_bytes(data: bytes, keep: str = "") -> str:
    """Bytes from a job's file as readable text: UTF-8 where it is, every other byte as ``\\xNN``."""
    return visible(data.decode("utf-8", "surrogateescape"), keep)
