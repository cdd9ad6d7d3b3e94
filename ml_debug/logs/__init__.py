"""Job logs: which rank failed first, and why (`mldebug logs`).

- ``sources.py``: PATH arguments into log sources (files, directories, globs, stdin, gzip), each with
  its shape (torchelastic ``--log-dir`` tree, error.json, per-rank file, mldebug train metrics, a
  console with per-line labels) and what the shape says about its rank and node.
- ``labels.py``: the per-line labels launchers add (``srun --label``, torchrun ``--tee``/``--role``,
  torch's own ``[rankN]:``) and the time stamps log lines carry.
- ``catalogue.py``: what each launcher prints and what it means (its marks, label prefixes, failure lines
  and their actions), and each class of failure text (pattern, primary or secondary, next step): data.
- ``engine.py``: the catalogue compiled and applied; the prefilter (every needle, one Hyperscan pass).
- ``scan.py``: one streaming pass per source; only lines that pass the prefilter reach Python code.
- ``readers.py``: every source read into one collector, here or by reader processes (one per CPU for
  large logs), their collectors taken in in source order.
- ``events.py``: the ``Collector``, fed each source's lines; ``actions.py`` reads one line (the catalogue's
  launcher lines, exception and failure lines), ``blocks.py`` tracebacks and torchrun's failure summary
  (kept whole), ``text.py`` a failure text's class and short form. Each event is classed primary (a
  cause) or secondary (a consequence of a peer).
- ``accounting.py``: who is who, from what the lines said; the launchers' accounting gives unlabelled
  failures their rank (issue 38's rules).
- ``nccl.py``: what ``NCCL_DEBUG=INFO`` lines say about versions, transports, rings and trees, and the
  classic slow-path causes.
- ``verdict.py``: duplicates merged, the first failure named, tracebacks collapsed
  with their rank sets, the timeline.
- ``render.py``: the human view.
"""
