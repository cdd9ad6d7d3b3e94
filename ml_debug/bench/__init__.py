"""`mldebug allreduce-bench`: collective bandwidth with nccl-tests' definitions, sweeps and pairwise links.

The bandwidth maths (:mod:`ml_debug.bench.bandwidth`) is pure and torch-free.
"""
