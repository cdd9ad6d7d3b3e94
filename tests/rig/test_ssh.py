"""`mldebug exec` and the fan-out runner over real sshd (the rig's loopback ports and netns nodes)."""

from __future__ import annotations

import json
import socket
import uuid
from pathlib import Path

import jsonschema
import pytest

from ml_debug.cli.app import run
from ml_debug.remote.runner import connections, run_everywhere, run_mldebug_everywhere
from ml_debug.remote.targets import Target, TargetSpec
from tests.conftest import REPO, closed_port, mldebug
from tests.rig.fixtures import SshRig

pytestmark = pytest.mark.rig

SCHEMA = json.loads((REPO / "ml_debug" / "schemas" / "exec.json").read_text())


def _exec_json(*args: str, timeout: float = 60) -> tuple[int, dict]:
    proc = mldebug("exec", "--json", *args, timeout=timeout)
    assert proc.stdout.strip(), proc.stderr
    doc = json.loads(proc.stdout)
    jsonschema.validate(doc, SCHEMA)
    return proc.returncode, doc


def test_exec_reaches_every_rig_host_in_parallel(rig_ssh: SshRig) -> None:
    hosts = [*rig_ssh.hosts, *rig_ssh.nodes]
    hostfile = rig_ssh.hostfile(hosts)
    # Each node prints its hostname, the port it was reached on, and when its 5 s sleep ran.
    script = 'echo "$(hostname) ${SSH_CONNECTION##* } $(date +%s.%N)"; sleep 5; date +%s.%N'
    code, doc = _exec_json("--hosts", str(hostfile), "--ssh-config", str(rig_ssh.ssh_config),
                           "--node-timeout", "20", "--", "sh", "-c", script)
    assert code == 0, doc["result"]["summary"]
    result = doc["result"]
    assert result["ok"] and result["transport"] == "ssh"
    nodes = {n["host"]: n for n in result["nodes"]}
    assert list(nodes) == [h.name for h in hosts]
    starts, ends = [], []
    for h in hosts:
        first, last = nodes[h.name]["stdout"].splitlines()
        name, port, start = first.split()
        assert int(port) == h.port
        if h in rig_ssh.nodes:
            assert name == h.name  # a netns node answers with its own hostname
        starts.append(float(start))
        ends.append(float(last))
    # In parallel: every node had started its sleep before the first one finished.
    assert max(starts) < min(ends)


