"""``import printflock`` for code written against the standalone script of that name.

``from printflock import printflock as print`` then works after ``pip install mldebug``; this
module only re-exports :mod:`ml_debug.printflock`, which is where the code and its docs live.
"""

from __future__ import annotations

from ml_debug.printflock import *  # noqa: F403
from ml_debug.printflock import __all__, default_lock_path, printflock, rank_label  # noqa: F401
