"""Job logs: which rank failed first, and why (`mldebug logs`).

The path of a log: ``sources.py`` (PATH arguments into sources, each with its shape and what that says of
its rank and node) -> ``readers.py`` (here, or by one reader process per CPU for large logs, their
collectors taken in in source order) -> ``scan.py`` (one streaming pass; only lines that pass
``engine.py``'s prefilter, every needle in one Hyperscan pass, reach Python code) -> ``events.py``'s
``Collector`` (``labels.py``: who wrote a line, and when; ``actions.py``: one line; ``blocks.py``: tracebacks
and torchrun's summary, kept whole; ``text.py``: a failure text's class and short form; ``nccl.py``: what
``NCCL_DEBUG=INFO`` says). ``catalogue.py`` is the data: what each launcher prints, each failure class.
Each event is primary (a cause) or secondary (a consequence of a peer). Then ``accounting.py`` (who is who;
the launchers' accounting gives unlabelled failures their rank, issue 38), ``verdict.py`` (duplicates
merged, the first failure named, tracebacks collapsed with their rank sets, the timeline), ``triage.py``
(the library call) and ``render.py`` (the human view).
"""
