"""`mldebug logs` on 1 GB of job logs with the content real jobs write, beside one `grep -c -i -E` pass.

    python benchmarks/run.py logs
    python benchmarks/bench_logs.py [--ranks 256] [--mb-per-rank 4] [--mix nccl] [--readers 1]

The logs are what a job of 256 ranks leaves when rank 37 hits a CUDA error: per-rank files
(``node004/rank037.log``), each starting with its NCCL_DEBUG=INFO init lines, then the lines of one of the
mixes below, then the end: rank 37's CUDA error traceback, and every other rank's "Connection reset by
peer" (a few: the NCCL watchdog timeout) a second later. The mixes (each interleaved with a trainer's
logging lines: time stamps and numbers):

- ``logging``: those lines alone;
- ``tqdm``: progress bars as they land in a file (``|####5     |`` with rates, 100 ``\r`` updates a line);
- ``nccl``: a communicator made every step: NCCL INFO ``comm``, ``Channel``, ring and tree lines;
- ``warnings``: long library UserWarnings and FutureWarnings with their source lines;
- ``tracebacks``: a data loader's handled errors, logged at WARNING with their traceback of library frames, every
  other message naming its shard (a repeat whose message is new).

``--wrap cri`` or ``--wrap docker`` writes each file as a container runtime keeps it on a Kubernetes or Docker node
(container.py: every line a record with its time, a line over 16 KiB in parts); grep reads the same wrapped files.

``--compress gz`` (or ``xz``, ``bz2``, ``zst``, ``lz4``) writes each file compressed at its tool's default level, as
logrotate leaves old logs (``rank037.log.gz``); the floor is then the tool decompressing every file into one
`grep -c -i -E` (``gzip -dc FILES | grep ...``).

They are written to a temporary directory, which is deleted at the end. Printed per mix: the wall time
of the triage with the default readers (as a user's `mldebug logs` reads: one reader process per CPU for
logs this large), its CPU time (readers included) and peak RSS, beside one `grep -c -i -E` pass over the
same files (a floor: grep reads every byte once and understands nothing); the ratio is wall / wall, and
the CPU ratio (less sensitive to a machine that others share) is given too. The benchmark fails if the
triage names the wrong rank.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from benchmarks.common import Result  # noqa: E402

# --compress: each suffix's Python module (its compress() at the default level writes the files), and the command
# that decompresses files to its output
COMPRESSORS = {
    "gz": ("gzip", ["gzip", "-dc"]),
    "xz": ("lzma", ["xz", "-dc"]),
    "bz2": ("bz2", ["bzip2", "-dc"]),
    "zst": ("zstandard", ["zstd", "-dcq"]),
    "lz4": ("lz4.frame", ["lz4", "-dcqm"]),
}

RANKS = 256
PER_NODE = 8
BYTES_PER_RANK = 4 * 2**20
CULPRIT = 37
T0 = "2025-03-02 01:00:00"  # the training lines' first time stamp; the failure is at 03:14:07


def _stamp(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) + f",{int(t * 1000) % 1000:03d}"


def _logging(step: int, t: float) -> str:
    """A trainer's logging line: a time stamp, a level and numbers."""
    stamp = _stamp(t)
    line = (f"{stamp} [INFO] trainer: step {step} | loss {2.0 + 1.0 / (1 + step / 500):.4f} | lr 3.00e-04 | "
            f"grad_norm {0.5 + (step % 17) / 40:.3f} | {41000 + step % 977:,} tok/s | mfu 41.{step % 10}% | "
            f"mem 61,{step % 1000:03d} MiB\n")
    if step % 500 == 250:
        line += f"{stamp} [INFO] data: epoch {step // 5000} shard {step // 250:04d} opened (3.2 GB, 1,048,576 samples)\n"
    return line


def _tqdm(step: int, t: float) -> str:
    """One tqdm bar as it lands in a file: 100 updates joined by carriage returns, then its newline."""
    total = 100
    parts = []
    for i in range(0, total + 1):
        filled = i * 10 // total
        frac = (i * 10 % total) * 10 // total
        bar = "#" * filled + (str(frac) if filled < 10 else "") + " " * (9 - filled)
        rate = 5.0 + (step * 7 + i) % 300 / 100
        parts.append(f"Epoch {step}: {i * 100 // total:3d}%|{bar[:10]:<10}| {i}/{total} "
                     f"[00:{i // 6:02d}<00:{(total - i) // 6:02d}, {rate:.2f}it/s, loss={2.0 + 1 / (1 + i):.3f}, "
                     f"v_num=0]")
    return "\r".join(parts) + "\n" + _logging(step, t)