def test_prefixed_and_grouped_output(rig_ssh: SshRig, tmp_path: Path) -> None:
    cfg = str(rig_ssh.ssh_config)
    names = ",".join(h.name for h in rig_ssh.hosts[:2])
    proc = mldebug("exec", "--hosts", names, "--ssh-config", cfg, "--", "echo", "same", timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.splitlines()) == sorted(f"[{h.name}] same" for h in rig_ssh.hosts[:2])
    out = tmp_path / "out"
    proc = mldebug("exec", "--group", "--hosts", names, "--ssh-config", cfg, "--out-dir", str(out), "--",
                   "echo", "same", timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    # A node's shell start-up may write to stderr (CI's root runs `pyenv init` in .bashrc, and two at once
    # print rehash errors), and a node's stderr is part of what --group compares: the nodes are one group
    # exactly when what they wrote is the same.
    said = {h.name: json.loads((out / f"{h.name}.json").read_text()) for h in rig_ssh.hosts[:2]}
    assert all(node["stdout"] == "same\n" for node in said.values()), said
    if len({node["stderr"] for node in said.values()}) == 1:
        assert lines[1] == "p[2222-2223] (2)" and lines[3] == "same" and len(lines) == 4 + said['p2222']['stderr'].count('\n'), proc.stdout
    else:
        assert [ln for ln in lines if ln.endswith(" (1)")] == ["p2222 (1)", "p2223 (1)"], proc.stdout


def test_each_failure_has_its_own_reason_and_the_rest_succeed(rig_ssh: SshRig, tmp_path: Path) -> None:
    ok, hang = rig_ssh.hosts[0], rig_ssh.hosts[1]
    # A port that accepts TCP (the kernel completes the handshake) and then never says a word.
    stall = socket.socket()
    stall.bind(("127.0.0.1", 0))
    stall.listen(8)
    bad = rig_ssh.bad_hostkey_host
    with closed_port() as down:  # held bound, never listening: refused for the whole test
        common = f"  User root\n  IdentitiesOnly yes\n  UserKnownHostsFile {rig_ssh.known_hosts}\n"
        cfg = tmp_path / "ssh_config"
        cfg.write_text(
            f"Host ok\n  HostName {ok.address}\n  Port {ok.port}\n  IdentityFile {rig_ssh.client_key}\n{common}"
            f"Host hang\n  HostName {hang.address}\n  Port {hang.port}\n  IdentityFile {rig_ssh.client_key}\n{common}"
            f"Host down\n  HostName 127.0.0.1\n  Port {down}\n  IdentityFile {rig_ssh.client_key}\n{common}"
            f"Host badkey\n  HostName {bad.address}\n  Port {bad.port}\n  IdentityFile {rig_ssh.client_key}\n{common}"
            f"Host refused\n  HostName {ok.address}\n  Port {rig_ssh.hosts[2].port}\n"
            f"  IdentityFile {rig_ssh.alt_client_key}\n{common}"
            f"Host node\n  HostName {rig_ssh.nodes[0].address}\n  IdentityFile {rig_ssh.client_key}\n{common}"
            f"Host stall\n  HostName 127.0.0.1\n  Port {stall.getsockname()[1]}\n{common}")
        marker = f"mldebug-hang-{uuid.uuid4().hex[:8]}"
        # Only the host reached on the "hang" port sleeps past the timeout.
        script = f'case "${{SSH_CONNECTION##* }}" in {hang.port}) exec -a {marker} sleep 60;; esac; echo fine'
        try:
            code, doc = _exec_json("--hosts", "ok,hang,down,badkey,refused,node,stall", "--ssh-config", str(cfg),
                                   "--node-timeout", "8", "--connect-timeout", "5", "--", "bash", "-c", script)
        finally:
            stall.close()
    assert code == 4
    nodes = {n["host"]: n for n in doc["result"]["nodes"]}
    assert nodes["ok"]["failure"] is None and nodes["ok"]["stdout"] == "fine\n"
    assert nodes["node"]["failure"] is None and nodes["node"]["stdout"] == "fine\n"
    assert nodes["hang"]["failure"] == "timed out"
    assert 8 <= nodes["hang"]["duration_s"] < 20  # cut off at the timeout, not at the sleep's end
    assert nodes["down"]["failure"] == "unreachable" and "refused" in nodes["down"]["detail"]
    assert nodes["badkey"]["failure"] == "host key mismatch"
    assert nodes["refused"]["failure"] == "auth failed"
    assert nodes["stall"]["failure"] == "unreachable" and "banner" in nodes["stall"]["detail"]
    assert nodes["stall"]["duration_s"] < 15  # one budget for the whole handshake
    counts = doc["result"]["counts"]
    assert (counts["ok"], counts["timed_out"], counts["unreachable"], counts["host_key_mismatch"],
            counts["auth_failed"]) == (2, 1, 2, 1, 1)
    assert not doc["result"]["ok"]


def test_human_summary_names_each_failure(rig_ssh: SshRig) -> None:
    with closed_port() as down:
        proc = mldebug("exec", "--hosts", f"{rig_ssh.hosts[0].name},127.0.0.1:{down}", "--ssh-config",
                       str(rig_ssh.ssh_config), "--connect-timeout", "3", "--", "true", timeout=60)
    assert proc.returncode == 4
    assert f"127.0.0.1:{down}: unreachable: 127.0.0.1:{down}: connection refused" in proc.stderr
    assert "1/2 nodes ok" in proc.stderr


def test_a_failing_command_is_exit_1(rig_ssh: SshRig) -> None:
    code, doc = _exec_json("--hosts", rig_ssh.hosts[0].name, "--ssh-config", str(rig_ssh.ssh_config),
                           "--", "sh", "-c", "echo out; echo err >&2; exit 3")
    assert code == 1
    node = doc["result"]["nodes"][0]
    assert (node["exit_code"], node["stdout"], node["failure"]) == (3, "out\n", "command failed")
    assert node["stderr"].endswith("err\n")  # after whatever the node's shell start-up printed


def test_metacharacters_reach_the_remote_side_literally(rig_ssh: SshRig, tmp_path: Path, capsys) -> None:
    pwned = tmp_path / "pwned"
    nasty = [f"a;touch {pwned}", f"$(touch {pwned})", f"`touch {pwned}`", "it's", '"dq"', "x && y", "*", "$HOME"]
    code, doc = _exec_json("--hosts", rig_ssh.hosts[0].name, "--ssh-config", str(rig_ssh.ssh_config),
                           "--", "printf", "%s\\n", *nasty)
    assert code == 0
    assert doc["result"]["nodes"][0]["stdout"].splitlines() == nasty
    assert not pwned.exists()
    # Host names with shell metacharacters are refused before anything runs (ProxyCommand/%h and
    # srun would see them): exit 2, one line, nothing executed.
    hostfile = tmp_path / "hosts"
    for bad in (f"p2222;touch {pwned}", f"p2222$(touch {pwned})", f"`touch {pwned}`", "p2222'x"):
        hostfile.write_text(f"{bad}\n")
        assert run(["exec", "--hosts", str(hostfile), "--ssh-config", str(rig_ssh.ssh_config), "--", "true"]) == 2
        err = capsys.readouterr().err
        assert "is not a valid host name" in err and f"{hostfile}:1" in err
        assert run(["exec", "--hosts", bad, "--ssh-config", str(rig_ssh.ssh_config), "--", "true"]) == 2
    assert not pwned.exists()


def test_out_dir_gets_one_file_per_node(rig_ssh: SshRig, tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = mldebug("exec", "--hosts", "p[2222-2223]", "--ssh-config", str(rig_ssh.ssh_config),
                   "--out-dir", str(out), "--", "echo", "hello", timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["p2222.json", "p2222.out", "p2223.json", "p2223.out"]
    # The .out file is the node's stdout, then its stderr. A node's shell start-up may write to stderr
    # (CI's root runs `pyenv init` in .bashrc, and two of them at once print rehash errors), so
    # stdout is checked exactly and stderr only for where it goes.
    for name in ("p2222", "p2223"):
        node = json.loads((out / f"{name}.json").read_text())
        assert (node["exit_code"], node["stdout"]) == (0, "hello\n")
        assert (out / f"{name}.out").read_text() == node["stdout"] + node["stderr"]


def _spec(rig: SshRig, *targets: Target, **kw) -> TargetSpec:
    return TargetSpec(kind="ssh", targets=list(targets), ssh_config=rig.ssh_config, **kw)


def test_connections_are_reused_within_a_run(rig_ssh: SshRig, tmp_path: Path) -> None:
    h = rig_ssh.hosts[0]
    cfg = tmp_path / "ssh_config"
    cfg.write_text(f"Host a b\n  HostName {h.address}\n  Port {h.port}\n  User root\n  IdentitiesOnly yes\n"
                   f"  IdentityFile {rig_ssh.client_key}\n  UserKnownHostsFile {rig_ssh.known_hosts}\n")
    by_alias, by_address = Target("a"), Target("b")
    spec = TargetSpec(kind="ssh", targets=[by_alias, by_address], ssh_config=cfg)
    with connections(spec) as pool:
        first = pool.client(by_alias)
        results = run_everywhere(spec, ["echo", "one"], timeout_s=20, pool=pool)
        results += run_everywhere(spec, ["echo", "two"], timeout_s=20, pool=pool)
        assert [r.stdout for r in results] == ["one\n", "one\n", "two\n", "two\n"]
        assert pool.client(by_alias) is first  # the same connection served both runs
        # Two targets never share one (sshd caps sessions per connection), even on one sshd.
        assert pool.client(by_address) is not first


def test_identity_option_and_insecure_opt_out(rig_ssh: SshRig, tmp_path: Path) -> None:
    h = rig_ssh.hosts[0]
    target = Target(h.address, port=h.port, user="root")
    empty_cfg = tmp_path / "empty_config"
    empty_cfg.write_text("")
    # Not in ~/.ssh/known_hosts: refused by default ...
    spec = TargetSpec(kind="ssh", targets=[target], ssh_config=empty_cfg, identities=[rig_ssh.client_key])
    [r] = run_everywhere(spec, ["true"], timeout_s=10)
    assert r.failure == "host key mismatch" and "not in known_hosts" in r.detail
    # ... and accepted only with the loudly named opt-out.
    spec.insecure_no_host_key_check = True
    [r] = run_everywhere(spec, ["echo", "in"], timeout_s=10)
    assert r.ok and r.stdout == "in\n"


def test_agent_pattern_parses_each_nodes_json(rig_ssh: SshRig, tmp_path: Path) -> None:
    venv_python = str(Path(REPO) / ".venv" / "bin" / "python")
    hosts = [Target(h.name) for h in rig_ssh.hosts[:2]]
    # A non-interactive ssh shell does not have the venv on PATH: a clear error, not a traceback.
    [missing, _] = run_mldebug_everywhere(_spec(rig_ssh, *hosts), ["env"], timeout_s=60, add_local=False)
    assert missing.document is None and "mldebug is not installed on" in missing.error
    assert "--remote-python" in missing.error
    # Either way of finding it works (one host each; the Slurm test merges documents from several nodes).
    for host, kw in ((hosts[0], {"remote_python": venv_python}),
                     (hosts[1], {"remote_prefix": f"source {Path(venv_python).parent / 'activate'}"})):
        [r] = run_mldebug_everywhere(_spec(rig_ssh, host, **kw), ["env", "--no-torch"], timeout_s=90,
                                     add_local=False)
        assert r.error is None, r
        assert r.document["schema"] == "mldebug.env" and r.node.host == host.label
    # A node whose shell start-up prints a banner (a .bashrc's `echo`, `module load` chatter) still
    # answers: the version line is looked for past it.
    banner = f"echo 'Welcome to {hosts[0].label}'; echo '{{ module: cuda/12 }}'; echo 'mldebug rocks' >&2"
    [chatty] = run_mldebug_everywhere(_spec(rig_ssh, hosts[0], remote_python=venv_python,
                                            remote_prefix=banner), ["env", "--no-torch"], timeout_s=90,
                                      add_local=False)
    assert chatty.error is None, chatty
    assert chatty.document["schema"] == "mldebug.env"
    # Another version on the far side is named as such.
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "mldebug").write_text('#!/bin/sh\necho "mldebug 0.0.1"\necho "{}"\n')
    (fake / "mldebug").chmod(0o755)
    [old] = run_mldebug_everywhere(_spec(rig_ssh, hosts[0], remote_prefix=f"PATH={fake}:$PATH"), ["env"],
                                   timeout_s=30, add_local=False)
    assert "runs mldebug 0.0.1" in old.error


def test_proxyjump_from_the_ssh_config(rig_ssh: SshRig, tmp_path: Path) -> None:
    jump, target = rig_ssh.nodes[0], rig_ssh.nodes[1]
    common = (f"  User root\n  IdentitiesOnly yes\n  IdentityFile {rig_ssh.client_key}\n"
              f"  UserKnownHostsFile {rig_ssh.known_hosts}\n")
    cfg = tmp_path / "ssh_config"
    cfg.write_text(f"Host jump\n  HostName {jump.address}\n{common}"
                   f"Host behind\n  HostName {target.address}\n  ProxyJump jump\n{common}")
    spec = TargetSpec(kind="ssh", targets=[Target("behind")], ssh_config=cfg)
    [r] = run_everywhere(spec, ["sh", "-c", 'echo "$(hostname) ${SSH_CONNECTION%% *}"'], timeout_s=30)
    assert r.ok, r
    # The target node saw the connection come from the jump node, not from this machine.
    assert r.stdout.split() == [target.name, jump.address]
