"""mldebug as root against a job of another user: every path the job controls is a possible attack.

Each test starts the "job" as `nobody` (runuser, the system Python, tests/jobs/security_job.py), lets it
plant what an attacker would (a symbolic link to a root-only file, a FIFO where a file belongs, a
huge file, a crafted core), runs the real `mldebug` as root, and checks three things: the path is
refused with its reason in the report (JSON and human), the root-owned victim is byte-identical
with the same mtime, and the rest of the report is complete (every rank's stack, the honest ranks'
Flight Recorder data).
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO, mldebug, require, require_module, validate_schema, wait_in_function

SYSTEM_PYTHON = "/usr/bin/python3"
RUNUSER = shutil.which("runuser") or "runuser"
JOB = REPO / "tests" / "jobs" / "security_job.py"
GOLDEN = REPO / "tests" / "golden" / "flight_recorder"


def _nobody() -> pwd.struct_passwd:
    require(os.geteuid() == 0, "root (these tests attack root from an unprivileged job)")
    require(shutil.which("runuser"), "runuser")
    require(os.access(SYSTEM_PYTHON, os.X_OK), SYSTEM_PYTHON)
    try:
        return pwd.getpwnam("nobody")
    except KeyError:
        require(False, "a 'nobody' user")
        raise


@pytest.fixture
def area() -> Iterator[Path]:
    """A root-owned 0755 directory in /tmp (pytest's own tmp dirs are 0700: nobody could not enter)."""
    d = Path(tempfile.mkdtemp(prefix="mldebug-sec-", dir="/tmp"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)  # rmtree removes links, never what they point to


@dataclass
class Victim:
    """A root-only file that the job's user must not be able to make root touch."""

    path: Path
    data: bytes
    mtime_ns: int

    def assert_untouched(self) -> None:
        st = os.lstat(self.path)
        assert (st.st_uid, st.st_mtime_ns) == (0, self.mtime_ns), f"{self.path} was touched"
        assert self.path.read_bytes() == self.data, f"{self.path} was modified"


def make_victim(area: Path, name: str, data: bytes, future: bool = False) -> Victim:
    """`future`: an mtime ahead of now, so that code trusting "newer than the trigger" would read it."""
    d = area / "root-only"
    d.mkdir(mode=0o700, exist_ok=True)
    p = d / name
    p.write_bytes(data)
    p.chmod(0o600)
    if future:
        t = time.time() + 3600
        os.utime(p, (t, t))
    return Victim(p, data, os.lstat(p).st_mtime_ns)


def victim_dump(marker: str) -> bytes:
    """A valid Flight Recorder dump: if mldebug ever read the victim, its marker would show in the report."""
    dump = json.loads((GOLDEN / "fr-0.json").read_bytes())
    for e in dump["entries"]:
        e["profiling_name"] = marker
    return json.dumps(dump).encode()


class Job:
    """Ranks of one job, each a `runuser -u nobody -- python3 security_job.py ROLE ...` process."""

    def __init__(self, area: Path, world: int) -> None:
        self.nobody = _nobody()
        self.dir = area / "job"
        self.dir.mkdir(mode=0o755)
        os.chown(self.dir, self.nobody.pw_uid, self.nobody.pw_gid)
        self.world = world
        self.procs: list[subprocess.Popen[bytes]] = []
        self.pids: dict[int, int] = {}  # rank -> the Python process's pid
        self.log = area / "job.log"

    def start(self, rank: int, role: str, env: dict[str, str], plant: tuple[str, ...] = (),
              golden: Path | None = None, script: Path = JOB) -> int:
        ready = self.dir / f"ready-{rank}"
        argv = [RUNUSER, "-u", "nobody", "--", SYSTEM_PYTHON, str(script), role, str(ready),
                *([str(golden)] if golden else []), "--", *plant]
        full_env = {"PATH": "/usr/bin:/bin", "RANK": str(rank), "WORLD_SIZE": str(self.world), **env}
        with open(self.log, "ab") as log:
            proc = subprocess.Popen(argv, env=full_env, cwd=self.dir, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=log, start_new_session=True)
        self.procs.append(proc)
        deadline = time.monotonic() + 30
        while not ready.exists():
            assert proc.poll() is None, f"rank {rank} ended early: {self.log.read_text()}"
            assert time.monotonic() < deadline, f"rank {rank} never got ready: {self.log.read_text()}"
            time.sleep(0.02)
        pid = json.loads(ready.read_text())["pid"]
        assert os.stat(f"/proc/{pid}").st_uid == self.nobody.pw_uid
        self.pids[rank] = pid
        return pid

    def pid_args(self) -> list[str]:
        return [a for pid in self.pids.values() for a in ("--pid", str(pid))]

    def stop(self) -> None:
        for pid in self.pids.values():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for proc in self.procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=15)
        for pid in self.pids.values():
            assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]


@pytest.fixture
def job_factory(area: Path) -> Iterator[object]:
    jobs: list[Job] = []

    def make(world: int) -> Job:
        job = Job(area, world)
        jobs.append(job)
        return job

    yield make
    for job in jobs:
        job.stop()


def dump_stacks(job: Job, *extra: str) -> tuple[dict, str]:
    """The JSON result (schema-checked) and the human view of one `dump-stacks --local` on the job."""
    args = ["dump-stacks", "--local", *job.pid_args(), "--fr-timeout", "5", *extra]
    proc = mldebug(*args, "--json", timeout=180)
    assert proc.stdout.strip(), proc.stderr
    doc = json.loads(proc.stdout)
    validate_schema(doc, "dump-stacks")
    human = mldebug(*args, timeout=180)
    assert human.stdout.strip(), human.stderr
    return doc["result"], human.stdout