def _nccl_lines(step: int, t: float) -> str:
    """A communicator being made (a new process group, a sub-communicator): NCCL INFO channel and ring lines."""
    host, pid = f"node{step % 64:03d}", 40000 + step % 977
    p = f"{host}:{pid}:{pid + 67} [{step % 8}] NCCL INFO"
    out = [f"{p} comm 0x55d1c2a{step:05x} rank {step % 512} nRanks 512 nNodes 64 localRanks 8 localRank {step % 8} "
           "MNNVL 0"]
    out += [f"{p} Channel {ch:02d}/32 :    0   1   2   3   4   5   6   7   8   9  10  11  12  13  14  15"
            for ch in range(4)]
    out += [f"{p} Channel {ch:02d}/0 : {step % 512}[{step % 8}] -> {(step + 1) % 512}[{(step + 1) % 8}] via P2P/IPC/read"
            for ch in range(8)]
    out += [f"{p} Trees [0] {(step + 1) % 512}/-1/-1->{step % 512}->{(step - 1) % 512} [1] -1/-1/-1->{step % 512}->"
            f"{(step + 1) % 512}", f"{p} Connected all rings", f"{p} Connected all trees",
            f"{p} threadThresholds 8/8/64 | 4096/8/64 | 512 | 512", f"{p} 32 coll channels, 32 nvls channels, 32 p2p "
            "channels, 32 p2p channels per peer"]
    return "\n".join(out) + "\n" + _logging(step, t)


def _warnings(step: int, t: float) -> str:
    """Library warnings as Python's warnings module prints them: the file, the message, the source line."""
    return ("/opt/venv/lib/python3.11/site-packages/torch/utils/checkpoint.py:91: UserWarning: None of the inputs "
            "have requires_grad=True. Gradients will be None\n  warnings.warn(\n"
            "/opt/venv/lib/python3.11/site-packages/torch/distributed/fsdp/_state_dict_utils.py:773: FutureWarning: "
            "FSDP.state_dict_type() and FSDP.set_state_dict_type() are being deprecated. Please use APIs, "
            "get_state_dict() and set_state_dict(), which can support different parallelisms, FSDP1, FSDP2, DDP. "
            "API doc: https://pytorch.org/docs/stable/distributed.checkpoint.html#torch.distributed.checkpoint."
            "state_dict.get_state_dict .Tutorial: https://pytorch.org/tutorials/recipes/distributed_checkpoint_"
            "recipe.html .\n  warnings.warn(\n"
            "/opt/venv/lib/python3.11/site-packages/transformers/tokenization_utils_base.py:1601: UserWarning: "
            "`clean_up_tokenization_spaces` was not set. It will be set to `True` by default. This behavior will be "
            "depracted in transformers v4.45, and will be then set to `False` by default. For more details check "
            "this issue: https://github.com/huggingface/transformers/issues/31884\n  warnings.warn(\n"
            + _logging(step, t))


def _tracebacks(step: int, t: float) -> str:
    """A handled error logged with its traceback (a data loader's retry), library frames, then training goes on.
    Every other one's message names the shard (its bytes differ from the last one's), as an I/O error's does."""
    stamp = _stamp(t)
    error = ("TimeoutError: The read operation timed out" if step % 2 else
             f"OSError: [Errno 5] Input/output error: '/data/train/shard_{step:05d}.tar'")
    return (f"{stamp} [WARNING] data: fetching shard {step:05d} failed, retrying (1/5)\n"
            "Traceback (most recent call last):\n"
            '  File "/opt/venv/lib/python3.11/site-packages/urllib3/connectionpool.py", line 537, in _make_request\n'
            "    response = conn.getresponse()\n"
            "               ^^^^^^^^^^^^^^^^^^\n"
            '  File "/opt/venv/lib/python3.11/site-packages/urllib3/connection.py", line 466, in getresponse\n'
            "    httplib_response = super().getresponse()\n"
            '  File "/usr/lib/python3.11/http/client.py", line 1390, in getresponse\n'
            "    response.begin()\n"
            '  File "/usr/lib/python3.11/socket.py", line 706, in readinto\n'
            "    return self._sock.recv_into(b)\n"
            f"{error}\n\n"
            + "".join(_logging(step * 40 + i, t + i * 0.55) for i in range(40)))


MIXES = {"logging": _logging, "tqdm": _tqdm, "nccl": _nccl_lines, "warnings": _warnings, "tracebacks": _tracebacks}
"""The line mixes real jobs write; each mix is interleaved with the trainer's logging lines."""


