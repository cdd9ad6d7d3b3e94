"""The health hook's rules, pure: Slurm's node record read, the drain reason made, the action chosen.
(The same rules on a real Slurm: tests/rig/test_slurm_hook.py.)"""

from __future__ import annotations

import pytest

from ml_debug.core.errors import UsageError
from ml_debug.health.result import Check, Status
from ml_debug.slurmhook.run import decide, is_ours, reason_for
from ml_debug.slurmhook.scontrol import NodeState, check_node_name, parse_show_node

# `scontrol show node node1` of Slurm 22.05 (the rig's), drained by mldebug
DRAINED = """NodeName=node1 Arch=x86_64 CoresPerSocket=1
   CPUAlloc=0 CPUEfctv=8 CPUTot=8 CPULoad=2.51
   Gres=gpu:1
   NodeAddr=10.213.23.11 NodeHostName=node1 Version=22.05.8
   State=IDLE+DRAIN ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A
   Partitions=debug
   Reason=mldebug: gpu0 row_remap pending=yes [rows] unc=1 [root@2026-11-27T03:57:44]
"""


def test_show_node_reads_state_and_reason_with_brackets_inside() -> None:
    st = parse_show_node("node1", DRAINED)
    assert (st.state, st.reason, st.reason_user) == ("IDLE+DRAIN", "mldebug: gpu0 row_remap pending=yes [rows] unc=1",
                                                     "root")
    assert st.drained and is_ours(st.reason)
    up = parse_show_node("node2", DRAINED.replace("IDLE+DRAIN", "MIXED").rsplit("   Reason", 1)[0])
    assert (up.state, up.reason, up.drained) == ("MIXED", None, False)
    assert NodeState("n", "ALLOCATED+DRAIN", "x", None).drained and NodeState("n", "DOWN*+DRAIN", "x", None).drained


def _fail(target: str, check: str, value: str) -> Check:
    return Check(check, target, Status.FAIL, value, "", "hint", "test")


def test_reason_names_the_check_and_gpu_in_one_bounded_line() -> None:
    assert reason_for([_fail("gpu3", "gpu.row_remap", "pending=yes")]) == "mldebug: gpu3 row_remap pending=yes"
    two = reason_for([_fail("host", "host.shm", "missing"), _fail("gpu1", "gpu.ecc", "5\nuncorrected\x1b[0m")])
    assert two == "mldebug: host.shm missing (+1 more)"
    long = reason_for([_fail("/scratch/" + "x" * 400, "host.disk", "not\taccessible\n")] * 3)
    assert len(long) <= 200 and long.endswith("... (+2 more)") and "\n" not in long and "\t" not in long


@pytest.mark.parametrize("failing,state,reason,action", [
    (True, "IDLE", None, "drain"),
    (True, "MIXED+DRAIN", "mldebug: gpu0 ecc 3", "keep"),
    (True, "IDLE+DRAIN", "admin: fan swap", "left"),
    (False, "IDLE+DRAIN", "mldebug: gpu0 ecc 3", "resume"),
    (False, "IDLE+DRAIN", "admin: fan swap", "left"),
    (False, "IDLE+DRAIN", "Kill task failed", "left"),
    (False, "IDLE", None, "none"),
    (True, None, None, "drain"),     # --dry-run without scontrol: as a node in service
    (False, None, None, "none"),
])
def test_only_mldebugs_own_drains_are_resumed(failing: bool, state: str | None, reason: str | None,
                                               action: str) -> None:
    node = None if state is None else NodeState("node1", state, reason, "root")
    failed = [_fail("gpu0", "gpu.ecc", "3")] if failing else []
    assert decide(failed, node) == action


@pytest.mark.parametrize("name", ["node1;reboot", "-node1", "node 1", "", "a" * 200, "$(id)"])
def test_a_node_name_is_never_more_than_a_name(name: str) -> None:
    with pytest.raises(UsageError, match="not a Slurm node name"):
        check_node_name(name)


@pytest.mark.parametrize("argv,message", [
    (["health", "--slurm-check", "--level", "5"], "--level"),
    (["health", "--slurm-check", "--levle", "1"], "No such option"),
    (["health", "--slurm-check", "--hosts", "node1"], "checks this node only"),
    (["health", "--slurm-check", "--node", "node1;reboot"], "not a Slurm node name"),
])
def test_a_hook_command_line_it_does_not_take_is_typers_usage_error(argv: list[str], message: str,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    from ml_debug.cli.app import run

    assert run(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "hint:" in err, err
