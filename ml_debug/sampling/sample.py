"""The node sample: what every node's agent streams, typed.

One JSON line per interval (``mldebug.top.sample``, wire version :data:`SAMPLE_VERSION`, schema in
ml_debug/schemas/top-sample.json, pinned by tests/golden/top-sample.json). :meth:`NodeSample.to_json`
writes it, :meth:`NodeSample.from_json` reads it back: a line of another wire version, or one whose
fields the readers rely on are missing or of the wrong type (another mldebug on a node, a stray JSON
line), is refused with a :class:`SampleError` that says why, never half read.

Values NVML or /proc cannot give are None ("no value"), so a CPU-only node and a GPU that lacks a
counter look the same to every reader.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from operator import contains, itemgetter
from typing import Any

SAMPLE_SCHEMA = "mldebug.top.sample"
SAMPLE_VERSION = 1


class SampleError(ValueError):
    """A line that is not a node sample this mldebug can read."""


# -------------------------------------------------------------------------------- field readers


def _plain_fields(d: Any, get: Callable[[dict[str, Any]], tuple[Any, ...]]) -> tuple[Any, ...] | None:
    """A plain dict's fields in one C-level lookup (``get``: an ``itemgetter``); None for anything else (a
    dict's subclass, not a dict, a field missing), which the checked reader takes."""
    if type(d) is not dict:
        return None
    try:
        return get(d)
    except KeyError:
        return None


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


# Each reader first takes the common case (None, or exactly the type: a bool is no int) in one test: a
# round of 2,048 nodes reads ~600k fields; what is left goes through the full checks.

def _opt_int(d: dict[str, Any], key: str) -> int | None:
    v = d.get(key)
    if v is None or type(v) is int:
        return v
    if isinstance(v, bool) or not isinstance(v, int):
        raise SampleError(f"{key} is {v!r}, not a whole number")
    return v


def _req_int(d: dict[str, Any], key: str, where: str) -> int:
    v = _opt_int(d, key)
    if v is None:
        raise SampleError(f"{where} has no {key}")
    return v


def _opt_float(d: dict[str, Any], key: str) -> float | None:
    v = d.get(key)
    if v is None or type(v) is float or type(v) is int:
        return v
    if not _num(v):
        raise SampleError(f"{key} is {v!r}, not a number")
    return v  # an int stays an int: the wire format keeps what was sent


def _opt_str(d: dict[str, Any], key: str) -> str | None:
    v = d.get(key)
    if v is None or type(v) is str:
        return v
    if not isinstance(v, str):
        raise SampleError(f"{key} is {v!r}, not text")
    return v


def _opt_ints(d: dict[str, Any], key: str) -> list[int] | None:
    v = d.get(key)
    if v is None:
        return None
    if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        raise SampleError(f"{key} is {v!r}, not a list of whole numbers")
    return list(v)


def _opt_strs(d: dict[str, Any], key: str) -> list[str] | None:
    v = d.get(key)
    if v is None:
        return None
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise SampleError(f"{key} is {v!r}, not a list of words")
    return list(v)


def _objects(d: dict[str, Any], key: str) -> list[dict[str, Any]]:
    v = d.get(key)
    if v is None:
        return []
    if type(v) is list and _DICT.issuperset(map(type, v)):
        return v
    if not isinstance(v, list) or not all(isinstance(x, dict) for x in v):
        raise SampleError(f"{key} is not a list of objects")
    return v


# The fast path of the per-GPU and per-rank readers (2,048 nodes: 16k GPUs and 16k ranks a round). A
# field's value is taken as it is when its type is exactly one the checked reader returns unchanged (an
# int, a float, a str, None; a list of exactly ints or strs): the tests are C-level (a frozenset lookup per
# field, `issuperset` over a list's item types) instead of a Python call per field. Anything else (a
# missing key, a bool, an int subclass, a wrong type, a dict subclass) goes to the checked reader, which
# accepts or refuses it, and says why, as before: the two paths agree on every input
# (tests/unit/sampling/test_sample_readers.py).
_NONE = type(None)
_INT = frozenset({int})
_STR = frozenset({str})
_DICT = frozenset({dict})
_I = frozenset({int, _NONE})
_F = frozenset({int, float, _NONE})  # an int stays an int, as _opt_float keeps it
_S = frozenset({str, _NONE})
_L = frozenset({list, _NONE})  # the items are tested apart


def _copy(v: list[Any] | None) -> list[Any] | None:
    return None if v is None else list(v)


# -------------------------------------------------------------------------------- the parts


