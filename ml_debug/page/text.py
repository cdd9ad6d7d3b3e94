"""The one place where text from a job becomes HTML.

Every string a job controls (a file or function name, a host name, a log line, a Slurm field) is put on
the page through :func:`esc` (element text and attribute values) or inside :func:`data_script` (JSON for
the page's script). A job's ``<script>`` in a file name is then shown as text and never runs; control
characters are shown as ``\\e``, ``\\r``, ``\\x9b`` as on a terminal (:func:`ml_debug.core.visible.visible`).
"""

from __future__ import annotations

import html
import json
from typing import Any

from ml_debug.core.visible import visible


def esc(value: object, keep: str = "") -> str:
    """`value` as text safe inside an element or a quoted attribute (``&<>"'`` escaped, controls visible)."""
    return html.escape(visible(str(value), keep), quote=True)


def data_script(element_id: str, value: Any) -> str:
    """`value` as JSON in a ``<script type="application/json">`` block the page's script reads.

    ``<``, ``>`` and ``&`` are written as ``\\u003c``... so no string can close the block
    (``</script>``) or open a comment; JSON.parse gives back the exact characters."""
    text = json.dumps(value, separators=(",", ":"), allow_nan=False, default=str)
    text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    text = text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
    return f'<script type="application/json" id="{esc(element_id)}">{text}</script>'