def _body(target: int, mix: str = "logging") -> bytes:
    """The lines every rank writes before the end (the same on every rank, as in a synchronous job)."""
    write = MIXES[mix]
    lines = []
    size = 0
    step = 0
    base = time.mktime(time.strptime(T0, "%Y-%m-%d %H:%M:%S"))
    while size < target:
        line = write(step, base + step * 0.55)
        lines.append(line)
        size += len(line)
        step += 1
    return "".join(lines).encode()


def _nccl_init(rank: int, ranks: int = RANKS) -> str:
    node, local = divmod(rank, PER_NODE)
    host, pid = f"node{node:03d}", 40000 + rank
    p = f"{host}:{pid}:{pid}"
    q = f"{host}:{pid}:{pid + 67}"
    out = [f"{p} [{local}] NCCL INFO Bootstrap : Using ib0:10.1.{node}.1<0>",
           f"{p} [{local}] NCCL INFO cudaDriverVersion 12040"]
    if rank == 0:
        out.append("NCCL version 2.21.5+cuda12.4")
    out += [f"{q} [{local}] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB [2]mlx5_2:1/IB [3]mlx5_3:1/IB "
            f"[RO]; OOB ib0:10.1.{node}.1<0>",
            f"{q} [{local}] NCCL INFO Using network IB",
            f"{q} [{local}] NCCL INFO comm 0x55d1c2a{rank:05x} rank {rank} nRanks {ranks} nNodes {ranks // PER_NODE} "
            f"localRanks {PER_NODE} localRank {local} MNNVL 0",
            f"{q} [{local}] NCCL INFO Trees [0] {(rank + 1) % ranks}/-1/-1->{rank}->{(rank - 1) % ranks} "
            f"[1] {(rank + 1) % ranks}/-1/-1->{rank}->{(rank - 1) % ranks}"]
    nxt = (rank + 1) % ranks
    for ch in range(16):
        if nxt // PER_NODE == node:
            out.append(f"{q} [{local}] NCCL INFO Channel {ch:02d}/0 : {rank}[{local}] -> {nxt}[{nxt % PER_NODE}] "
                       "via P2P/IPC/read")
        else:
            out.append(f"{q} [{local}] NCCL INFO Channel {ch:02d}/0 : {rank}[{local}] -> {nxt}[{nxt % PER_NODE}] "
                       f"[send] via NET/IB/{ch % 4}")
    out += [f"{q} [{local}] NCCL INFO Connected all rings", f"{q} [{local}] NCCL INFO Connected all trees",
            f"{q} [{local}] NCCL INFO comm 0x55d1c2a{rank:05x} rank {rank} nranks {ranks} cudaDev {local} "
            f"busId {local + 1}8000 - Init COMPLETE"]
    return "\n".join(out) + "\n"


def _end(rank: int, culprit: int = CULPRIT) -> str:
    if rank == culprit:
        return (f"[rank{rank}]:[E0302 03:14:07.123456 ProcessGroupNCCL.cpp:1595] [PG 0 Rank {rank}] Process group "
                "watchdog thread terminated with exception: CUDA error: an illegal memory access was encountered\n"
                f"[rank{rank}]: Traceback (most recent call last):\n"
                f"[rank{rank}]:   File \"/work/train.py\", line 212, in <module>\n"
                f"[rank{rank}]:     loss = model(batch).sum()\n"
                f"[rank{rank}]:   File \"/work/model.py\", line 88, in forward\n"
                f"[rank{rank}]:     return self.attn(x)\n"
                f"[rank{rank}]: RuntimeError: CUDA error: an illegal memory access was encountered\n"
                "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace "
                "below might be incorrect.\n")
    if rank % 97 == 5:
        return (f"[rank{rank}]:[E0302 03:24:07.{rank:06d} ProcessGroupNCCL.cpp:616] [Rank {rank}] Watchdog caught "
                "collective operation timeout: WorkNCCL(SeqNum=98765, OpType=ALLREDUCE, NumelIn=466119168, "
                "NumelOut=466119168, Timeout(ms)=600000) ran for 600042 milliseconds before timing out.\n")
    return (f"2025-03-02 03:14:08,{rank:03d} [ERROR] trainer: step 9876 failed\n"
            f"[rank{rank}]: Traceback (most recent call last):\n"
            f"[rank{rank}]:   File \"/work/train.py\", line 214, in <module>\n"
            f"[rank{rank}]:     optimizer.step()\n"
            f"[rank{rank}]:   File \"/opt/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py\", "
            "line 83, in wrapper\n"
            f"[rank{rank}]: torch.distributed.DistNetworkError: recvValue failed on SocketImpl(fd=42, "
            f"addr=[node{rank // PER_NODE:03d}]:{50000 + rank}, remote=[node000]:29500): Connection reset by peer\n")