@dataclass
class ProgressFile:
    """One progress file as a node read it (``--progress-file``)."""

    path: str
    kind: str = "lines"  # "step": the step field of its last JSON line; "lines": lines added
    step: int | None = None
    lines: int = 0
    rate: float | None = None  # progress per second over the last seconds; None when not known
    age_s: float | None = None  # seconds since the file last changed
    error: str | None = None  # why it could not be read ("not found", a refusal); None when read
    pattern: str | None = None  # the --progress-file pattern that names it
    rank: int | None = None  # the rank it belongs to (None: the node's)
    has_rank: bool = field(default=False, repr=False, compare=False)
    """Whether the wire form carries ``rank``: a node's files do, a rank's own file (under the rank) does not."""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path, "kind": self.kind, "step": self.step, "lines": self.lines,
                               "rate": self.rate, "age_s": self.age_s, "error": self.error, "pattern": self.pattern}
        if self.has_rank:
            out["rank"] = self.rank
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ProgressFile:
        v = _plain_fields(d, _PROGRESS_GET)
        if v is None:
            return cls._checked(d)
        rank = d.get("rank")
        if all(map(contains, _PROGRESS_KINDS, map(type, v))) and (rank is None or type(rank) is int):
            path, kind, step, lines, rate, age_s, error, pattern = v
            return cls(path, kind or "lines", step, lines or 0, rate, age_s, error, pattern, rank, "rank" in d)
        return cls._checked(d)

    @classmethod
    def _checked(cls, d: dict[str, Any]) -> ProgressFile:
        path = _opt_str(d, "path")
        if path is None:
            raise SampleError("a progress file has no path")
        lines = _opt_int(d, "lines")
        return cls(path=path, kind=_opt_str(d, "kind") or "lines", step=_opt_int(d, "step"),
                   lines=lines or 0, rate=_opt_float(d, "rate"), age_s=_opt_float(d, "age_s"),
                   error=_opt_str(d, "error"), pattern=_opt_str(d, "pattern"), rank=_opt_int(d, "rank"),
                   has_rank="rank" in d)


@dataclass
class GpuSample:
    """One GPU at one moment (what ``nvidia-smi dmon`` shows)."""

    index: int
    name: str | None = None
    uuid: str | None = None
    bus_id: str | None = None
    mem_total_bytes: int | None = None
    util_pct: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    power_pct: float | None = None
    mem_used_bytes: int | None = None
    temp_c: float | None = None
    throttle: list[str] | None = None  # clock-event reasons worth a badge (sampling.gpus.BADGE_WORDS)
    ecc_uncorrected: int | None = None
    xid: list[int] | None = None  # the last Xids of this GPU in the kernel log; None: log not readable
    pids: list[int] | None = None  # compute processes on it; None: NVML cannot say

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "name": self.name, "uuid": self.uuid, "bus_id": self.bus_id,
                "mem_total_bytes": self.mem_total_bytes, "util_pct": self.util_pct, "power_w": self.power_w,
                "power_limit_w": self.power_limit_w, "power_pct": self.power_pct,
                "mem_used_bytes": self.mem_used_bytes, "temp_c": self.temp_c, "throttle": self.throttle,
                "ecc_uncorrected": self.ecc_uncorrected, "xid": self.xid, "pids": self.pids}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> GpuSample:
        v = _plain_fields(d, _GPU_GET)
        if v is None:
            return cls._checked(d)
        (index, name, uuid, bus_id, mem_total, util, power, limit, power_pct, mem_used, temp, throttle, ecc, xid,
         pids) = v
        if all(map(contains, _GPU_KINDS, map(type, v))) \
                and (throttle is None or _STR.issuperset(map(type, throttle))) \
                and (xid is None or _INT.issuperset(map(type, xid))) \
                and (pids is None or _INT.issuperset(map(type, pids))):
            return cls(index, name, uuid, bus_id, mem_total, util, power, limit, power_pct, mem_used, temp,
                       _copy(throttle), ecc, _copy(xid), _copy(pids))
        return cls._checked(d)

    @classmethod
    def _checked(cls, d: dict[str, Any]) -> GpuSample:
        return cls(index=_req_int(d, "index", "a GPU"), name=_opt_str(d, "name"), uuid=_opt_str(d, "uuid"),
                   bus_id=_opt_str(d, "bus_id"), mem_total_bytes=_opt_int(d, "mem_total_bytes"),
                   util_pct=_opt_float(d, "util_pct"), power_w=_opt_float(d, "power_w"),
                   power_limit_w=_opt_float(d, "power_limit_w"), power_pct=_opt_float(d, "power_pct"),
                   mem_used_bytes=_opt_int(d, "mem_used_bytes"), temp_c=_opt_float(d, "temp_c"),
                   throttle=_opt_strs(d, "throttle"), ecc_uncorrected=_opt_int(d, "ecc_uncorrected"),
                   xid=_opt_ints(d, "xid"), pids=_opt_ints(d, "pids"))