def assert_complete(result: dict, job: Job, ok_ranks: set[int]) -> dict[int, dict]:
    """Every rank's stack was taken (in the job's loop) and the honest ranks' Flight Recorder was read."""
    procs = {p["pid"]: p for p in result["processes"]}
    for rank, pid in job.pids.items():
        p = procs[pid]
        assert p["state"] != "not-dumped", (rank, p["error"])
        names = {f["name"] for s in p["samples"] if s["ok"] for t in s["threads"] for f in t["frames"]}
        assert "job_main_loop" in names, (rank, names)
    fr = {r["rank"]: r for r in result["flight_recorder"]["ranks"]}
    assert set(fr) == set(job.pids), fr
    for rank in ok_ranks:
        assert fr[rank]["ok"], fr[rank]
        assert fr[rank]["process_groups"][0]["last_enqueued"]["op"] == "gloo:all_reduce"
    return fr


def assert_refused(fr: dict[int, dict], rank: int, reason: str, human: str) -> None:
    err = fr[rank]["error"] or ""
    assert not fr[rank]["ok"] and err.startswith("refused: ") and reason in err, fr[rank]
    assert reason in human, human


# ---- the NCCL pipe ---------------------------------------------------------------------------------

def test_nccl_pipe_that_is_a_symlink_or_leads_to_root_files_is_refused(area: Path, job_factory) -> None:
    """The issue's attack (p0.pipe -> a root-only file) and its variants: a directory link to a root
    FIFO that has a reader, and a dump file of root's named in the environment."""
    victim = make_victim(area, "root-only-file", b"root's data\n" * 8)
    root_dump = make_victim(area, "nccl_dump_2", victim_dump("READ-ROOTS-FILE"), future=True)
    fifo_dir = area / "root-fifos"
    fifo_dir.mkdir(mode=0o755)
    os.mkfifo(fifo_dir / "p3.pipe", 0o600)
    fifo_reader = os.open(fifo_dir / "p3.pipe", os.O_RDONLY | os.O_NONBLOCK)  # a reader: writes would land
    job = job_factory(4)
    x = job.dir / "x"
    try:
        job.start(0, "idle", {"TORCH_NCCL_DEBUG_INFO_PIPE_FILE": f"{x}/p", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": f"{x}/t"},
                  plant=(f"dir:{x}", f"link:{x}/p0.pipe:{victim.path}"))
        job.start(1, "nccl", {"TORCH_NCCL_DEBUG_INFO_PIPE_FILE": f"{x}/p", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": f"{x}/t"},
                  golden=GOLDEN / "fr-1.json")
        job.start(2, "nccl", {"TORCH_NCCL_DEBUG_INFO_PIPE_FILE": f"{x}/q",
                              "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": str(root_dump.path)[:-1]},
                  golden=GOLDEN / "fr-1.json")
        job.start(3, "idle", {"TORCH_NCCL_DEBUG_INFO_PIPE_FILE": f"{x}/d/p"},
                  plant=(f"link:{x}/d:{fifo_dir}",))

        result, human = dump_stacks(job)

        victim.assert_untouched()
        root_dump.assert_untouched()
        try:
            written = os.read(fifo_reader, 64)
        except BlockingIOError:
            written = b""
        assert written == b"", "mldebug wrote into root's FIFO"
        fr = assert_complete(result, job, ok_ranks={1})
        assert_refused(fr, 0, f"{x}/p0.pipe is a symbolic link (to {victim.path}): not followed", human)
        assert_refused(fr, 2, f"{root_dump.path} belongs to uid 0 (root), not to the job's user", human)
        assert_refused(fr, 3, f"{x}/d/p3.pipe belongs to uid 0 (root)", human)
        assert "READ-ROOTS-FILE" not in json.dumps(result) and "READ-ROOTS-FILE" not in human
    finally:
        os.close(fifo_reader)


# ---- MLDEBUG_FR_DIR: dumps and triggers ------------------------------------------------------------

def test_fr_dump_that_is_a_symlink_or_a_fifo_is_refused_without_reading_or_hanging(area: Path,
                                                                                    job_factory) -> None:
    victim = make_victim(area, "root-only-dump", victim_dump("READ-ROOTS-FILE"), future=True)
    job = job_factory(3)
    fr_dir = job.dir / "fr"
    env = {"MLDEBUG_FR_DIR": str(fr_dir)}
    job.start(0, "idle", env, plant=(f"dir:{fr_dir}", f"link:{fr_dir}/fr-0.json:{victim.path}"))
    job.start(1, "idle", env, plant=(f"fifo:{fr_dir}/fr-1.json",))
    job.start(2, "fr", env, golden=GOLDEN / "fr-1.json")

    result, human = dump_stacks(job)  # a FIFO opened for reading would block: the timeout would fail us

    victim.assert_untouched()
    assert "READ-ROOTS-FILE" not in json.dumps(result) and "READ-ROOTS-FILE" not in human
    fr = assert_complete(result, job, ok_ranks={2})
    assert_refused(fr, 0, f"{fr_dir}/fr-0.json is a symbolic link (to {victim.path}): not followed", human)
    assert_refused(fr, 1, f"{fr_dir}/fr-1.json is a FIFO, not a regular file: not opened", human)
    # the triggers mldebug made were removed (or taken by the rank): none left to fire later
    assert sorted(p.name for p in fr_dir.iterdir() if p.name.startswith("trigger-")) == []


def test_symlinked_trigger_is_refused_and_its_target_is_neither_touched_nor_created(area: Path,
                                                                                     job_factory) -> None:
    victim = make_victim(area, "root-only-file", b"root's data\n")
    absent = victim.path.parent / "would-be-created-by-root"  # e.g. /etc/nologin
    job = job_factory(3)
    fr_dir = job.dir / "fr"
    env = {"MLDEBUG_FR_DIR": str(fr_dir)}
    job.start(0, "idle", env, plant=(f"dir:{fr_dir}", f"link:{fr_dir}/trigger-0:{victim.path}"))
    job.start(1, "fr", env, golden=GOLDEN / "fr-1.json")
    job.start(2, "idle", env, plant=(f"link:{fr_dir}/trigger-2:{absent}",))

    result, human = dump_stacks(job)

    victim.assert_untouched()
    assert not os.path.lexists(absent)
    fr = assert_complete(result, job, ok_ranks={1})
    assert_refused(fr, 0, f"{fr_dir}/trigger-0 is a symbolic link (to {victim.path}): not followed", human)
    assert_refused(fr, 2, f"{fr_dir}/trigger-2 is a symbolic link (to {absent}): not followed", human)
    assert os.path.islink(fr_dir / "trigger-0")  # the job's own link is left as it was


def test_oversized_dump_is_refused_with_its_size(area: Path, job_factory) -> None:
    job = job_factory(2)
    fr_dir = job.dir / "fr"
    env = {"MLDEBUG_FR_DIR": str(fr_dir)}
    job.start(0, "fr-huge", env, plant=(f"dir:{fr_dir}",))  # answers the trigger with a 300 MiB sparse file
    job.start(1, "fr", env, golden=GOLDEN / "fr-1.json")

    result, human = dump_stacks(job)

    fr = assert_complete(result, job, ok_ranks={1})
    assert_refused(fr, 0, f"{fr_dir}/fr-0.json is 300.0 MiB, over the 256.0 MiB limit: not read", human)


# ---- --out-dir -------------------------------------------------------------------------------------

def test_symlink_planted_in_out_dir_is_replaced_not_followed(area: Path, job_factory) -> None:
    victim = make_victim(area, "root-only-file", b"root's data\n")
    job = job_factory(1)
    fr_dir = job.dir / "fr"
    job.start(0, "fr", {"MLDEBUG_FR_DIR": str(fr_dir)}, plant=(f"dir:{fr_dir}",), golden=GOLDEN / "fr-0.json")
    shared = area / "results"  # a results directory that every user may write to
    shared.mkdir()
    shared.chmod(0o777)
    name = f"{socket.gethostname()}.json"

    def plant() -> None:
        subprocess.run([RUNUSER, "-u", "nobody", "--", "ln", "-sfn", str(victim.path), str(shared / name)],
                       check=True, timeout=30)
        assert os.lstat(shared / name).st_uid == job.nobody.pw_uid

    plant()
    proc = mldebug("dump-stacks", "--local", *job.pid_args(), "--fr-timeout", "5", "--out-dir", str(shared),
                   "--json", timeout=180)
    victim.assert_untouched()
    result = json.loads(proc.stdout)["result"]
    note = f"--out-dir: {name} was a symbolic link (to {victim.path}): not followed, replaced by the real file"
    assert note in result["nodes"][0]["notes"], result["nodes"][0]
    assert_complete(result, job, ok_ranks={0})
    written = shared / name
    assert not written.is_symlink() and written.stat().st_uid == 0
    assert json.loads(written.read_text())["result"]["nodes"][0]["notes"] == result["nodes"][0]["notes"]

    plant()
    human = mldebug("dump-stacks", "--local", *job.pid_args(), "--fr-timeout", "5", "--out-dir", str(shared),
                    timeout=180)
    assert note in human.stdout, human.stdout
    victim.assert_untouched()


def test_out_dir_that_is_another_users_symlink_is_a_usage_error(area: Path, job_factory) -> None:
    nobody = _nobody()
    target = area / "root-dir"
    target.mkdir(mode=0o755)
    sticky = area / "tmp"  # like /tmp: anyone may create names
    sticky.mkdir()
    sticky.chmod(0o1777)
    subprocess.run([RUNUSER, "-u", "nobody", "--", "ln", "-s", str(target), str(sticky / "out")], check=True,
                   timeout=30)
    job = job_factory(1)
    job.start(0, "idle", {})
    proc = mldebug("dump-stacks", "--local", *job.pid_args(), "--out-dir", str(sticky / "out"), timeout=180)
    assert list(target.iterdir()) == [], "mldebug wrote into the directory another user's link points to"
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert (f"--out-dir: {sticky / 'out'}: out is a symbolic link (to {target}) owned by uid "
            f"{nobody.pw_uid} (nobody), not by root or uid 0 (root): not followed") in proc.stderr, proc.stderr
    assert list(target.iterdir()) == []


# ---- trace files and core files in the job's directories -------------------------------------------

def test_trace_tail_refuses_a_symlinked_or_fifo_trace_file(area: Path) -> None:
    nobody = _nobody()
    victim = make_victim(area, "root-only-file", b"# nicertrace\nROOT-SECRET-LINE\n")
    traces = area / "traces"
    traces.mkdir(mode=0o755)
    os.chown(traces, nobody.pw_uid, nobody.pw_gid)
    script = (f"import os\n"
              f"for r in (0, 1):\n"
              f"    open('{traces}/trace-h-%d-10%d.txt' % (r, r), 'w').write('# nicertrace pid=10%d host=h rank=%d mode=stream\\n0:00:01.000 train.py:5: step()\\n' % (r, r))\n"
              f"os.symlink('{victim.path}', '{traces}/trace-h-2-102.txt')\n"
              f"os.mkfifo('{traces}/trace-h-3-103.txt')\n")
    subprocess.run([RUNUSER, "-u", "nobody", "--", SYSTEM_PYTHON, "-c", script], check=True, timeout=30)

    proc = mldebug("trace-tail", str(traces), "--json", timeout=120)  # a FIFO opened for reading would block
    assert "ROOT-SECRET-LINE" not in proc.stdout, "trace-tail showed a root-only file"
    doc = json.loads(proc.stdout)
    validate_schema(doc, "trace-tail")
    result = doc["result"]
    skipped = {Path(s["path"]).name: s["reason"] for s in result["skipped"]}
    assert skipped == {
        "trace-h-2-102.txt": f"refused: {traces}/trace-h-2-102.txt is a symbolic link (to {victim.path}): "
                             "not followed",
        "trace-h-3-103.txt": f"refused: {traces}/trace-h-3-103.txt is a FIFO, not a regular file: not opened"}
    assert [f["rank"] for f in result["files"]] == [0, 1]
    assert "ROOT-SECRET-LINE" not in proc.stdout
    human = mldebug("trace-tail", str(traces), timeout=120)
    assert "ROOT-SECRET-LINE" not in human.stdout
    reason = f"{traces}/trace-h-2-102.txt is a symbolic link (to {victim.path}): not followed"
    assert "".join(reason.split()) in "".join(human.stdout.split()), human.stdout  # the summary wraps
    victim.assert_untouched()


def test_core_bt_never_runs_the_jobs_gdb_script_as_root(area: Path) -> None:
    """A core names its executable; python-gdb.py next to it is Python that gdb would run as root.

    The job copies the system Python into its own directory, puts a python3.X-gdb.py beside it that
    writes a marker, and crashes there; core-bt still reads the core (native frames), never runs the
    job's script. A FIFO and a link named like a core are skipped with a note, without blocking."""
    nobody = _nobody()
    pattern = Path("/proc/sys/kernel/core_pattern").read_text().strip()
    require(pattern == "core" or (not pattern.startswith("|") and "/" not in pattern),
            f"core_pattern writing cores in the crashing process's cwd (it is {pattern!r})")
    victim = make_victim(area, "root-only-file", b"not a core\n")
    jobdir = area / "job"
    (jobdir / "bin").mkdir(parents=True)
    real = os.path.realpath(SYSTEM_PYTHON)
    exe = jobdir / "bin" / os.path.basename(real)
    shutil.copy2(real, exe)
    marker = area / "root-ran-the-jobs-script"
    (jobdir / "bin" / f"{exe.name}-gdb.py").write_text(
        f"import os\nopen({str(marker)!r}, 'w').write(str(os.geteuid()))\n")
    for p in [jobdir, *jobdir.rglob("*")]:
        os.chown(p, nobody.pw_uid, nobody.pw_gid, follow_symlinks=False)
    area.chmod(0o777)  # the marker's directory: writable by whoever runs the script

    # runuser's PAM session sets the core limit to 0: the job raises its own soft limit
    crash = subprocess.run([RUNUSER, "-u", "nobody", "--", str(exe), "-c",
                            "import ctypes, resource\n"
                            "hard = resource.getrlimit(resource.RLIMIT_CORE)[1]\n"
                            "resource.setrlimit(resource.RLIMIT_CORE, (hard, hard))\n"
                            "def crash_here():\n    ctypes.string_at(0)\ncrash_here()\n"],
                           cwd=jobdir, env={"PATH": "/usr/bin:/bin", "PYTHONHOME": "/usr"},
                           capture_output=True, timeout=60)
    cores = [p for p in jobdir.iterdir() if p.name.startswith("core") and p.is_file()]
    require(cores, f"a core of the crashed job in {jobdir} (rc {crash.returncode}, {crash.stderr[-300:]!r})")
    subprocess.run([RUNUSER, "-u", "nobody", "--", SYSTEM_PYTHON, "-c",
                    f"import os; os.makedirs('{jobdir}/r1'); os.mkfifo('{jobdir}/r1/core'); "
                    f"os.makedirs('{jobdir}/r2'); os.symlink('{victim.path}', '{jobdir}/r2/core')"],
                   check=True, timeout=30)

    proc = mldebug("core-bt", "--dir", str(jobdir), "--dir", str(jobdir / "r1"), "--dir", str(jobdir / "r2"),
                   "--json", timeout=300)
    doc = json.loads(proc.stdout)
    validate_schema(doc, "core-bt")
    result = doc["result"]
    assert not marker.exists(), f"root ran the job's gdb script (uid {marker.read_text()})"
    assert [Path(c["path"]).name for c in result["cores"]] == [cores[0].name]
    core = result["cores"][0]
    assert core["ok"] and core["executable"] == str(exe) and core["signal"] == "SIGSEGV", core
    assert f"skipped {jobdir}/r1/core is a FIFO, not a regular file: not opened" in result["notes"]
    assert f"skipped {jobdir}/r2/core is a symbolic link (to {victim.path}): not followed" in result["notes"]
    victim.assert_untouched()


def test_nicertrace_does_not_write_through_a_link_planted_at_its_file(area: Path) -> None:
    """`mldebug trace --out-dir` in a shared directory: another user plants the trace file's name."""
    nobody = _nobody()
    victim = make_victim(area, "root-only-file", b"root's data\n")
    shared = area / "traces"
    shared.mkdir()
    shared.chmod(0o1777)
    script = area / "traced.py"
    script.write_text(
        "import os, subprocess, sys\n"
        "from ml_debug.nicertrace import NicerTrace, trace_file_name\n"
        f"link = os.path.join({str(shared)!r}, trace_file_name())\n"
        f"subprocess.run([{RUNUSER!r}, '-u', 'nobody', '--', 'ln', '-s', {str(victim.path)!r}, link], check=True)\n"
        "try:\n"
        f"    NicerTrace(packages_to_include=['__main__'], out_dir={str(shared)!r}).start()\n"
        "except OSError as e:\n"
        "    print('refused:', e.strerror)\n")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                          cwd=area, env={**os.environ, "PYTHONPATH": str(REPO)})
    victim.assert_untouched()
    # ELOOP (O_NOFOLLOW); in a sticky directory the kernel may answer EACCES first (O_CREAT on another's link)
    assert proc.stdout.strip() in ("refused: Too many levels of symbolic links", "refused: Permission denied"), \
        (proc.stdout, proc.stderr)
    links = [p for p in shared.iterdir() if p.is_symlink()]
    assert len(links) == 1 and os.lstat(links[0]).st_uid == nobody.pw_uid


# ---- the walk itself (no job needed) ---------------------------------------------------------------

def test_walk_follows_only_links_of_root_or_the_owner(area: Path) -> None:
    from ml_debug.core import safefs
    from ml_debug.core.safefs import Owner, Refused

    nobody = _nobody()
    job_user = Owner(uid=nobody.pw_uid, gid=nobody.pw_gid, uids=frozenset({nobody.pw_uid}),
                     gids=frozenset({nobody.pw_gid}))
    home = area / "home"
    (home / "real").mkdir(parents=True)
    (home / "real" / "f").write_text("job data")
    for p in (home, home / "real", home / "real" / "f"):
        os.chown(p, nobody.pw_uid, nobody.pw_gid)
    (area / "rootlink").symlink_to(home / "real")  # root's link: followed (like /var/run -> /run)
    os.symlink(home / "real", home / "mine")
    os.chown(home / "mine", nobody.pw_uid, nobody.pw_gid, follow_symlinks=False)  # the job's own: followed
    other = area / "other"
    os.symlink(home / "real", other)
    os.chown(other, 12345, 12345, follow_symlinks=False)  # a third user's: refused

    for path in (f"{area}/rootlink/f", f"{home}/mine/f", f"{home}/real/../real/f"):
        data, _ = safefs.read_untrusted(path, job_user, 100)
        assert data == b"job data"
    with pytest.raises(Refused, match="other is a symbolic link .* owned by uid 12345, not by root or uid"):
        safefs.read_untrusted(f"{other}/f", job_user, 100)
    with pytest.raises(Refused, match="is 8 bytes, over the 4 bytes limit"):
        safefs.read_untrusted(f"{home}/real/f", job_user, 4)
    with pytest.raises(Refused, match="relative path and the process's working directory is unknown"):
        safefs.read_untrusted("real/f", job_user, 100)
    cwd = os.open(home, os.O_PATH | os.O_DIRECTORY)
    try:
        assert safefs.read_untrusted("real/f", job_user, 100, cwd_fd=cwd)[0] == b"job data"
    finally:
        os.close(cwd)
    with pytest.raises(FileNotFoundError):
        safefs.read_untrusted(f"{home}/real/absent", job_user, 100)


# ---- round two: every path mldebug writes (issue 32) -----------------------------------------------

@pytest.fixture
def links_unprotected() -> Iterator[None]:
    """fs.protected_symlinks, fs.protected_regular and fs.protected_hardlinks off, as in many
    containers, restored after: with them on, the kernel itself refuses root a link or a file that
    another user planted in a sticky directory (or refuses that user the hard link), and these
    attacks would fail whatever mldebug did."""
    knobs = [Path(f"/proc/sys/fs/protected_{k}") for k in ("symlinks", "regular", "hardlinks")]
    before = {k: k.read_text().strip() for k in knobs if k.exists()}
    try:
        for k in before:
            if before[k] != "0":
                k.write_text("0\n")
    except OSError as e:
        require(False, f"a writable {e.filename} (to turn the kernel's link protection off for the test)")
    try:
        yield
    finally:
        for k, v in before.items():
            if k.read_text().strip() != v:
                k.write_text(v + "\n")


def sticky_dir(area: Path, name: str = "pub") -> Path:
    """Like /tmp: root's, mode 1777, where any user may create names."""
    d = area / name
    d.mkdir()
    d.chmod(0o1777)
    return d


def plant_link(target: Path, at: Path) -> None:
    """The job's user (nobody) makes the link, so it is theirs."""
    subprocess.run([RUNUSER, "-u", "nobody", "--", "ln", "-s", str(target), str(at)], check=True, timeout=30)
    assert os.lstat(at).st_uid == _nobody().pw_uid


# Every option of every command that names a path mldebug writes, and a command line to reach it.
# `{}` is the path under attack. Each must be refused before any work starts (exit 2).
WRITE_OPTIONS: list[tuple[str, list[str]]] = [
    ("--out-dir", ["dump-stacks", "--local", "--pid", "{pid}", "--out-dir", "{}"]),
    ("--out-dir", ["exec", "--local", "--out-dir", "{}", "--", "true"]),
    ("--out-dir", ["health", "--local", "--out-dir", "{}"]),
    ("--out-dir", ["check", "--out-dir", "{}"]),
    ("--out-dir", ["gpu-test", "--out-dir", "{}"]),
    ("--bundle-dir", ["watch", "--pid", "{pid}", "--bundle-dir", "{}"]),
    ("--bundle-dir", ["drill", "--bundle-dir", "{}"]),
    ("--out-dir", ["trace", "--out-dir", "{}", "--", "/bin/true"]),
    ("--metrics-dir", ["train", "--steps", "1", "--metrics-dir", "{}"]),
    ("--checkpoint-dir", ["train", "--steps", "1", "--checkpoint-dir", "{}"]),
    ("--profile-dir", ["train", "--steps", "1", "--profile-steps", "1:1", "--profile-dir", "{}"]),
    ("--core-dir", ["train", "--steps", "1", "--core-dir", "{}"]),
    ("--log-dir", ["launch", "--log-dir", "{}", "--", "/bin/true"]),
    ("--csv", ["allreduce-bench", "--quick", "--csv", "{}/bench.csv"]),
    ("--plot", ["allreduce-bench", "--quick", "--plot", "{}/bench.png"]),
]
# Not listed: gpu-test's hidden --report-to, which only a rank of `gpu-test --isolate` is given (a file in
# the launcher's private mkdtemp folder); it is written by the same safefs.write_file all the same.


def test_every_write_option_refuses_a_directory_link_planted_in_a_shared_dir(area: Path, links_unprotected,
                                                                              job_factory) -> None:
    """`--metrics-dir /tmp/pub/run` where the job's user made /tmp/pub/run a link to a root-only
    directory: root would write there. Every option in WRITE_OPTIONS is attacked at once; each is exit
    2 naming the link, and nothing appears in the directory it leads to."""
    from concurrent.futures import ThreadPoolExecutor

    nobody = _nobody()
    pub = sticky_dir(area)
    job = job_factory(1)
    pid = job.start(0, "idle", {})
    attacks = []
    for i, (flag, argv) in enumerate(WRITE_OPTIONS):
        target = area / f"root-dir-{i}"
        target.mkdir(mode=0o700)
        plant_link(target, pub / f"run{i}")
        args = [a.replace("{}", str(pub / f"run{i}")).replace("{pid}", str(pid)) for a in argv]
        attacks.append((flag, args, target, f"run{i}"))

    def attack(a: tuple[str, list[str], Path, str]) -> str | None:
        """What went wrong with one attack (None: refused as it should be)."""
        flag, args, target, name = a
        shown = f"`mldebug {' '.join(args)}`"
        try:
            proc = mldebug(*args, timeout=60)  # refused up front: a second or two
        except subprocess.TimeoutExpired:
            return f"{shown} did not refuse {flag} before starting its work"
        if list(target.iterdir()):
            return f"{shown} wrote through {name}: {[p.name for p in target.iterdir()]}"
        reason = (f"{name} is a symbolic link (to {target}) owned by uid {nobody.pw_uid} (nobody), not by root or "
                  "uid 0 (root): not followed")
        if proc.returncode != 2 or f"{flag}: " not in proc.stderr or reason not in proc.stderr:
            return f"{shown}: exit {proc.returncode}, {proc.stderr[-400:]!r}"
        return None

    with ThreadPoolExecutor(max_workers=4) as pool:
        problems = [p for p in pool.map(attack, attacks) if p]
    assert not problems, "\n".join(problems)


def test_csv_and_plot_replace_a_link_planted_at_their_name(area: Path, links_unprotected) -> None:
    """The issue's attack: `allreduce-bench --csv /tmp/pub/bench.csv` (and `--plot`), where that name is
    the job user's link to a root-only file, overwrote the file. Now the link is replaced by the real
    file, never written through, and a warning says so."""
    require_module("matplotlib", "--plot")
    pub = sticky_dir(area)
    victims = {name: make_victim(area, f"victim-{name}", b"root's data\n") for name in ("bench.csv", "bench.png")}
    for name, victim in victims.items():
        plant_link(victim.path, pub / name)
    proc = mldebug("allreduce-bench", "-b", "1K", "-e", "4K", "-n", "1", "-w", "0", "--nproc-per-node", "1",
                   "--csv", str(pub / "bench.csv"),
                   "--plot", str(pub / "bench.png"), timeout=240)
    for victim in victims.values():
        victim.assert_untouched()
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-1500:])
    for name, victim in victims.items():
        flag = "--csv" if name.endswith(".csv") else "--plot"
        assert (f"mldebug: warning: {flag}: {name} was a symbolic link (to {victim.path}): not followed, replaced "
                "by the real file") in proc.stderr, proc.stderr
        written = pub / name
        assert not written.is_symlink() and written.stat().st_uid == 0
    assert (pub / "bench.csv").read_text().startswith("collective,")
    assert (pub / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_train_neither_appends_through_a_planted_link_nor_resumes_a_planted_checkpoint(area: Path,
                                                                                      links_unprotected) -> None:
    """`train --metrics-dir /tmp/pub` appended its JSON lines to the job user's link (a root-only
    file) and the profiler's trace followed a link the same way; `--checkpoint-dir /tmp/pub2` resumed
    from a step folder that user planted, whose DCP metadata is a pickle: root ran their code. Two runs
    side by side, so that each attack stands on its own (a crash on the planted checkpoint would hide
    the others)."""
    nobody = _nobody()
    pub = sticky_dir(area)
    pub2 = sticky_dir(area, "pub2")
    metrics = make_victim(area, "victim-metrics", b"root's data\n")
    trace = make_victim(area, "victim-trace", b"root's data\n")
    plant_link(metrics.path, pub / "rank-0.jsonl")
    plant_link(trace.path, pub / "rank-0.trace.json")
    marker = area / "root-unpickled-the-jobs-file"
    planted = pub2 / "step-9"
    planted.mkdir()
    (planted / "COMPLETE").write_text("9\n")
    (planted / ".metadata").write_bytes(
        b"c__builtin__\nopen\n(V" + str(marker).encode() + b"\nVw\ntR.")  # pickle: open(marker, "w")
    (planted / "train_state.json").write_text('{"step": 9, "data": {}, "world_size": 1}')
    for p in (planted, *planted.iterdir()):
        os.chown(p, nobody.pw_uid, nobody.pw_gid)

    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=2) as pool:
        first = pool.submit(mldebug, "train", "--steps", "2", "--metrics-dir", str(pub), "--profile-steps", "1:1",
                            "--profile-dir", str(pub), timeout=240)
        second = pool.submit(mldebug, "train", "--steps", "1", "--checkpoint-dir", str(pub2), timeout=240)
        proc, proc2 = first.result(), second.result()
    metrics.assert_untouched()
    trace.assert_untouched()
    assert not marker.exists(), "root unpickled the checkpoint metadata another user planted"
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-1500:])
    assert proc2.returncode == 0, (proc2.returncode, proc2.stderr[-1500:])
    assert (f"--metrics-dir: rank-0.jsonl was a symbolic link (to {metrics.path}): removed, not followed"
            in proc.stderr), proc.stderr[-1500:]
    lines = [json.loads(x) for x in (pub / "rank-0.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines if "step" in x] == [1, 2]
    assert not (pub / "rank-0.trace.json").is_symlink() and (pub / "rank-0.trace.json").stat().st_uid == 0
    assert (pub2 / "step-1" / "COMPLETE").read_text() == "1\n" and os.stat(pub2 / "step-1").st_uid == 0


# ---- a job's strings on root's terminal (issue 32) -------------------------------------------------

EVIL = "e\x1b]0;PWNED-TITLE\a\x1b[31mvil.py"  # sets the terminal's title, then its colour
EVIL_SHOWN = "e\\e]0;PWNED-TITLE\\a\\e[31mvil.py"
RAW = ("\x1b", "\x07", "\x9b", "\r", "\b")



def test_a_jobs_strings_are_shown_with_control_characters_made_visible(area: Path, job_factory) -> None:
    """A job script named with escape sequences (dump-stacks' tree and group table, and the watch
    bundle's dump-stacks.txt); a trace file with escapes and bytes that are not UTF-8 (trace-tail); log
    lines with U+009B, \\r and \\b (logs, logs --rank); an environment value (env). Each is shown with
    the characters made visible; JSON keeps the exact value."""
    nobody = _nobody()
    job = job_factory(1)
    script = job.dir / EVIL
    shutil.copy(JOB, script)
    os.chown(script, nobody.pw_uid, nobody.pw_gid)
    pid = job.start(0, "idle", {}, script=script)
    wait_in_function(pid, {"job_main_loop"})

    problems: list[str] = []  # every surface is checked, and all that let a character through are named

    def check(text: str, where: str, shown: str) -> None:
        raw = [repr(c) for c in RAW if c in text]
        if raw:
            problems.append(f"{where} lets {', '.join(raw)} through to the terminal")
        elif shown not in text:
            problems.append(f"{where} does not show {shown!r}: {text[-600:]!r}")

    stacks = mldebug("dump-stacks", "--local", "--pid", str(pid), timeout=180)
    check(stacks.stdout, "dump-stacks", EVIL_SHOWN)
    if stacks.stdout.count(EVIL_SHOWN) < 2:  # the tree and the group table
        problems.append(f"dump-stacks shows the name visibly {stacks.stdout.count(EVIL_SHOWN)} time(s), not in "
                        "both the tree and the group table")

    out = area / "bundle"
    watch = mldebug("watch", "--pid", str(pid), "--now", "--samples", "1", "--interval", "1", "--bundle-dir", str(out),
                    timeout=180)
    texts = list(out.rglob("dump-stacks.txt"))
    assert texts, (watch.returncode, watch.stderr[-1000:])
    check(texts[0].read_text(), "the watch bundle's dump-stacks.txt", EVIL_SHOWN)
    doc = json.loads((texts[0].parent / "dump-stacks.json").read_text())
    files = {f["filename"] for p in doc["result"]["processes"] for s in p["samples"] if s["ok"]
             for t in s["threads"] for f in t["frames"]}
    assert str(script) in files, files  # JSON keeps the exact name (escaped by JSON itself)

    traces = area / "traces"
    traces.mkdir()
    (traces / "trace-h-0-100.txt").write_bytes(
        b"# nicertrace pid=100 host=h rank=0 mode=stream\n"
        b"0:00:01.000 train.py:5: x = '\x1b]0;PWNED\x07\x1b[2J\xc2\x9b31m\xff\xfe\r\x08'\n")
    tail = mldebug("trace-tail", str(traces), timeout=120)
    check(tail.stdout, "trace-tail", "x = '\\e]0;PWNED\\a\\e[2J\\x9b31m")
    tail_doc = json.loads(mldebug("trace-tail", str(traces), "--json", timeout=120).stdout)
    assert tail_doc["result"]["files"][0]["tail"][-1].startswith("0:00:01.000 train.py:5: x = '\x1b]0;PWNED\x07")

    log = area / "job.out"
    log.write_bytes(b"[rank0]: step \xc2\x9b2J one\r OVER\x08X\n"
                    b"[rank1]: Traceback (most recent call last):\n"
                    b'[rank1]:   File "t.py", line 3, in <module>\n'
                    b"[rank1]: RuntimeError: boom \xc2\x9b31m\n")
    check(mldebug("logs", str(log), timeout=120).stdout, "logs", "boom \\x9b31m")
    check(mldebug("logs", "--rank", "0", str(log), timeout=120).stdout, "logs --rank", "step \\x9b2J one\\r OVER\\bX")

    env = mldebug("env", "--no-torch", env={"NCCL_DEBUG": "INFO\x1b]0;PWNED\x07\r"}, timeout=120)
    check(env.stdout, "env", "INFO\\e]0;PWNED\\a\\r")
    assert not problems, "\n".join(problems)
    env_doc = json.loads(mldebug("env", "--no-torch", "--json", env={"NCCL_DEBUG": "INFO\x1b]0;PWNED\x07\r"},
                                 timeout=120).stdout)
    def strings(v: object) -> Iterator[str]:
        if isinstance(v, str):
            yield v
        elif isinstance(v, dict):
            for x in v.values():
                yield from strings(x)
        elif isinstance(v, list):
            for x in v:
                yield from strings(x)

    assert "INFO\x1b]0;PWNED\x07\r" in set(strings(env_doc))


def test_a_crafted_core_is_not_read_and_the_others_are_kept(area: Path) -> None:
    """e_phnum=65535 and a note at offset 2**64-16: an internal OverflowError that lost every core of
    the directory. Now that core is reported not read, with why, and the next one is read."""
    import struct

    cores = area / "cores"
    cores.mkdir()

    def elf(phdrs: bytes, phnum: int, tail: bytes = b"") -> bytes:
        head = bytearray(64)
        head[:7] = b"\x7fELF\x02\x01\x01"
        struct.pack_into("<HH", head, 16, 4, 62)  # ET_CORE, x86-64
        struct.pack_into("<Q", head, 32, 64)  # e_phoff
        struct.pack_into("<HHH", head, 52, 64, 56, phnum)
        return bytes(head) + phdrs + tail

    (cores / "core.1").write_bytes(elf(struct.pack("<IIQQQQQQ", 4, 0, 2**64 - 16, 0, 0, 100, 0, 0), 65535))
    prstatus = bytearray(336)
    struct.pack_into("<i", prstatus, 0, 11)  # si_signo
    struct.pack_into("<h", prstatus, 12, 11)  # pr_cursig: SIGSEGV
    struct.pack_into("<i", prstatus, 32, 4242)  # pr_pid
    note = struct.pack("<III", 5, len(prstatus), 1) + b"CORE\0\0\0\0" + bytes(prstatus)
    (cores / "core.2").write_bytes(elf(struct.pack("<IIQQQQQQ", 4, 0, 120, 0, 0, len(note), 0, 0), 1, note))

    proc = mldebug("core-bt", "--dir", str(cores), "--json", timeout=180)
    doc = json.loads(proc.stdout)
    validate_schema(doc, "core-bt")
    by_name = {Path(c["path"]).name: c for c in doc["result"]["cores"]}
    assert set(by_name) == {"core.1", "core.2"}, (proc.stderr[-1000:], by_name)
    assert not by_name["core.1"]["ok"]
    assert by_name["core.1"]["error"] == (f"not read: program header 0 names offset {2**64 - 16} and size 100: a "
                                          "corrupt or crafted core"), by_name["core.1"]
    assert by_name["core.2"]["pid"] == 4242 and by_name["core.2"]["signal"] == "SIGSEGV", by_name["core.2"]
    assert "Traceback" not in proc.stderr


def test_appending_and_writing_never_go_through_a_hard_link_planted_in_a_shared_dir(area: Path,
                                                                                 links_unprotected) -> None:
    """A hard link to root's file at the name mldebug appends to (`--metrics-dir`, `--log-dir`'s
    console.log) or writes (`--csv`): O_NOFOLLOW does not see it. The name is removed or replaced."""
    from ml_debug.core import safefs

    pub = sticky_dir(area)
    shared = area / "shared"  # a directory the job's user may read: a hard link needs the path
    shared.mkdir(mode=0o755)
    victim_path = shared / "root-file"
    victim_path.write_bytes(b"root's data\n")
    victim_path.chmod(0o600)
    victim = Victim(victim_path, b"root's data\n", os.lstat(victim_path).st_mtime_ns)
    for name in ("rank-0.jsonl", "bench.csv"):
        subprocess.run([RUNUSER, "-u", "nobody", "--", "ln", str(victim.path), str(pub / name)], check=True,
                       timeout=30)
    assert os.stat(victim.path).st_nlink == 3

    fd, note = safefs.open_append(pub, "rank-0.jsonl", "--metrics-dir")
    with open(fd, "a") as f:
        f.write("appended\n")
    assert note == "rank-0.jsonl was a hard link (3 names): removed, not followed"
    assert safefs.write_file("--csv", pub / "bench.csv", "a,b\n") is None  # a regular file: replaced quietly
    victim.assert_untouched()
    assert (pub / "rank-0.jsonl").read_text() == "appended\n" and (pub / "bench.csv").read_text() == "a,b\n"
    assert os.stat(victim.path).st_nlink == 1
