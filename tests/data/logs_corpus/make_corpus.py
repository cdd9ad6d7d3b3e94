"""Run real launchers on this machine and keep their consoles as the `mldebug logs` corpus.

    .venv/bin/pip install accelerate lightning deepspeed; apt-get install openmpi-bin pdsh
    source /tmp/mldebug-rig/slurm/env   # the test rig's Slurm (for srun)
    python tests/data/logs_corpus/make_corpus.py [NAME...]

Every job is worker.py (or lightning_job.py) with 2 to 4 gloo ranks; the rank that fails and how are in
CASES. A launcher that is missing is reported and skipped; the files already here are kept. The tests
(tests/unit/logs/test_launchers.py) read these files: no job runs in the test suite.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORKER = HERE / "worker.py"
PY = sys.executable
BIN = Path(PY).parent


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "PATH": f"{BIN}:{os.environ['PATH']}",
           **extra}
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
        if var not in extra:
            env.pop(var, None)
    return env


def _run(argv: list[str], out: Path, env: dict[str, str], timeout: float = 240) -> int:
    with open(out, "wb") as f:
        p = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, env=env, timeout=timeout, cwd=HERE)
    print(f"{out.name}: exit code {p.returncode}", flush=True)
    return p.returncode


def torchrun_two_agents() -> None:
    """Two torchrun agents (--nnodes 2, static rendezvous), 2 ranks each; rank 3 (agent 1, local rank 1)
    raises. Each agent's console is one node's view: [defaultN]: labels say local ranks only."""
    port = str(_port())
    env = _env(CORPUS_RANK="3", CORPUS_FAULT="raise")
    procs = []
    for node in (0, 1):
        argv = [PY, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node",
                "2", "--master-addr", "127.0.0.1", "--master-port", port, "--tee", "3", str(WORKER)]
        procs.append(threading.Thread(target=_run, args=(argv, HERE / f"torchrun-agent{node}.log", env)))
    for t in procs:
        t.start()
    for t in procs:
        t.join()


def torchrun_segv() -> None:
    """One torchrun agent, 3 ranks, rank 2 dies by SIGSEGV (no traceback: the agent's lines say it)."""
    _run([PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "3", str(WORKER)],
         HERE / "torchrun-segv.log", _env(CORPUS_RANK="2", CORPUS_FAULT="segv"))


def torchrun_every_rank() -> None:
    """torchrun, 4 ranks that all raise at the same step, its agent looking at them every 5 s (torch 1.x's default:
    the consoles users post): its summary lists every rank's exit in the same second, and its 'Root Cause' is its
    own pick among them (the lowest rank: it knows times to the second)."""
    _run([PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4", "--monitor-interval", "5", str(WORKER)],
         HERE / "torchrun-every-rank.log", _env(CORPUS_RANK="all", CORPUS_FAULT="raise"))


def torchrun_stopped() -> None:
    """torchrun stopped from outside (what a scheduler's time limit, preemption or scancel does): SIGTERM to its agent
    once its 2 ranks run; it stops them and exits."""
    out = HERE / "torchrun-stopped.log"
    with open(out, "wb") as f:
        p = subprocess.Popen([PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(WORKER)],
                             stdout=f, stderr=subprocess.STDOUT, env=_env(CORPUS_RANK="all", CORPUS_FAULT="sleep"),
                             cwd=HERE)
        deadline = time.monotonic() + 120
        while out.read_text().count("step 1 done") < 2 and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        p.send_signal(signal.SIGTERM)
        print(f"{out.name}: exit code {p.wait(timeout=120)}", flush=True)


def torchrun_oom() -> None:
    """torchrun without --tee: rank 1 raises torch.OutOfMemoryError with no rank prefix on its lines."""
    _run([PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(WORKER)],
         HERE / "torchrun-oom.log", _env(CORPUS_RANK="1", CORPUS_FAULT="oom"))


def torchrun_bus() -> None:
    """rank 1's DataLoader worker dies by SIGBUS (what a full /dev/shm does)."""
    _run([PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "--tee", "3", str(WORKER)],
         HERE / "torchrun-bus.log", _env(CORPUS_RANK="1", CORPUS_FAULT="bus"))


def deepspeed() -> None:
    """DeepSpeed's per-node launcher (deepspeed.launcher.launch, what `deepspeed` runs on each node), 3 ranks;
    rank 1 dies by SIGSEGV. Its 'exits with return code' line names a command line, not the failing rank."""
    world = base64.urlsafe_b64encode(json.dumps({"localhost": [0, 1, 2]}).encode()).decode()
    _run([PY, "-u", "-m", "deepspeed.launcher.launch", f"--world_info={world}", "--node_rank=0",
          "--master_addr=127.0.0.1", f"--master_port={_port()}", "--no_local_rank", str(WORKER)],
         HERE / "deepspeed.log", _env(CORPUS_RANK="1", CORPUS_FAULT="segv"))


def accelerate() -> None:
    """accelerate launch --multi_gpu --cpu, 2 processes; rank 1 raises."""
    _run([str(BIN / "accelerate"), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
          "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(_port()), str(WORKER)],
         HERE / "accelerate.log", _env(CORPUS_RANK="1", CORPUS_FAULT="raise"))


def accelerate_killed() -> None:
    """accelerate launch of one process (its simple_launcher), killed by SIGKILL after an INFO line: accelerate
    re-raises the exit as a CalledProcessError that 'died with <Signals.SIGKILL: 9>'."""
    _run([str(BIN / "accelerate"), "launch", "--num_processes", "1", "--cpu", "--num_machines", "1",
          "--mixed_precision", "no", "--dynamo_backend", "no", str(WORKER)],
         HERE / "accelerate-killed.log", _env(CORPUS_FAULT="kill"))


def lightning() -> None:
    """Lightning's own launcher (it starts the other rank as a subprocess), DDP on CPU; rank 1 raises."""
    _run([PY, str(HERE / "lightning_job.py")], HERE / "lightning.log", _env())


def spawn_raise() -> None:
    """torch.multiprocessing.spawn, 3 processes; process 2 raises: its traceback follows mp.spawn's own, after
    "-- Process 2 terminated with the following error:". No line carries a rank."""
    _run([PY, str(HERE / "spawn_job.py"), str(_port())], HERE / "spawn-raise.log",
         _env(CORPUS_RANK="2", CORPUS_FAULT="raise-alone"))


def spawn_peer() -> None:
    """torch.multiprocessing.spawn of 3 gloo ranks; rank 1 raises, but mp.spawn saw process 0 end first (its
    "Connection closed by peer"): mp.spawn passes on that error only, and rank 1's is not in the console."""
    _run([PY, str(HERE / "spawn_job.py"), str(_port())], HERE / "spawn-peer.log", _env(CORPUS_RANK="1", CORPUS_FAULT="raise"))


def spawn_segv() -> None:
    """torch.multiprocessing.spawn, 3 processes; process 2 dies by SIGSEGV: only mp.spawn's traceback says so."""
    _run([PY, str(HERE / "spawn_job.py"), str(_port())], HERE / "spawn-segv.log",
         _env(CORPUS_RANK="2", CORPUS_FAULT="segv"))


def mpirun() -> None:
    """Open MPI's mpirun --tag-output, 3 ranks; rank 2 raises."""
    if not shutil.which("mpirun"):
        print("mpirun: not installed (apt-get install openmpi-bin)")
        return
    _run(["mpirun", "--allow-run-as-root", "--oversubscribe", "--tag-output", "-np", "3",
          "-x", "MASTER_ADDR=127.0.0.1", "-x", f"MASTER_PORT={_port()}", "-x", "CORPUS_RANK=2", "-x", "OMP_NUM_THREADS=1",
          "-x", "PYTHONUNBUFFERED=1", PY, str(WORKER)], HERE / "mpirun.log", _env())


def pdsh() -> None:
    """pdsh -R exec (its own rcmd module, no ssh) running one worker per 'node' n1, n2 with srun-less ranks:
    each line prefixed 'n1: '; n2's rank 1 raises."""
    if not shutil.which("pdsh"):
        print("pdsh: not installed (apt-get install pdsh)")
        return
    port = str(_port())
    # pdsh's exec module runs the command with %h replaced by the host name; the rank is the host's index
    cmd = ("env RANK=$(( ${0#n} - 1 )) WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + port +
           f" CORPUS_RANK=1 OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1 {PY} {WORKER}")
    _run(["pdsh", "-R", "exec", "-w", "n[1-2]", "bash", "-c", cmd, "%h"], HERE / "pdsh.log", _env())


def srun(only: str | None = None) -> None:
    """The rig's Slurm: srun --label and plain srun, 2 nodes x 2 tasks; task 2 raises. Also srun --label
    over one torchrun agent per node (task = agent, not rank); rank 3 raises."""
    if not shutil.which("sbatch") or "SLURM_CONF" not in os.environ:
        print("srun: no Slurm (source /tmp/mldebug-rig/slurm/env)")
        return
    addr = "$(ip -4 -br addr show eth0 | awk '{print $3}' | cut -d/ -f1)"
    common = (f"export OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1 GLOO_SOCKET_IFNAME=eth0 MASTER_ADDR={addr} "
              f"MASTER_PORT={_port()} CORPUS_RANK=2; ")
    jobs = {
        "srun-label.log": common + f"srun --label {PY} {WORKER}",
        "srun-nolabel.log": common + f"srun {PY} {WORKER}",
        "srun-torchrun.log": common.replace("CORPUS_RANK=2", "CORPUS_RANK=3") +
        # static rendezvous: the rig's node names do not resolve (c10d's would look them up)
        f"srun --label bash -c '{PY} -m torch.distributed.run --nnodes 2 --nproc-per-node 2 "
        f"--node-rank $SLURM_NODEID --master-addr $MASTER_ADDR --master-port $MASTER_PORT {WORKER}'",
    }
    for name, script in jobs.items():
        if only and name != only:
            continue
        out = HERE / name
        per_node = "1" if "torchrun" in name else "2"  # one torchrun agent per node
        subprocess.run(["sbatch", "--wait", "-N", "2", f"--ntasks-per-node={per_node}", "-w", "node1,node2",
                        "--time=00:03:00",
                        f"--output={out}", f"--chdir={HERE}", "--wrap", script], env=_env(), timeout=300,
                       capture_output=True)
        print(f"{name}: written", flush=True)


def srun_torchrun() -> None:
    """Only the srun --label job over torchrun agents."""
    srun("srun-torchrun.log")


CASES = {f.__name__: f for f in (torchrun_two_agents, torchrun_segv, torchrun_every_rank, torchrun_stopped,
                                 torchrun_oom, torchrun_bus, spawn_raise, spawn_peer, spawn_segv,
                                 deepspeed, accelerate, accelerate_killed, lightning, mpirun, pdsh, srun, srun_torchrun)}

if __name__ == "__main__":
    for name in sys.argv[1:] or list(CASES):
        CASES[name]()
