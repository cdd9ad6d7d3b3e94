"""`mldebug top`: one live view of a whole job across nodes: GPUs, rank processes and progress.

An agent (``mldebug top --agent``, :mod:`ml_debug.top.agent`) samples each node and streams one
JSON line per interval over one persistent connection (:mod:`ml_debug.top.streams`); the client
keeps each node's last sample, decides which nodes still answer and what stands out
(:mod:`ml_debug.top.model`, :mod:`ml_debug.top.outliers`) and draws it (:mod:`ml_debug.top.view`).
This package imports nothing heavy at import time.
"""
