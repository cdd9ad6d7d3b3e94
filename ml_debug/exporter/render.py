"""The metrics: their names, types, labels and help (:data:`METRICS`, the one list the docs page, the
dashboard test and the collector share), and the prometheus_client collector that turns the last
:class:`~ml_debug.exporter.result.Snapshot` into them at each scrape.

Names follow Prometheus' conventions: ``mldebug_`` prefix, snake_case, base units in the name
(``_seconds``, ``_bytes``, ``_ratio``), ``_total`` for counters. Labels are bounded: ``node`` (this
host), ``job_id`` and ``rank`` (the live ranks only: a rank that ends drops its series), ``gpu``
(an index), and fixed sets (check ids, statuses, reasons). The rank label is called ``job_id``, not
``job``: Prometheus gives every series the scrape job's name as ``job`` and would rename ours to
``exported_job``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ml_debug.core.nvml import CLOCK_EVENT_BITS
from ml_debug.core.visible import visible
from ml_debug.exporter.result import GpuValues, Snapshot

GAUGE = "gauge"
COUNTER = "counter"


@dataclass(frozen=True)
class Metric:
    name: str  # as scraped (a counter's with its _total)
    kind: str
    labels: tuple[str, ...]
    help: str


RANK = ("node", "job_id", "rank")
GPU = ("node", "gpu")

METRICS: tuple[Metric, ...] = (
    # -- job progress, per rank process of this node --------------------------------------------------------
    Metric("mldebug_rank_info", GAUGE, (*RANK, "pid", "local_rank", "world_size"),
           "1 for every live rank process of a job on this node, with its pid, local rank and world size."),
    Metric("mldebug_rank_stalled", GAUGE, RANK,
           "1 when the rank made no progress for --stall seconds (the decision of mldebug watch), else 0."),
    Metric("mldebug_rank_straggler", GAUGE, RANK,
           "1 when the rank's step rate stays below the median rank's divided by --straggler-factor, else 0."),
    Metric("mldebug_rank_seconds_since_progress", GAUGE, RANK,
           "Seconds since the rank last made progress (its progress file grew, or without one: CPU or GPU work)."),
    Metric("mldebug_rank_last_progress_timestamp_seconds", GAUGE, RANK,
           "Unix time of the rank's last progress."),
    Metric("mldebug_rank_step", GAUGE, RANK,
           "The step in the rank's progress file (--progress-file); absent without one."),
    Metric("mldebug_rank_steps_per_second", GAUGE, RANK,
           "The rank's step rate over the last 10 s of its progress file."),
    Metric("mldebug_rank_cpu_utilization_ratio", GAUGE, RANK,
           "CPU time the rank process used per second over the last interval (1.0 = one core)."),
    Metric("mldebug_rank_gpu_utilization_ratio", GAUGE, (*RANK, "gpu"),
           "Utilisation of each GPU the rank holds a context on (NVML, 0..1)."),
    Metric("mldebug_rank_resident_memory_bytes", GAUGE, RANK, "Resident memory of the rank process."),
    Metric("mldebug_job_ranks", GAUGE, ("node", "job_id"), "Live rank processes of the job on this node."),
    # -- node health -----------------------------------------------------------------------------------------
    Metric("mldebug_health_check", GAUGE, ("node", "check", "target", "gpu", "status"),
           "1 for each health check of the last run (mldebug health --level 1), its verdict in the status label "
           "(pass, warn, fail, skip, info); gpu is the GPU index of a GPU's check, else empty."),
    Metric("mldebug_health_checks", GAUGE, ("node", "status"), "Checks of the last health run per verdict."),
    Metric("mldebug_health_hung", GAUGE, ("node",),
           "1 while a health run has gone on for longer than --health-timeout (an NVML call or a file system "
           "that does not answer); the last finished run's values stay served."),
    Metric("mldebug_health_running_seconds", GAUGE, ("node",),
           "How long the health run under way has been running (0 when none is)."),
    Metric("mldebug_gpu_xid_events", GAUGE, (*GPU, "xid"),
           "Xid events of the GPU in the kernel log (dmesg), per Xid; absent when the log is not readable."),
    Metric("mldebug_gpu_ecc_errors_total", COUNTER, (*GPU, "error", "scope"),
           "ECC errors (error: corrected|uncorrected; scope: volatile since the driver loaded, aggregate "
           "lifetime)."),
    Metric("mldebug_gpu_remapped_rows_total", COUNTER, (*GPU, "cause"),
           "Memory rows remapped (cause: correctable|uncorrectable), Ampere and later."),
    Metric("mldebug_gpu_remap_pending", GAUGE, GPU, "1 when a row remap waits for a GPU reset."),
    Metric("mldebug_gpu_remap_failed", GAUGE, GPU, "1 when a row remap failed (no spare rows left)."),
    Metric("mldebug_gpu_retired_pages_total", COUNTER, (*GPU, "cause"),
           "Retired memory pages (cause: single_bit|double_bit), before Ampere."),
    Metric("mldebug_gpu_recovery_action", GAUGE, GPU,
           "The driver's requested recovery action (0 none, 1 GPU reset, 2 node reboot, ...)."),
    Metric("mldebug_gpu_clock_event_active", GAUGE, (*GPU, "reason"),
           "1 for each clock event (throttle) reason active at the last health run."),
    Metric("mldebug_gpu_temperature_celsius", GAUGE, GPU, "GPU temperature at the last health run."),
    Metric("mldebug_gpu_pcie_link_generation", GAUGE, GPU, "Current PCIe link generation."),
    Metric("mldebug_gpu_pcie_link_generation_max", GAUGE, GPU, "Maximum PCIe link generation."),
    Metric("mldebug_gpu_pcie_link_width_lanes", GAUGE, GPU, "Current PCIe link width."),
    Metric("mldebug_gpu_pcie_link_width_max_lanes", GAUGE, GPU, "Maximum PCIe link width."),
    Metric("mldebug_gpu_nvlink_links", GAUGE, GPU, "NVLinks of the GPU."),
    Metric("mldebug_gpu_nvlink_links_active", GAUGE, GPU, "NVLinks of the GPU that are up."),
    Metric("mldebug_gpu_nvlink_errors_total", COUNTER, (*GPU, "kind"),
           "NVLink error counters summed over the links (kind: replay|recovery|crc_flit|crc_data)."),
    # -- the exporter itself ---------------------------------------------------------------------------------
    Metric("mldebug_exporter_info", GAUGE, ("node", "version"), "1, with the mldebug version."),
    Metric("mldebug_exporter_last_sample_timestamp_seconds", GAUGE, ("node", "source"),
           "Unix time the last sample ended (source: ranks|health)."),
    Metric("mldebug_exporter_sample_duration_seconds", GAUGE, ("node", "source"), "How long the last sample took."),
    Metric("mldebug_exporter_samples_total", COUNTER, ("node", "source"), "Samples taken."),
    Metric("mldebug_exporter_sample_errors_total", COUNTER, ("node", "source"), "Samples that failed."),
    Metric("mldebug_exporter_progress_files", GAUGE, ("node", "state"),
           "Files named by --progress-file (state: ok|unreadable|missing)."),
)
BY_NAME = {m.name: m for m in METRICS}

PROCESS_METRICS: tuple[Metric, ...] = tuple(
    Metric(f"mldebug_exporter_process_{name}", kind, (), f"{what} of the exporter process (prometheus_client's "
           "process collector; the server only, not --once).")
    for name, kind, what in (("cpu_seconds_total", COUNTER, "CPU time (user + system)"),
                             ("resident_memory_bytes", GAUGE, "Resident memory"),
                             ("virtual_memory_bytes", GAUGE, "Virtual memory"),
                             ("start_time_seconds", GAUGE, "Start time (Unix time)"),
                             ("open_fds", GAUGE, "Open file descriptors"),
                             ("max_fds", GAUGE, "The open file descriptor limit")))


def served_names() -> set[str]:
    """Every metric name a scrape may show, counters with their ``_total``."""
    return set(BY_NAME) | {m.name for m in PROCESS_METRICS}


class Families:
    """The metric families of one scrape, filled from the snapshot."""

    def __init__(self) -> None:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        self.families: dict[str, Any] = {}
        for m in METRICS:
            if m.kind == COUNTER:
                self.families[m.name] = CounterMetricFamily(m.name.removesuffix("_total"), m.help,
                                                            labels=list(m.labels))
            else:
                self.families[m.name] = GaugeMetricFamily(m.name, m.help, labels=list(m.labels))

    def add(self, name: str, labels: tuple[str, ...], value: Any) -> None:
        if value is None or isinstance(value, (dict, list, str)):
            return  # not reported here: no series, rather than a made-up 0
        assert len(labels) == len(BY_NAME[name].labels), name
        # a label value is the job's string (its job id, a host, a file): Prometheus escapes only \\, " and
        # newline, so an ESC or BEL would reach whoever reads the page or a query's answer on a terminal
        self.families[name].add_metric([visible(str(v)) for v in labels], float(value))

    def __iter__(self) -> Iterator[Any]:
        return iter(self.families.values())


def _gpu(f: Families, node: str, g: GpuValues) -> None:
    i = str(g.index)
    v = g.fields
    if g.xid_readable:
        for xid, n in sorted(g.xids.items()):
            f.add("mldebug_gpu_xid_events", (node, i, str(xid)), n)
    for error in ("corrected", "uncorrected"):
        for scope in ("volatile", "aggregate"):
            f.add("mldebug_gpu_ecc_errors_total", (node, i, error, scope), v.get(f"ecc.errors.{error}.{scope}.total"))
    for cause in ("correctable", "uncorrectable"):
        f.add("mldebug_gpu_remapped_rows_total", (node, i, cause), v.get(f"remapped_rows.{cause}"))
    f.add("mldebug_gpu_remap_pending", (node, i), _int(v.get("remapped_rows.pending")))
    f.add("mldebug_gpu_remap_failed", (node, i), _int(v.get("remapped_rows.failure")))
    f.add("mldebug_gpu_retired_pages_total", (node, i, "single_bit"), v.get("retired_pages.single_bit_ecc.count"))
    f.add("mldebug_gpu_retired_pages_total", (node, i, "double_bit"), v.get("retired_pages.double_bit.count"))
    f.add("mldebug_gpu_recovery_action", (node, i), v.get("recovery_action"))
    mask = v.get("clocks_event_reasons.active")
    if isinstance(mask, int):
        for bit, reason in CLOCK_EVENT_BITS.items():
            f.add("mldebug_gpu_clock_event_active", (node, i, reason), 1 if mask & bit else 0)
    f.add("mldebug_gpu_temperature_celsius", (node, i), v.get("temperature.gpu"))
    f.add("mldebug_gpu_pcie_link_generation", (node, i), v.get("pcie.link.gen.current"))
    f.add("mldebug_gpu_pcie_link_generation_max", (node, i), v.get("pcie.link.gen.max"))
    f.add("mldebug_gpu_pcie_link_width_lanes", (node, i), v.get("pcie.link.width.current"))
    f.add("mldebug_gpu_pcie_link_width_max_lanes", (node, i), v.get("pcie.link.width.max"))
    f.add("mldebug_gpu_nvlink_links", (node, i), v.get("nvlink.links"))
    f.add("mldebug_gpu_nvlink_links_active", (node, i), v.get("nvlink.active"))
    errors = v.get("nvlink.errors")
    if isinstance(errors, dict):
        for kind, n in sorted(errors.items()):
            f.add("mldebug_gpu_nvlink_errors_total", (node, i, kind), n)


def _int(v: Any) -> int | None:
    return None if v is None else int(bool(v))


def families(snap: Snapshot, now: float) -> Families:
    """Every series of one scrape, from the snapshot as it is."""
    f = Families()
    node = snap.node
    jobs: dict[str, int] = {}
    for r in snap.ranks:
        key = (node, r.job_id, r.rank)
        jobs[r.job_id] = jobs.get(r.job_id, 0) + 1
        f.add("mldebug_rank_info", (*key, str(r.pid), "" if r.local_rank is None else str(r.local_rank),
                                    "" if r.world_size is None else str(r.world_size)), 1)
        f.add("mldebug_rank_stalled", key, int(r.stalled))
        f.add("mldebug_rank_straggler", key, int(r.straggler))
        f.add("mldebug_rank_seconds_since_progress", key, round(r.seconds_since_progress, 3))
        f.add("mldebug_rank_last_progress_timestamp_seconds", key, r.last_progress)
        f.add("mldebug_rank_step", key, r.step)
        f.add("mldebug_rank_steps_per_second", key, r.steps_per_second)
        f.add("mldebug_rank_cpu_utilization_ratio", key, r.cpu_ratio)
        f.add("mldebug_rank_resident_memory_bytes", key, r.rss_bytes)
        for index, util in r.gpus:
            f.add("mldebug_rank_gpu_utilization_ratio", (*key, str(index)), util)
    for job_id, n in sorted(jobs.items()):
        f.add("mldebug_job_ranks", (node, job_id), n)
    counts: dict[str, int] = {}
    for c in snap.checks:
        counts[c.status] = counts.get(c.status, 0) + 1
        f.add("mldebug_health_check", (node, c.check, c.target, c.gpu, c.status), 1)
    if snap.sources["health"].samples:
        for status in ("pass", "warn", "fail", "skip", "info"):
            f.add("mldebug_health_checks", (node, status), counts.get(status, 0))
    health = snap.sources["health"]
    f.add("mldebug_health_hung", (node,), int(health.hung))
    f.add("mldebug_health_running_seconds", (node,),
          0.0 if health.running_since is None else round(max(0.0, now - health.running_since), 3))
    for g in snap.gpus:
        _gpu(f, node, g)
    f.add("mldebug_exporter_info", (node, snap.version), 1)
    for source, s in sorted(snap.sources.items()):
        f.add("mldebug_exporter_last_sample_timestamp_seconds", (node, source), s.last_time)
        f.add("mldebug_exporter_sample_duration_seconds", (node, source), s.last_duration_s)
        f.add("mldebug_exporter_samples_total", (node, source), s.samples)
        f.add("mldebug_exporter_sample_errors_total", (node, source), s.errors)
    for state, n in sorted(snap.progress_files.items()):
        f.add("mldebug_exporter_progress_files", (node, state), n)
    return f


class SnapshotCollector:
    """A prometheus_client collector over whatever snapshot ``current()`` returns: a scrape reads the
    last one and never waits for a sampler."""

    def __init__(self, current: Callable[[], Snapshot]) -> None:
        self.current = current

    def collect(self) -> Iterator[Any]:
        yield from families(self.current(), time.time())

    def describe(self) -> Iterator[Any]:
        return iter(())  # the series change from scrape to scrape: nothing to check at registration


def exposition(snap: Snapshot) -> str:
    """The Prometheus text format of one snapshot (``--once``)."""
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry()
    registry.register(SnapshotCollector(lambda: snap))
    return generate_latest(registry).decode()
