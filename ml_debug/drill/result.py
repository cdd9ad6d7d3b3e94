"""What a drill run produces: one outcome per drill and the score over them."""

from __future__ import annotations

from dataclasses import dataclass, field

SCHEMA = "mldebug.drill"
SCHEMA_VERSION = 1

CORRECT, MISSED, ERROR = "correct", "missed", "error"
"""A drill's status: the diagnosis named the injected rank (and where); it named another or nothing; the
drill itself could not run to a verdict (the job never reached the fault, a tool was missing, ...)."""


@dataclass
class Injected:
    """The fault as injected: which rank, on which node, at which step, and the function it runs in."""

    fault: str
    rank: int | None
    node: str
    step: int | None = None
    where: str | None = None
    peer: int | None = None  # slow-link: the other end of the slow pair


@dataclass
class Named:
    """What the diagnosis said: the ranks it blamed, where, and its own one-line verdict."""

    ranks: list[int] = field(default_factory=list)
    node: str | None = None
    where: str | None = None
    verdict: str = ""


@dataclass
class DrillOutcome:
    drill: str
    status: str
    injected: Injected
    diagnosis: str  # the command a user would type, as it ran
    named: Named
    time_to_verdict_s: float | None  # from the start of the diagnosis to its verdict
    job_s: float | None  # how long the job ran before the diagnosis started
    evidence: str  # the drill's folder: job logs and the diagnosis' JSON
    token: str  # MLDEBUG_DRILL_TOKEN=<token> is in the environment of every process the drill started
    why: str = ""  # what was wrong (missed) or what stopped the drill (error)


@dataclass
class DrillResult:
    ok: bool
    summary: str
    seed: int
    nproc_per_node: int
    host: str  # where `mldebug drill` ran
    site: str  # where the drills' jobs ran: this node, or a Slurm partition
    nodes: int
    drills: list[DrillOutcome]
    correct: int
    missed: int
    errors: int
    interrupted: bool  # Ctrl-C: the drills that finished are kept, the one running was torn down
    out_dir: str
    wall_s: float
    notes: list[str] = field(default_factory=list)