RUNTIME_SPLIT = 16 << 10  # containerd and Docker split a line into records of at most this many bytes


def _wrapped(data: bytes, wrap: str) -> bytes:
    """``data`` as the container runtime ``wrap`` (cri, docker) writes it: a record per line (or part of one)."""
    out = []
    for n, line in enumerate(data.decode().split("\n")[:-1]):
        stamp = f"2025-03-02T01:{n // 60 % 60:02d}:{n % 60:02d}.{n % 10**9:09d}Z"
        parts = [line[k:k + RUNTIME_SPLIT] for k in range(0, len(line), RUNTIME_SPLIT)] or [""]
        for k, part in enumerate(parts):
            last = k == len(parts) - 1
            out.append(f"{stamp} stderr {'F' if last else 'P'} {part}" if wrap == "cri" else
                       json.dumps({"log": part + "\n" * last, "stream": "stderr", "time": stamp}, separators=(",", ":")))
    return ("\n".join(out) + "\n").encode()


def generate(root: Path, ranks: int = RANKS, bytes_per_rank: int = BYTES_PER_RANK, mix: str = "logging",
             wrap: str = "none", compress: str = "none") -> int:
    """Write the logs under ``root`` (as the container runtime ``wrap`` keeps them, compressed by ``compress``); the
    number of bytes of text written (before compression)."""
    body = _body(bytes_per_rank - 6000, mix)
    total = 0
    for rank in range(ranks):
        d = root / f"node{rank // PER_NODE:03d}"
        d.mkdir(parents=True, exist_ok=True)
        data = _nccl_init(rank, ranks).encode() + body + _end(rank, CULPRIT % ranks).encode()
        if wrap != "none":
            data = _wrapped(data, wrap)
        if compress == "none":
            (d / f"rank{rank:03d}.log").write_bytes(data)
        else:
            (d / f"rank{rank:03d}.log.{compress}").write_bytes(
                importlib.import_module(COMPRESSORS[compress][0]).compress(data))
        total += len(data)
    return total


def _triage(root: Path, jobs: int | None) -> tuple[float, float, int, dict[str, object]]:
    """(wall s, CPU s of this process and its readers, peak RSS bytes, verdict) of the library's triage of
    ``root`` (``jobs``: reader processes, None for the default) in a child process."""
    code = ("import json, resource, sys, time\n"
            "from ml_debug.logs.triage import triage\n"
            "r0, k0 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)\n"
            "t0 = time.perf_counter()\n"
            "report = triage([sys.argv[1]], jobs=None if sys.argv[2] == 'default' else int(sys.argv[2]))\n"
            "wall = time.perf_counter() - t0\n"
            "me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)\n"
            "from ml_debug.core.output import to_jsonable\n"
            "v = to_jsonable(report.verdict)\n"
            "cpu = sum(r.ru_utime + r.ru_stime for r in (me, kids)) - sum(r.ru_utime + r.ru_stime for r in (r0, k0))\n"
            "print(json.dumps({'wall': wall, 'cpu': cpu,"
            " 'rss': max(me.ru_maxrss, kids.ru_maxrss) * 1024, 'verdict': v}))\n")
    p = subprocess.run([sys.executable, "-c", code, str(root), "default" if jobs is None else str(jobs)],
                       capture_output=True, text=True, timeout=3600, env={**os.environ, "PYTHONPATH": str(HERE.parent)})
    if p.returncode != 0:
        raise RuntimeError(f"triage failed: {p.stderr[-2000:]}")
    out = json.loads(p.stdout.strip().splitlines()[-1])
    return out["wall"], out["cpu"], out["rss"], out["verdict"]


GREP = "traceback|error|nccl|cuda|sig|killed|connection|exit|fail"