@dataclass
class RankSample:
    """One rank process of the job (found the way dump-stacks finds them)."""

    pid: int
    label: str
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    rank_source: str | None = None  # where the rank was read (an environment variable's name...)
    user: str | None = None
    cmdline: str = ""
    state: str | None = None  # the /proc state letter: R, S, D, T, Z...
    cpu_pct: float | None = None  # % of one core since the last sample
    rss_bytes: int | None = None
    threads: int | None = None
    gpu: list[int] | None = None  # the GPUs it runs on (their index)
    progress: ProgressFile | None = None  # its own progress file

    def to_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "rank": self.rank, "local_rank": self.local_rank, "world_size": self.world_size,
                "label": self.label, "rank_source": self.rank_source, "user": self.user, "cmdline": self.cmdline,
                "state": self.state, "cpu_pct": self.cpu_pct, "rss_bytes": self.rss_bytes, "threads": self.threads,
                "gpu": self.gpu, "progress": None if self.progress is None else self.progress.to_json()}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RankSample:
        v = _plain_fields(d, _RANK_GET)
        if v is None:
            return cls._checked(d)
        pid, label, rank, local_rank, world_size, rank_source, user, cmdline, state, cpu, rss, threads, gpu, prog = v
        if all(map(contains, _RANK_KINDS, map(type, v))) and (gpu is None or _INT.issuperset(map(type, gpu))):
            own = None
            if prog is not None:  # a rank's own file names no rank on the wire: it is this rank's
                own = ProgressFile.from_json(prog)
                own.rank = rank
            return cls(pid, label, rank, local_rank, world_size, rank_source, user, cmdline or "", state, cpu, rss,
                       threads, _copy(gpu), own)
        return cls._checked(d)

    @classmethod
    def _checked(cls, d: dict[str, Any]) -> RankSample:
        label = _opt_str(d, "label")
        if label is None:
            raise SampleError("a rank has no label")
        prog = d.get("progress")
        if prog is not None and not isinstance(prog, dict):
            raise SampleError("a rank's progress is not an object")
        rank = _opt_int(d, "rank")
        own = None
        if prog is not None:  # a rank's own file names no rank on the wire: it is this rank's
            own = ProgressFile.from_json(prog)
            own.rank = rank
        return cls(pid=_req_int(d, "pid", "a rank"), label=label, rank=rank,
                   local_rank=_opt_int(d, "local_rank"), world_size=_opt_int(d, "world_size"),
                   rank_source=_opt_str(d, "rank_source"), user=_opt_str(d, "user"),
                   cmdline=_opt_str(d, "cmdline") or "", state=_opt_str(d, "state"),
                   cpu_pct=_opt_float(d, "cpu_pct"), rss_bytes=_opt_int(d, "rss_bytes"),
                   threads=_opt_int(d, "threads"), gpu=_opt_ints(d, "gpu"), progress=own)


_PROGRESS_GET = itemgetter("path", "kind", "step", "lines", "rate", "age_s", "error", "pattern")
_PROGRESS_KINDS = (_STR, _S, _I, _I, _F, _F, _S, _S)
_GPU_GET = itemgetter("index", "name", "uuid", "bus_id", "mem_total_bytes", "util_pct", "power_w", "power_limit_w",
                      "power_pct", "mem_used_bytes", "temp_c", "throttle", "ecc_uncorrected", "xid", "pids")
_GPU_KINDS = (_INT, _S, _S, _S, _I, _F, _F, _F, _F, _I, _F, _L, _I, _L, _L)
_RANK_GET = itemgetter("pid", "label", "rank", "local_rank", "world_size", "rank_source", "user", "cmdline", "state",
                       "cpu_pct", "rss_bytes", "threads", "gpu", "progress")
_RANK_KINDS = (_INT, _STR, _I, _I, _I, _S, _S, _S, _S, _F, _I, _I, _L, frozenset({dict, _NONE}))


@dataclass
class NodeInfo:
    """The node as a whole."""

    host: str
    cpus: int | None = None
    cpu_pct: float | None = None
    load1: float | None = None
    mem_total_bytes: int | None = None
    mem_used_bytes: int | None = None
    agent_cpu_pct: float | None = None  # what the agent itself costs, % of one core

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "cpus": self.cpus, "cpu_pct": self.cpu_pct, "load1": self.load1,
                "mem_total_bytes": self.mem_total_bytes, "mem_used_bytes": self.mem_used_bytes,
                "agent_cpu_pct": self.agent_cpu_pct}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> NodeInfo:
        return cls(host=_opt_str(d, "host") or "", cpus=_opt_int(d, "cpus"), cpu_pct=_opt_float(d, "cpu_pct"),
                   load1=_opt_float(d, "load1"), mem_total_bytes=_opt_int(d, "mem_total_bytes"),
                   mem_used_bytes=_opt_int(d, "mem_used_bytes"), agent_cpu_pct=_opt_float(d, "agent_cpu_pct"))


