"""``import nicertrace`` for code written against the standalone NicerTrace script.

``from nicertrace import NicerTrace`` then works after ``pip install mldebug``; this module only
re-exports the public names of :mod:`ml_debug.nicertrace`, which is where the code and its docs
live.
"""

from __future__ import annotations

from ml_debug.nicertrace import *  # noqa: F403
from ml_debug.nicertrace import NicerTrace  # noqa: F401