def _grep(root: Path, compress: str = "none") -> tuple[float, float]:
    """(wall s, CPU s) of one `grep -c -i -E` pass over the files (decompressed by their tool into it), its output
    into a file (GNU grep stops at the first match when its output is /dev/null, and a pipe read by Python adds its
    own time); the best of two (the first may read from disk)."""
    files = sorted(str(p) for p in root.rglob("*.log" if compress == "none" else f"*.log.{compress}"))
    grep = ["grep", "-c", "-i", "-E", GREP]
    best, best_cpu = float("inf"), float("inf")
    with tempfile.TemporaryFile() as out:
        for _ in range(2):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            if compress == "none":
                subprocess.run([*grep, *files], stdout=out, timeout=600, check=False)
            else:
                with subprocess.Popen([*COMPRESSORS[compress][1], *files], stdout=subprocess.PIPE) as dec:
                    subprocess.run(grep, stdin=dec.stdout, stdout=out, timeout=600, check=False)
                    assert dec.stdout is not None
                    dec.stdout.close()
                if dec.returncode != 0:
                    raise RuntimeError(f"{' '.join(COMPRESSORS[compress][1])} failed (exit {dec.returncode})")
            wall = time.perf_counter() - t0
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
            best, best_cpu = min(best, wall), min(best_cpu, cpu)
    return best, best_cpu


def measure(ranks: int = RANKS, bytes_per_rank: int = BYTES_PER_RANK, mixes: list[str] | None = None,
            jobs: int | None = None, wrap: str = "none", compress: str = "none") -> list[Result]:
    tool = COMPRESSORS[compress][1][0] if compress != "none" else None
    if tool is not None and shutil.which(tool) is None:  # the Python modules are mldebug's own dependencies
        raise SystemExit(f"bench_logs: --compress {compress} needs the command {tool} (apt-get install {tool})")
    results: list[Result] = []
    failed: list[str] = []
    for mix in mixes or list(MIXES):
        tmp = Path(tempfile.mkdtemp(prefix=f"bench-logs-{mix}-"))
        try:
            t0 = time.perf_counter()
            total = generate(tmp, ranks, bytes_per_rank, mix, wrap, compress)
            if wrap != "none":
                mix = f"{mix} as {wrap} records"
            if compress != "none":
                mix = f"{mix}, .{compress}"
            print(f"# logs {mix}: generated {total / 1e9:.2f} GB in {ranks} files in {time.perf_counter() - t0:.1f} s",
                  file=sys.stderr)
            grep, grep_cpu = _grep(tmp, compress)
            wall, cpu, rss, verdict = _triage(tmp, jobs)
            primary = verdict.get("primary") or {}
            who = (primary.get("who") or {}) if isinstance(primary, dict) else {}
            wrong = who.get("rank") != CULPRIT % ranks
            readers = "default readers" if jobs is None else f"--readers {jobs}"
            floor = "grep -c -i -E" if compress == "none" else f"{' '.join(COMPRESSORS[compress][1])} | grep -c -i -E"
            detail = (f"{total / 1e9:.2f} GB uncompressed, {ranks} files, {readers}: {wall:.2f} s wall, {cpu:.1f} s CPU, peak RSS "
                      f"{rss / 2**20:.0f} MiB ({total / wall / 1e6:.0f} MB/s); {floor}: {grep:.2f} s wall, "
                      f"{grep_cpu:.2f} s CPU; CPU ratio {cpu / max(grep_cpu, 1e-3):.1f}")
            if wrong:
                detail = f"WRONG RANK ({verdict.get('summary')}); {detail}"
                failed.append(mix)
            name = "one grep pass" if compress == "none" else f"{COMPRESSORS[compress][1][0]} | grep"
            results.append(Result(f"logs {mix}: triage / {name}", wall / grep, detail))
            print(results[-1].line(), file=sys.stderr, flush=True)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    if failed:
        raise RuntimeError(f"the triage named the wrong rank in the mixes {', '.join(failed)}")
    return results


def run() -> list[Result]:
    return measure()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=RANKS)
    ap.add_argument("--mb-per-rank", type=float, default=BYTES_PER_RANK / 2**20)
    ap.add_argument("--mix", action="append", choices=sorted(MIXES), help="a line mix (repeat; default: all)")
    ap.add_argument("--readers", dest="jobs", type=int, default=None, help="reader processes (default: mldebug logs' own choice)")
    ap.add_argument("--wrap", choices=["none", "cri", "docker"], default="none",
                    help="write the files as a container runtime keeps them (default: the job's own text)")
    ap.add_argument("--compress", choices=["none", *COMPRESSORS], default="none",
                    help="write each file compressed, as logrotate leaves old logs (default: plain)")
    args = ap.parse_args()
    for r in measure(args.ranks, int(args.mb_per_rank * 2**20), args.mix, args.jobs, args.wrap, args.compress):
        print(r.line(), flush=True)
