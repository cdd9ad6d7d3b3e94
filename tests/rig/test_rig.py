"""The test rig's own tests: its parts are real and up (tests/rig/).

ssh: the ssh binary and paramiko run `hostname` on every loopback sshd port and on every netns node;
the bad-host-key sshd really presents another key; the alternative client key is refused.
netns nodes: own hostname, own process list. Slurm: `srun` runs a command on each node.
hung_job: the ranks of a gloo job spread over netns nodes really hang (stacks taken with py-spy) until
they are killed (the fixture itself checks every job it starts: each rank at its hang point, nothing left
after the kill; tests/cli/test_dump_stacks.py reads its local, loop and Slurm jobs).
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ml_debug.core.lifecycle import alive as _alive
from tests.conftest import REPO, require
from tests.rig.fixtures import HungJob, NetnsNode, SlurmRig, SshHost, SshRig

pytestmark = pytest.mark.rig

PY_SPY = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")


def _paramiko_client(rig: SshRig, key: Path | None = None):
    import paramiko

    client = paramiko.SSHClient()
    client.load_host_keys(str(rig.known_hosts))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    return client


def _paramiko_run(rig: SshRig, host: SshHost, command: str, key: Path | None = None) -> tuple[int, str]:
    client = _paramiko_client(rig)
    try:
        client.connect(host.address, port=host.port, username="root", key_filename=str(key or rig.client_key),
                       look_for_keys=False, allow_agent=False, timeout=30, banner_timeout=30, auth_timeout=30)
        _, out, _ = client.exec_command(command, timeout=60)
        text = out.read().decode()
        return out.channel.recv_exit_status(), text
    finally:
        client.close()


# ----------------------------------------------------------------------------- ssh


def test_ssh_binary_reaches_every_loopback_port(rig_ssh: SshRig) -> None:
    assert len(rig_ssh.hosts) >= 4
    for host in rig_ssh.hosts:
        proc = rig_ssh.ssh(host, "sh", "-c", "hostname; echo $SSH_CONNECTION")
        assert proc.returncode == 0, proc.stderr
        name, conn = proc.stdout.splitlines()
        assert name == os.uname().nodename
        assert conn.split()[-1] == str(host.port)  # really that sshd, not another one


def test_paramiko_reaches_every_loopback_port(rig_ssh: SshRig) -> None:
    for host in rig_ssh.hosts:
        rc, out = _paramiko_run(rig_ssh, host, "hostname; exit 7")
        assert rc == 7
        assert out.strip() == os.uname().nodename


def test_nodes_have_own_hostname_and_process_list(rig_ssh: SshRig) -> None:
    import psutil

    me = " ".join(psutil.Process().cmdline())
    assert [n.name for n in rig_ssh.nodes] == ["node1", "node2", "node3"]
    seen: dict[str, set[str]] = {}
    for node in rig_ssh.nodes:
        proc = rig_ssh.ssh(node, "sh", "-c", "hostname; ps -e -o pid=,args=")
        assert proc.returncode == 0, proc.stderr
        name, *ps = proc.stdout.splitlines()
        assert name == node.name
        assert len(ps) < 30  # the node's own PID namespace: a handful of processes, not this machine's
        # not even this test's own process (other tests may run jobs inside the node meanwhile)
        assert not any(line.split(None, 1)[-1] == me for line in ps), ps
        seen[name] = set(ps)
        rc, out = _paramiko_run(rig_ssh, node, "hostname")
        assert (rc, out.strip()) == (0, node.name)
    assert len(seen) == 3
    # each node sees its own sshd (listening on its own IP) and no other node's
    for node in rig_ssh.nodes:
        mine = " ".join(seen[node.name])
        assert f"sshd_{node.name}.conf" in mine
        assert not any(f"sshd_{o.name}.conf" in mine for o in rig_ssh.nodes if o != node)


def test_ssh_config_and_known_hosts_cover_every_host(rig_ssh: SshRig) -> None:
    config = rig_ssh.ssh_config.read_text()
    known = rig_ssh.known_hosts.read_text()
    good_key = rig_ssh.host_key_pub.read_text().split()[1]
    for host in [*rig_ssh.hosts, *rig_ssh.nodes, rig_ssh.bad_hostkey_host]:
        assert f"Host {host.name}\n" in config
        assert any(host.address in line and good_key in line for line in known.splitlines())
    assert "StrictHostKeyChecking yes" in config and f"UserKnownHostsFile {rig_ssh.known_hosts}" in config


def test_the_rig_listens_on_loopback_and_its_bridge_only(rig_ssh: SshRig, rig_slurm: SlurmRig) -> None:
    """The rig stays up after the suite (README): its sshds and slurmctld must not be reachable from
    outside this machine."""
    require(shutil.which("ss") is not None, "ss (iproute2)")
    ports = {h.port for h in [*rig_ssh.hosts, rig_ssh.bad_hostkey_host] if h.address == "127.0.0.1"} | {6817}
    listening: dict[int, set[str]] = {}
    for line in subprocess.run(["ss", "-ltnH"], capture_output=True, text=True, check=True).stdout.splitlines():
        address, _, port = line.split()[3].rpartition(":")
        if int(port) in ports:
            listening.setdefault(int(port), set()).add(address)
    assert set(listening) == ports, listening
    assert all(addresses == {"127.0.0.1"} for port, addresses in listening.items() if port != 6817), listening
    bridge = next(iter(rig_slurm.node_ips.values())).rsplit(".", 1)[0] + ".1"  # the nodes' gateway
    assert listening[6817] == {bridge}, listening  # slurmctld on the rig's bridge, where the nodes reach it
    # accounting: slurmdbd and MariaDB in a namespace of their own, whose only link is the rig's bridge
    ns = f"/run/netns/{os.environ.get('RIG_TAG', 'mldrig')}db"
    links = subprocess.run(["nsenter", f"--net={ns}", "ip", "-o", "-4", "addr"], capture_output=True, text=True,
                           check=True).stdout
    assert sorted(line.split()[1] for line in links.splitlines()) == ["eth0", "lo"], links
    assert f"inet {bridge.rsplit('.', 1)[0]}.2/24" in links
    inside: dict[int, set[str]] = {}
    for line in subprocess.run(["nsenter", f"--net={ns}", "ss", "-ltnH"], capture_output=True, text=True,
                               check=True).stdout.splitlines():
        address, _, port = line.split()[3].rpartition(":")
        inside.setdefault(int(port), set()).add(address)
    dbd = int(os.environ.get("SLURMDBD_PORT", "6819"))
    assert inside.get(3306) == {"127.0.0.1"} and inside.get(dbd) == {"0.0.0.0"}, inside  # MariaDB on loopback only
    assert rig_slurm.run(["sacct", "-n", "-X", "-S", "now-1minute"]).returncode == 0  # sacct reaches slurmdbd


def test_bad_hostkey_host_presents_another_key(rig_ssh: SshRig) -> None:
    import paramiko

    bad = rig_ssh.bad_hostkey_host
    proc = rig_ssh.ssh(bad, "true")
    assert proc.returncode == 255
    # what the sshd really presents: the bad key, not the one known_hosts lists for it
    transport = paramiko.Transport((bad.address, bad.port))
    try:
        transport.start_client(timeout=30)
        presented = transport.get_remote_server_key().get_base64()
    finally:
        transport.close()
    assert presented == rig_ssh.bad_host_key_pub.read_text().split()[1]
    assert presented != rig_ssh.host_key_pub.read_text().split()[1]
    with pytest.raises(paramiko.BadHostKeyException):
        _paramiko_run(rig_ssh, bad, "true")
    # the same sshd with the right key accepted would let us in: only the key is wrong
    client = paramiko.SSHClient()
    client.get_host_keys().add(f"[{bad.address}]:{bad.port}", "ssh-ed25519",
                               paramiko.Ed25519Key(data=base64.b64decode(presented)))
    client.connect(bad.address, port=bad.port, username="root", key_filename=str(rig_ssh.client_key),
                   look_for_keys=False, allow_agent=False, timeout=30)
    client.close()


def test_alt_client_key_is_refused(rig_ssh: SshRig) -> None:
    import paramiko

    assert rig_ssh.alt_client_key.exists()
    with pytest.raises(paramiko.AuthenticationException):
        _paramiko_run(rig_ssh, rig_ssh.hosts[0], "true", key=rig_ssh.alt_client_key)
    h = rig_ssh.hosts[0]
    proc = subprocess.run(["ssh", "-F", "/dev/null", "-p", str(h.port), "-i", str(rig_ssh.alt_client_key),
                           "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes", "-o", f"UserKnownHostsFile={rig_ssh.known_hosts}",
                           f"root@{h.address}", "true"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 255 and "Permission denied" in proc.stderr


def test_hostfile(rig_ssh: SshRig, tmp_path: Path) -> None:
    path = rig_ssh.hostfile(rig_ssh.hosts[:2], path=tmp_path / "hosts")
    assert path.read_text() == f"{rig_ssh.hosts[0].name}\n{rig_ssh.hosts[1].name}\n"
    path = rig_ssh.hostfile(rig_ssh.nodes, style="address", slots=2)
    assert path.read_text().splitlines()[0] == f"{rig_ssh.nodes[0].address}:22 slots=2"
    path.unlink()


# ----------------------------------------------------------------------------- netns nodes


def test_rig_nodes_run_inside_their_namespaces(rig_nodes: list[NetnsNode]) -> None:
    for node in rig_nodes:
        proc = node.run(["sh", "-c", "hostname; cat /proc/1/comm; ip -4 -o addr show dev eth0"])
        assert proc.returncode == 0, proc.stderr
        name, init, addr = proc.stdout.splitlines()
        assert (name, init) == (node.name, "bash")
        assert f" {node.ip}/" in addr
        assert node.root_pid(1) == node.init_pid


# ----------------------------------------------------------------------------- slurm


def test_srun_runs_on_every_slurm_node(rig_slurm: SlurmRig) -> None:
    n = len(rig_slurm.nodes)
    assert n == 3
    proc = rig_slurm.run(["srun", "-N", str(n), "--ntasks-per-node=1", "-l", "--gres=gpu:0", "-t", "1",
                          "sh", "-c", "echo $(hostname) $SLURM_NODEID"], timeout=60)
    assert proc.returncode == 0, proc.stderr
    hosts = sorted(line.split(": ", 1)[1].split()[0] for line in proc.stdout.splitlines())
    assert hosts == rig_slurm.nodes
    # the fake GPUs are real GRES to Slurm
    assert rig_slurm.gpus_per_node == 2
    proc = rig_slurm.run(["srun", "-N", "1", "--gres=gpu:2", "-t", "1", "sh", "-c",
                          "echo $CUDA_VISIBLE_DEVICES"], timeout=60)
    assert (proc.returncode, proc.stdout.strip()) == (0, "0,1"), proc.stderr


def test_sbatch_wait_running_cancel(rig_slurm: SlurmRig) -> None:
    job = rig_slurm.sbatch(["sleep", "300"], nodes=2)
    try:
        rig_slurm.wait_running(job, timeout=60)
        proc = rig_slurm.run(["squeue", "-h", "-j", job, "-o", "%T %D"])
        assert proc.stdout.split() == ["RUNNING", "2"]
        proc = rig_slurm.run(["srun", f"--jobid={job}", "--overlap", "-N", "2", "-l", "pgrep", "-f", "bin/sleep 300$"])
        assert proc.returncode == 0 and len(proc.stdout.splitlines()) == 2, proc.stderr
    finally:
        rig_slurm.cancel(job)
    assert not rig_slurm.run(["squeue", "-h", "-j", job]).stdout.strip()


# ----------------------------------------------------------------------------- hung jobs


def _stacks(pid: int) -> str:
    """Function names on the main thread's Python stack (py-spy dump)."""
    require(os.path.exists(PY_SPY), "py-spy")
    proc = subprocess.run([PY_SPY, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _assert_hangs(job: HungJob, seconds: float = 1) -> None:
    time.sleep(seconds)
    assert all(job.alive().values()), job.alive()
    for rank, pid in job.root_pids.items():
        stack = _stacks(pid)
        if rank == job.odd_rank:
            assert f"{job.odd_function} (" in stack and "all_reduce" not in stack.split("main (")[0]
        elif job.odd_rank is None:
            assert "recv (" in stack
        else:
            assert "all_reduce (" in stack and job.odd_function not in stack


def _assert_killed(job: HungJob) -> None:
    pids = list(job.root_pids.values())
    job.kill()
    assert not any(job.alive().values())
    assert job.processes() == []
    assert not any(_alive(p) for p in pids)


def test_hung_job_nodes_spread_over_netns_nodes(hung_job, rig_nodes: list[NetnsNode]) -> None:
    job = hung_job(nranks=2, where="nodes", nodes=2, odd_rank=-1)
    assert job.odd_rank is None
    assert {r: h for r, (h, _) in job.ranks.items()} == {0: "node1", 1: "node2"}
    assert job.master_addr == rig_nodes[0].ip
    for rank, (host, pid) in job.ranks.items():
        node = next(n for n in rig_nodes if n.name == host)
        assert node.root_pid(pid) == job.root_pids[rank] != pid
        ps = node.run(["ps", "-o", "args=", "-p", str(pid)]).stdout
        assert "hung_worker.py" in ps
    _assert_hangs(job)
    _assert_killed(job)


# ----------------------------------------------------------------------------- bring-up / teardown


def _rig_processes(base: str) -> list[str]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                args = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if base in args and state != "Z":
                out.append(f"{entry} {args}")
    return out


def test_second_rig_is_idempotent_and_leaves_nothing(rig_ssh: SshRig, rig_slurm: SlurmRig) -> None:
    """A second rig (own base dir, tag, ports, subnet) beside the main one: up twice keeps the same
    daemons, down stops all of them and nothing of the main rig."""
    import tempfile

    base = tempfile.mkdtemp(prefix="mldrig-t-", dir="/tmp")  # short: munge's socket path is limited
    rig = REPO / "tests" / "rig"
    env = {**os.environ, "RIG_BASE": base, "RIG_TAG": "mldtst", "SSH_PORTS": "3222 3223",
           "SSH_BAD_PORT": "3226", "NET_PREFIX": "10.213.9", "SLURMCTLD_PORT": "7817", "NODES": "2"}

    def sh(script: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", str(rig / script)], capture_output=True, text=True, timeout=180, env=env)

    try:
        up = sh("up.sh")
        assert up.returncode == 0, up.stdout + up.stderr
        first = sorted(_rig_processes(base))
        assert len([p for p in first if "sshd -f" in p]) == 5  # 2 ports + bad host + 2 nodes
        again = sh("up.sh")
        assert again.returncode == 0, again.stdout + again.stderr
        assert "already up" in again.stdout
        assert sorted(_rig_processes(base)) == first
        proc = subprocess.run(["ssh", "-F", f"{base}/ssh/ssh_config", "node2", "hostname"], capture_output=True,
                              text=True, timeout=60)
        assert proc.stdout.strip() == "node2", proc.stderr
    finally:
        down = sh("down.sh")
    assert down.returncode == 0, down.stdout + down.stderr
    assert _rig_processes(base) == []
    assert "mldtst" not in subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert sh("down.sh").returncode == 0  # idempotent
    # the main rig is untouched
    assert rig_ssh.ssh(rig_ssh.nodes[0], "hostname").stdout.strip() == "node1"
    assert rig_slurm.run(["scontrol", "ping"]).stdout.count("UP") == 1
    shutil.rmtree(base, ignore_errors=True)
