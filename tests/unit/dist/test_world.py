"""World detection from each launcher's variables (pure: no launcher needed)."""

from __future__ import annotations

import pytest

from ml_debug.core.errors import UsageError
from ml_debug.dist.world import derived_port, detect_world, first_host, is_launched, slurm_tasks_per_node


def test_single_process() -> None:
    w = detect_world({})
    assert (w.rank, w.world_size, w.local_rank, w.local_world_size, w.launcher) == (0, 1, 0, 1, "single")
    assert not is_launched({})
    assert w.label.endswith(":0]")


def test_torchrun_env() -> None:
    env = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1",
           "MASTER_ADDR": "node01", "MASTER_PORT": "29400", "TORCHELASTIC_RUN_ID": "x"}
    w = detect_world(env)
    assert (w.rank, w.world_size, w.local_rank, w.local_world_size, w.node_rank) == (5, 8, 1, 4, 1)
    assert (w.master_addr, w.master_port, w.launcher) == ("node01", 29400, "torchrun")
    assert is_launched(env)
    assert w.nnodes == 2


def test_env_by_hand_defaults_local_to_world() -> None:
    w = detect_world({"RANK": "2", "WORLD_SIZE": "3"})
    assert (w.local_rank, w.local_world_size, w.node_rank, w.master_addr, w.master_port) == \
        (0, 3, 0, "127.0.0.1", 29500)


def test_slurm_step_task() -> None:
    env = {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_STEP_NUM_TASKS": "4", "SLURM_LOCALID": "1",
           "SLURM_NODEID": "1", "SLURM_STEP_ID": "0", "SLURM_JOB_ID": "4242",
           "SLURM_STEP_NODELIST": "gpu[07-08]", "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
           "SLURMD_NODENAME": "gpu08"}
    w = detect_world(env)
    assert (w.rank, w.world_size, w.local_rank, w.local_world_size, w.node_rank) == (3, 4, 1, 2, 1)
    assert (w.host, w.master_addr, w.launcher) == ("gpu08", "gpu07", "slurm")
    assert w.master_port == derived_port("4242", "0")
    assert 20000 <= w.master_port < 40000
    assert w.label == "[gpu08:3]"
    # MASTER_PORT/MASTER_ADDR given by the user win over the derived ones.
    w2 = detect_world({**env, "MASTER_PORT": "6000", "MASTER_ADDR": "10.0.0.1"})
    assert (w2.master_addr, w2.master_port) == ("10.0.0.1", 6000)


def test_sbatch_script_is_not_a_step_task() -> None:
    env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "8", "SLURM_JOB_ID": "1", "SLURM_NODELIST": "n[1-2]"}
    assert detect_world(env).launcher == "single"


def test_torchrun_inside_srun_wins() -> None:
    env = {"SLURM_PROCID": "0", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "2", "SLURM_STEP_NODELIST": "a,b",
           "RANK": "3", "WORLD_SIZE": "16", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "8"}
    assert detect_world(env).launcher == "torchrun"
    assert detect_world(env).rank == 3


def test_openmpi() -> None:
    env = {"OMPI_COMM_WORLD_RANK": "6", "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_RANK": "2",
           "OMPI_COMM_WORLD_LOCAL_SIZE": "4", "MASTER_ADDR": "h0"}
    w = detect_world(env)
    assert (w.rank, w.world_size, w.local_rank, w.local_world_size, w.node_rank, w.launcher) == \
        (6, 8, 2, 4, 1, "mpi")
    assert w.master_addr == "h0"
    # multi-node without MASTER_ADDR: unknown, not guessed
    assert detect_world({k: v for k, v in env.items() if k != "MASTER_ADDR"}).master_addr is None


def test_mpich_pmi_single_node() -> None:
    w = detect_world({"PMI_RANK": "1", "PMI_SIZE": "2"})
    assert (w.rank, w.world_size, w.local_rank, w.local_world_size, w.master_addr, w.launcher) == \
        (1, 2, 1, 2, "127.0.0.1", "mpi")


@pytest.mark.parametrize("nodelist,first", [
    ("node01", "node01"), ("node[07-09,12],gpu1", "node07"), ("a,b[1-3]", "a"),
    ("n[3-5]-ib[1,2]", "n3-ib1"), ("gpu[007]", "gpu007"),
])
def test_first_host(nodelist: str, first: str) -> None:
    assert first_host(nodelist) == first


def test_tasks_per_node() -> None:
    assert slurm_tasks_per_node("2(x3),1", 0) == 2
    assert slurm_tasks_per_node("2(x3),1", 2) == 2
    assert slurm_tasks_per_node("2(x3),1", 3) == 1
    assert slurm_tasks_per_node("4", 0) == 4


@pytest.mark.parametrize("env", [
    {"RANK": "4", "WORLD_SIZE": "4"}, {"RANK": "x", "WORLD_SIZE": "4"},
    {"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "70000"},
])
def test_bad_variables_are_usage_errors(env: dict[str, str]) -> None:
    with pytest.raises(UsageError):
        detect_world(env)
