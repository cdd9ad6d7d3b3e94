"""remote/ssh directly: the pool against the rig's real sshd (config applied, one connection reused,
status and both streams back, a deadline that stops the far side), and remote_deadline's shell text
run by a real shell."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from ml_debug.remote.result import HOST_KEY_MISMATCH, TIMED_OUT
from ml_debug.remote.ssh import SshPool, remote_deadline
from ml_debug.remote.targets import Target, TargetSpec
from tests.conftest import wait_until
from tests.rig.fixtures import SshRig


def _alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def test_the_pool_applies_the_ssh_config_and_reuses_one_connection(rig_ssh: SshRig) -> None:
    host = rig_ssh.hosts[0]
    spec = TargetSpec(kind="ssh", targets=[Target(host.name)], ssh_config=rig_ssh.ssh_config)
    pool = SshPool(spec, connect_timeout_s=10)
    try:
        ep = pool.endpoint(Target(host.name))
        assert (ep.hostname, ep.port, ep.user, ep.identities_only) == (host.address, host.port, "root", True)
        assert ep.known_hosts[0] == str(rig_ssh.known_hosts)
        assert pool.endpoint(Target(host.name, port=2299, user="me")).where == f"{host.address}:2299"  # like ssh -p
        t = Target(host.name)
        first = pool.run(t, "echo out; echo err >&2; exit 3", timeout_s=30)
        assert (first.exit_code, first.stdout, first.stderr, first.ok) == (3, "out\n", "err\n", False)
        assert first.detail == "exit status 3"
        client = pool.client(t)
        again = pool.run(t, "echo $((6 * 7))", timeout_s=30)
        assert again.ok and again.stdout == "42\n" and pool.client(t) is client  # the same connection
    finally:
        pool.close()


def test_at_the_deadline_the_far_command_is_stopped_not_left_running(rig_ssh: SshRig) -> None:
    host = rig_ssh.hosts[0]  # a loopback sshd: its processes are visible here
    spec = TargetSpec(kind="ssh", targets=[Target(host.name)], ssh_config=rig_ssh.ssh_config)
    pool = SshPool(spec, connect_timeout_s=10)
    try:
        t0 = time.monotonic()
        # 10 s: the login shell (CI's root runs pyenv init in .bashrc) must print before the deadline on a loaded node
        r = pool.run(Target(host.name), "echo $$; exec sleep 300", timeout_s=10)
        assert r.failure == TIMED_OUT and "still running after 10 s" in r.detail and time.monotonic() - t0 < 40
        assert r.stdout.strip(), (r.stdout, r.stderr)
        pid = int(r.stdout.split()[0])  # what it printed before the deadline is kept
        wait_until(lambda: not _alive(pid), 30, "the far side's sleep to be stopped when the session closed")
    finally:
        pool.close()


def test_a_changed_host_key_refuses_the_host(rig_ssh: SshRig) -> None:
    bad = rig_ssh.bad_hostkey_host
    spec = TargetSpec(kind="ssh", targets=[Target(bad.address, port=bad.port, user="root")],
                      identities=[rig_ssh.client_key], ssh_config=rig_ssh.ssh_config)
    pool = SshPool(spec, connect_timeout_s=10)
    try:
        r = pool.run(spec.targets[0], "echo should-not-run", timeout_s=30)
    finally:
        pool.close()
    assert r.failure == HOST_KEY_MISMATCH and r.stdout == ""


def test_remote_deadline_runs_the_script_and_ends_it_when_its_stdin_closes() -> None:
    # the session stays open (stdin a pipe that is never written): the script runs to its end, its status kept
    done = subprocess.Popen(["sh", "-c", remote_deadline("echo 'a;b'; exit 4", 30)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert done.stdout is not None and done.stdin is not None
    assert done.stdout.read() == "a;b\n" and done.wait(timeout=60) == 4
    done.stdin.close()
    done.stdout.close()
    # the session closing (stdin at EOF) stops a command that would run for 5 minutes
    proc = subprocess.Popen(["sh", "-c", remote_deadline("sleep 300", 600)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    time.sleep(0.5)  # let the watcher start reading stdin (an EOF before that is read the same way)
    assert proc.poll() is None
    assert proc.stdin is not None
    proc.stdin.close()
    assert proc.wait(timeout=30) != 0
    proc.stdout.close()  # type: ignore[union-attr]
    proc.stderr.close()  # type: ignore[union-attr]