@dataclass
class NvmlStatus:
    """Whether the node's GPUs could be read, and from where (the NVML library or a test fake)."""

    available: bool = False
    reason: str | None = None
    source: str | None = None
    xid_reason: str | None = None  # why the kernel log's Xids cannot be read; absent from the wire when None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"available": self.available, "reason": self.reason, "source": self.source}
        if self.xid_reason:
            out["xid_reason"] = self.xid_reason
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> NvmlStatus:
        return cls(available=bool(d.get("available")), reason=_opt_str(d, "reason"), source=_opt_str(d, "source"),
                   xid_reason=_opt_str(d, "xid_reason"))


@dataclass
class NodeSample:
    """One node at one moment: the node, its GPUs, the job's ranks on it, its progress files, notes."""

    node: NodeInfo
    seq: int = 0  # counts the agent's samples from 1
    tick: int | None = None  # the wall-clock tick (time / interval) it was taken on
    time: float | None = None  # when it was taken (seconds since the epoch)
    interval_s: float | None = None
    nvml: NvmlStatus | None = None  # None: not said (the agent always says it)
    gpus: list[GpuSample] = field(default_factory=list)
    ranks: list[RankSample] = field(default_factory=list)
    progress: list[ProgressFile] = field(default_factory=list)  # the node's files (and a rank's second one)
    progress_missing: list[ProgressFile] = field(default_factory=list)  # named by a pattern, not there
    notes: list[str] = field(default_factory=list)
    mldebug_version: str | None = None

    def to_json(self) -> dict[str, Any]:
        from ml_debug import __version__

        return {
            "schema": SAMPLE_SCHEMA, "v": SAMPLE_VERSION,
            "mldebug_version": self.mldebug_version if self.mldebug_version is not None else __version__,
            "seq": self.seq, "tick": self.tick, "time": self.time, "interval_s": self.interval_s,
            "node": self.node.to_json(), "nvml": None if self.nvml is None else self.nvml.to_json(),
            "gpus": [g.to_json() for g in self.gpus], "ranks": [r.to_json() for r in self.ranks],
            "progress": [p.to_json() for p in self.progress],
            "progress_missing": [p.to_json() for p in self.progress_missing],
            "notes": list(self.notes),
        }

    @classmethod
    def from_json(cls, doc: Any) -> NodeSample:
        """Read one sample; :class:`SampleError` says why a document is not one this mldebug reads."""
        from ml_debug import __version__

        if not isinstance(doc, dict):
            raise SampleError("not a JSON object")
        if doc.get("schema") != SAMPLE_SCHEMA:
            raise SampleError(f"not a node sample (schema {doc.get('schema')!r}, expected {SAMPLE_SCHEMA!r})")
        v = doc.get("v")
        version = doc.get("mldebug_version")
        if v != SAMPLE_VERSION:
            raise SampleError(f"sample format {v!r} from mldebug {version or '?'}; this is mldebug {__version__}, "
                              f"which reads format {SAMPLE_VERSION}: install the same version on every node")
        node = doc.get("node")
        if not isinstance(node, dict):
            raise SampleError("the sample has no node")
        nvml = doc.get("nvml")
        for key in ("gpus", "ranks"):
            if not isinstance(doc.get(key), list):
                raise SampleError(f"the sample has no {key} list")
        try:
            return cls(
                node=NodeInfo.from_json(node), seq=_opt_int(doc, "seq") or 0, tick=_opt_int(doc, "tick"),
                time=_opt_float(doc, "time"), interval_s=_opt_float(doc, "interval_s"),
                nvml=NvmlStatus.from_json(nvml) if isinstance(nvml, dict) else None,
                gpus=[GpuSample.from_json(g) for g in _objects(doc, "gpus")],
                ranks=[RankSample.from_json(r) for r in _objects(doc, "ranks")],
                progress=[ProgressFile.from_json(p) for p in _objects(doc, "progress")],
                progress_missing=[ProgressFile.from_json(p) for p in _objects(doc, "progress_missing")],
                notes=_opt_strs(doc, "notes") or [],
                mldebug_version=version if isinstance(version, str) else None,
            )
        except SampleError as e:
            raise SampleError(f"{e} (mldebug {version or '?'} there, {__version__} here)") from None
