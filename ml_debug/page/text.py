"""The one place where text from a job becomes HTML.

Every string a job controls (a file or function name, a host name, a log line, a Slurm field) is put on
the page through :func:`esc` (element text and attribute values; the page holds no job string anywhere
else, its script reads only what the elements say). A job's ``<script>`` in a file name is then shown as text and never runs; control
characters are shown as ``\\e``, ``\\r``, ``\\x9b`` as on a terminal (:func:`ml_debug.core.visible.visible`).
"""

from __future__ import annotations

import html

from ml_debug.core.visible import visible


def esc(value: object, keep: str = "") -> str:
    """`value` as text safe inside an element or a quoted attribute (``&<>"'`` escaped, controls visible)."""
    return html.escape(visible(str(value), keep), quote=True)

