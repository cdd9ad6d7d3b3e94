"""The commands that compose features: one layer above them, the only code that may use several.

- :mod:`~ml_debug.compose.check`: `mldebug check`, the whole-node checkup: it runs the other commands
  as subprocesses with ``--json`` and a timeout, and judges their results.
- :mod:`~ml_debug.compose.watch_loop`: `mldebug watch` running: the sources (one node sampler per
  node, from :mod:`ml_debug.sampling`), the stack rounds in a thread, the loop and its exits.
- :mod:`~ml_debug.compose.incident`: the :class:`IncidentCollector` that fills an incident's bundle
  from dump-stacks, health and env, each part under a time limit.

What watch decides and the bundle's format are :mod:`ml_debug.watch`'s (pure, no other feature).
"""
