"""Every next step of catalogue.STEPS (for what no failure class names: a crash by its signal, an exit code alone, a
traceback cut short, a stop by the scheduler or a launcher) is the one a console gets. Consoles are the real ones in
tests/data; a line of a program that cannot run here is written as its source writes it, and the comment names it."""

from __future__ import annotations

from pathlib import Path

import pytest

from ml_debug.logs.catalogue import STEPS
from ml_debug.logs.triage import triage
from tests.conftest import REPO
from tests.unit.logs.test_catalogue import LINES

DATA = REPO / "tests" / "data"


def _agent(code: int) -> str:
    """torchrun's agent (torch 2.4+, elastic/multiprocessing/api.py) reporting its worker's exit code."""
    return (f"E0501 03:14:07.123000 140213 torch/distributed/elastic/multiprocessing/api.py:833] failed (exitcode: {code}) "
            "local_rank: 0 (pid: 4242) of binary: /usr/bin/python3")


def _slurm(why: str) -> str:
    """slurmstepd's line when it stops a step (src/slurmd/slurmstepd/req.c: "*** %s ON %s CANCELLED AT %s%s ***")."""
    return f"slurmstepd: error: *** STEP 8.0 ON node1 CANCELLED AT 2025-03-02T03:14:09{why} ***"


# Ray's re-raise of a worker's exception in the driver (python/ray/exceptions.py, RayTaskError.__str__), cut before the
# worker's own exception
RAY_CUT = ("Traceback (most recent call last):\n  File \"/job/train.py\", line 90, in <module>\n    trainer.fit()\n"
           "ray.exceptions.RayTaskError(DistBackendError): ray::_RayTrainWorker__execute.get_next() (pid=192, "
           "ip=10.0.0.19, actor_id=a3e4)\n  File \"/job/ray/train/_internal/worker_group.py\", line 33, in __execute\n")


# (a step's first kind, its pattern): (a file under tests/data, or the console's text), a piece of the step
CASES: dict[tuple[str, str], tuple[str, str]] = {
    ("signal", r"worker died \(Ray\)|ActorDiedError|actor died unexpectedly"):
        (LINES[("ray", "ray-worker-died")], "raylet.out"),
    ("signal", "SIGSEGV|Segmentation fault"): ("logs_corpus/torchrun-segv.log", "core file (mldebug core-bt)"),
    ("signal", r"\bSIGKILL\b|\bKilled\b"): ("logs_corpus/accelerate-killed.log", "dmesg -T"),
    ("signal", r"SIGABRT|\bAbort"): (_agent(-6), "terminate called after throwing"),
    ("signal", "SIGBUS|Bus error"): ("logs/catalogue/shell-bus-error.log", "--shm-size"),
    ("signal", "SIGILL|Illegal instruction"): (_agent(-4), "lscpu"),
    ("signal", "SIGFPE|Floating point exception"): ("logs/catalogue/shell-fpe.log", "division by zero"),
    # CPython Python/ceval.c (3.8-3.11): _Py_FatalErrorFunc(..., "Cannot recover from stack overflow.")
    ("signal", "Fatal Python error"): ("Fatal Python error: _Py_CheckRecursiveCall: Cannot recover from stack overflow.",
                                       "each thread's stack"),
    ("exit", "^pod "): (LINES[("kubectl", "pod-status")], "kubectl logs POD --previous"),
    # Kubeflow training-operator pkg/controller.v1/common/pod.go ("Pod: %v.%v exited with code %v")
    ("exit", r"\bexit code 137\b"): ("Pod: kubeflow.pytorch-simple-worker-0 exited with code 137", "128+9"),
    ("exit", ""): (_agent(1), "torchrun --log-dir DIR --redirects 3 --tee 3"),
    ("traceback", r"traceback \(cut short\)"):
        ('Traceback (most recent call last):\n  File "/job/train.py", line 12, in <module>\n    main()\n', "cut before"),
    ("traceback", r"RayTaskError\(\w+\): ray::"): (RAY_CUT, "worker-*.err"),
    ("launcher", r"worker failed \(torchrun\)"):
        ("torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n" + "=" * 40 + "\ntrain.py FAILED\n",
         "summary is cut short"),
    ("slurm", "time limit"): (_slurm(" DUE TO TIME LIMIT"), "sbatch --time"),
    ("slurm", "task failure"): (_slurm(" DUE TO TASK FAILURE"), "does not report stopped"),
    ("slurm", "preempt"): (_slurm(" DUE TO PREEMPTION"), "PREEMPTED"),
    ("slurm", "node fail"): (LINES[("srun", "srun-node-fail")], "sinfo -R"),
    ("slurm", "cancelled|stopped from outside"): ("logs_corpus/torchrun-stopped.log", "sacct -j ID"),
    ("launcher", "run-timeout"): ("logs/launch_timeout", "mldebug dump-stacks"),
    ("exception", r"^program not found\b"): ("logs/catalogue/execve.txt", "activate the job's environment"),
    ("comm", ""): ("logs/catalogue/gloo_recv.log", "the rank that failed first"),
}


def test_every_step_has_its_console() -> None:
    assert sorted(CASES) == sorted((step.kinds[0], step.pattern) for step in STEPS)


@pytest.mark.parametrize("key", sorted(CASES), ids=lambda k: f"{k[0]}:{k[1][:24]}")
def test_a_failure_no_class_names_gets_its_step(tmp_path: Path, key: tuple[str, str]) -> None:
    sample, piece = CASES[key]
    path = DATA / sample
    if len(sample) > 100 or not path.exists():
        path = tmp_path / "console.log"
        path.write_text(sample if sample.endswith("\n") else sample + "\n")
    v = triage([str(path)]).verdict
    assert v.status in ("failure", "secondary-only"), v.summary
    assert v.hint is not None and piece in v.hint, (v.summary, v.hint)
