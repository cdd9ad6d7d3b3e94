"""Node sampling, a service that top, watch and any later consumer (a metrics exporter, a Slurm
health hook) share.

- :mod:`~ml_debug.sampling.sample`: the node sample, typed (:class:`NodeSample`), the one thing that
  crosses the network from every node's agent; its wire format is ``mldebug.top.sample`` version 1
  (schema in ml_debug/schemas/top-sample.json).
- :mod:`~ml_debug.sampling.sampler` (with :mod:`procstat`, :mod:`gpus`, :mod:`progress`): sample
  this node: CPU and memory from /proc, GPUs through the NVML gateway, the job's ranks as dump-stacks
  finds them, progress files.
- :mod:`~ml_debug.sampling.agent`: ``mldebug top --agent``, one sample per tick as a JSON line.
- :mod:`~ml_debug.sampling.streams`: one persistent agent stream per node (ssh, ``srun --overlap``,
  or here), read by one thread; the agent starts the way ``remote/`` starts every command.
- :mod:`~ml_debug.sampling.options`: :class:`SamplerOptions` and the ``--progress-file`` parser.

Nothing heavy is imported at import time.
"""
