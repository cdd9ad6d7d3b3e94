"""The Flight Recorder file protocol, in one place: the job's side (``ml_debug.flight_recorder``, in
user code) and the reader's (dump-stacks, watch, drill, the self-launched ranks) agree on it here.

- The job is launched with :data:`DIR_VAR` (where dumps go) and :data:`BUFFER_VAR` (torch keeps that
  many collectives; 0 or unset: no record).
- A reader asks rank R for its record by creating ``<dir>/trigger-R`` (:func:`trigger_name`); the
  rank's watcher thread removes it and writes ``<dir>/fr-R.json`` (:func:`dump_name`) atomically.
- NCCL's own pipe (no mldebug in the job): with :data:`NCCL_PIPE_VAR`\\ =P, rank R reads ``P<R>.pipe``;
  a write there makes it dump to the first of :data:`NCCL_FILE_VARS` that is set, plus its rank.

Standard library only: user code imports it through ``ml_debug.flight_recorder``.
"""

from __future__ import annotations

DIR_VAR = "MLDEBUG_FR_DIR"
BUFFER_VAR = "TORCH_FR_BUFFER_SIZE"
LEGACY_BUFFER_VAR = "TORCH_NCCL_TRACE_BUFFER_SIZE"  # the same, on older torch
NCCL_PIPE_VAR = "TORCH_NCCL_DEBUG_INFO_PIPE_FILE"
NCCL_FILE_VARS = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")


def trigger_name(rank: int) -> str:
    """The file whose creation asks rank ``rank`` for its record."""
    return f"trigger-{rank}"


def dump_name(rank: int) -> str:
    """The file rank ``rank`` writes its record to."""
    return f"fr-{rank}.json"
