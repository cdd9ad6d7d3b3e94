"""Run things on many nodes: targets (hostfiles, hostlists, Slurm jobs), transports (local,
ssh with paramiko, srun inside a job) and one fan-out runner with per-node timeouts.

Import the submodules directly (``ml_debug.remote.runner``, ``.targets``, ``.hostlist``); this
package imports nothing heavy (paramiko loads only when the ssh transport runs).
"""
