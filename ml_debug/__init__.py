"""mldebug: distributed debugging and cluster diagnostics for PyTorch training.

Importing the package is cheap: no torch, no rich. User code imports the
dependency-free helpers directly::

    from ml_debug.printflock import printflock as print
    from ml_debug.nicertrace import NicerTrace
"""

from __future__ import annotations

__version__ = "0.1.0"
