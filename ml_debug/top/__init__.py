"""`mldebug top`: one live view of a whole job across nodes: GPUs, rank processes and progress.

The node samples come from the sampling service (:mod:`ml_debug.sampling`: an agent per node,
``mldebug top --agent``, streaming one JSON line per interval over one persistent connection); this
package keeps each node's last sample, decides which nodes still answer and what stands out
(:mod:`ml_debug.top.result`, :mod:`ml_debug.top.verdict`) and draws it (:mod:`ml_debug.top.render`).
This package imports nothing heavy at import time.
"""
