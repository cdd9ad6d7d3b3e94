"""`mldebug watch`: notice that a running job hangs or crawls, and hand over the diagnosis.

- :mod:`ml_debug.watch.options`: the command's options (cheap to import);
- :mod:`ml_debug.watch.verdict`: the per-rank progress model. It takes plain samples (each node's
  rank processes, GPUs and progress files, as ``mldebug top``'s agent streams them, and low-rate
  stack observations) and decides which rank is ``stalled``, which is a ``straggler``, and which
  node stopped answering;
- :mod:`ml_debug.watch.bundle`: the incident bundle on disk (every part written as it arrives)
  and its summary, which leads with one sentence: who, where, since when, what to run next.

Detection only: collecting the bundle's evidence (dump-stacks, health, env) is done by the CLI
layer, which may call other features. Nothing heavy is imported at import time.
"""
