"""What a person debugging a cluster asks first: versions, GPUs, launcher variables,
NCCL/TORCH/CUDA settings, network interfaces, tools on PATH and ptrace permission.

:func:`summary` is the cheap block embedded in every command's JSON (no torch import);
:func:`collect` is the full report behind ``mldebug env``.
"""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from ml_debug import __version__
from ml_debug.core import bounded
from ml_debug.core.extras import find_program
from ml_debug.core.rankvars import LAUNCHER_PREFIXES, TORCHRUN_VARS

SETTING_PREFIXES = ("NCCL_", "TORCH_", "CUDA_", "PYTORCH_")


def package_version(name: str) -> str | None:
    """Installed version of a distribution, without importing it."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def shown(text: str) -> str:
    """An environment string as reported: bytes that are not UTF-8 (Python holds them as lone
    surrogates) become \\xNN escapes. Raw, they reached the terminal as they were, and the JSON carried
    them as lone \\udcNN surrogates, which strict JSON parsers refuse."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def world_variables(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Launcher and world variables that are set (torchrun, Slurm, OpenMPI, PMI), as :func:`shown`."""
    env = os.environ if environ is None else environ
    keys = [k for k in env if k in TORCHRUN_VARS or k.startswith(LAUNCHER_PREFIXES)]
    return {shown(k): shown(env[k]) for k in sorted(keys)}


def setting_variables(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Every NCCL_*, TORCH_*, CUDA_*, PYTORCH_* variable that is set, as :func:`shown`."""
    env = os.environ if environ is None else environ
    return {shown(k): shown(env[k]) for k in sorted(env) if k.startswith(SETTING_PREFIXES)}


def summary() -> dict[str, Any]:
    """The environment block every command embeds in its JSON: cheap, no torch import."""
    return {
        "host": socket.gethostname(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "mldebug": __version__,
        "torch": package_version("torch"),
        "world": world_variables(),
        "settings": setting_variables(),
    }


# ---------------------------------------------------------------- the full report (`mldebug env`)

TOOLS = ("py-spy", "gdb", "pystack", "torchrun", "srun", "squeue", "nvidia-smi")
_VERSION_ARGS = {"srun": ["--version"], "squeue": ["--version"], "nvidia-smi": ["--version"]}


@dataclass
class Tool:
    name: str
    path: str | None
    version: str | None


@dataclass
class Interface:
    name: str
    up: bool
    speed_mbps: int | None
    mtu: int | None
    addresses: list[str]


@dataclass
class PtraceVerdict:
    """May this user attach (py-spy, gdb, pystack) to other processes, and the fix when not."""

    can_attach_own: bool
    can_attach_any: bool
    yama_scope: int | None
    cap_sys_ptrace: bool
    uid: int
    in_container: bool
    explanation: str
    fix: str | None


@dataclass
class TorchInfo:
    version: str | None
    cuda: str | None = None
    nccl: str | None = None
    cudnn: str | None = None
    cuda_available: bool = False
    device_count: int = 0
    arch_list: list[str] = field(default_factory=list)
    error: str | None = None


@dataclass
class EnvReport:
    host: str
    python: dict[str, str]
    mldebug: str
    packages: dict[str, str | None]
    torch: TorchInfo
    gpus: dict[str, Any]
    world: dict[str, str]
    settings: dict[str, str]
    warnings: list[str]
    interfaces: list[Interface]
    tools: list[Tool]
    ptrace: PtraceVerdict
    ok: bool
    summary: str


def _tool_version(name: str, path: str) -> str | None:
    if name == "torchrun":  # has no --version; it is torch's own launcher
        return f"torch {package_version('torch')}"
    try:
        out = bounded.run([path, *_VERSION_ARGS.get(name, ["--version"])], timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (out.stdout or out.stderr).strip().splitlines()
    return text[0].strip() if text else None


def tools() -> list[Tool]:
    """Which debugging and launcher tools are installed, with their versions (`X --version`)."""
    paths = {name: find_program(name) for name in TOOLS}
    with ThreadPoolExecutor(max_workers=len(TOOLS)) as pool:
        versions = {n: pool.submit(_tool_version, n, p) for n, p in paths.items() if p}
        try:
            return [Tool(n, paths[n], versions[n].result() if n in versions else None) for n in TOOLS]
        except KeyboardInterrupt:  # the tools run in their own process groups: Ctrl-C does not reach them
            bounded.kill_all()
            raise


def interfaces() -> list[Interface]:
    """Network interfaces with their addresses (`ip -br addr`)."""
    import psutil

    addrs, stats = psutil.net_if_addrs(), psutil.net_if_stats()
    result = []
    for name in sorted(addrs):
        st = stats.get(name)
        ips = [a.address for a in addrs[name] if a.family in (socket.AF_INET, socket.AF_INET6)]
        result.append(Interface(name, bool(st and st.isup), (st.speed or None) if st else None,
                                st.mtu if st else None, ips))
    return result


def ptrace_permission() -> PtraceVerdict:
    """Whether py-spy/gdb may attach here: Yama ptrace_scope and CAP_SYS_PTRACE
    (`cat /proc/sys/kernel/yama/ptrace_scope`, `capsh --print`); the policy is read by the same
    check dump-stacks runs before attaching."""
    from ml_debug.core.ptrace import check_ptrace

    check = check_ptrace()
    own = check.denial(check.euid)
    other = check.denial(-1)  # any other user's process
    scope = "no Yama" if check.yama_scope is None else f"Yama ptrace_scope={check.yama_scope}"
    if own is not None:
        explanation, fix = own
    elif other is None:
        explanation, fix = f"CAP_SYS_PTRACE present: may attach to any process ({scope})", None
    else:
        explanation, fix = f"may attach to this user's processes ({scope})", f"for other users' processes: {other[1]}"
    return PtraceVerdict(own is None, other is None, check.yama_scope, check.has_cap_sys_ptrace, check.euid,
                         check.in_container, explanation, fix)


def torch_info() -> TorchInfo:
    """torch, CUDA, NCCL and cuDNN versions as torch sees them (imports torch: ~1 s)."""
    version = package_version("torch")
    if version is None:
        return TorchInfo(None, error="torch is not installed")
    try:
        import torch
    except Exception as e:  # a broken install is exactly what this report must show
        return TorchInfo(version, error=f"import torch failed: {type(e).__name__}: {e}")
    info = TorchInfo(torch.__version__, cuda=torch.version.cuda)
    try:
        info.cudnn = str(torch.backends.cudnn.version()) if torch.backends.cudnn.is_available() else None
        info.cuda_available = torch.cuda.is_available()
        info.device_count = torch.cuda.device_count() if info.cuda_available else 0
        info.arch_list = list(torch.cuda.get_arch_list()) if torch.version.cuda else []
        if torch.version.cuda and hasattr(torch.cuda, "nccl"):
            nccl = torch.cuda.nccl.version()
            info.nccl = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
    except Exception as e:
        info.error = f"{type(e).__name__}: {e}"
    return info


def setting_warnings(settings: Mapping[str, str], names: list[str]) -> list[str]:
    """Known-dangerous or surprising values of NCCL_*/TORCH_*/CUDA_* variables."""
    warnings = []
    if "TORCH_FR_BUFFER_SIZE" in settings and not settings["TORCH_FR_BUFFER_SIZE"].strip().isdigit():
        warnings.append(f"TORCH_FR_BUFFER_SIZE={settings['TORCH_FR_BUFFER_SIZE']!r} is not a number: "
                        "init_process_group hangs or aborts; unset it or give a size like 20000")
    ifname = settings.get("NCCL_SOCKET_IFNAME", "")
    if ifname and not ifname.startswith("^"):
        wanted = [p.lstrip("=") for p in ifname.split(",") if p]
        exact = ifname.startswith("=")
        if not any(n == w or (not exact and n.startswith(w)) for w in wanted for n in names):
            warnings.append(f"NCCL_SOCKET_IFNAME={ifname} matches no interface here "
                            f"(present: {', '.join(names)})")
    for var, value, why in (
        ("CUDA_LAUNCH_BLOCKING", "1", "serialises every kernel launch: very slow, for debugging only"),
        ("NCCL_P2P_DISABLE", "1", "GPU peer-to-peer is off: intra-node collectives go through host memory"),
        ("NCCL_IB_DISABLE", "1", "InfiniBand is off: inter-node traffic falls back to TCP sockets"),
        ("NCCL_SHM_DISABLE", "1", "shared-memory transport is off"),
    ):
        if settings.get(var) == value:
            warnings.append(f"{var}={value}: {why}")
    if "CUDA_VISIBLE_DEVICES" in settings and settings["CUDA_VISIBLE_DEVICES"].strip() == "":
        warnings.append("CUDA_VISIBLE_DEVICES is empty: this process sees no GPU")
    if settings.get("NCCL_ASYNC_ERROR_HANDLING") is not None and "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in settings:
        warnings.append("NCCL_ASYNC_ERROR_HANDLING is deprecated: use TORCH_NCCL_ASYNC_ERROR_HANDLING")
    return warnings


def gpu_inventory() -> dict[str, Any]:
    """GPUs as NVML sees them (`nvidia-smi -L` plus bus id, driver and memory), or why none."""
    from ml_debug.core.nvml import is_na, open_gateway

    with open_gateway() as gw:
        status = gw.open()
        if not status.available:
            return {"available": False, "reason": status.reason, "driver": None, "gpus": [], "nvml_source": gw.source}
        driver = gw.driver_version()
        gpus = []
        for index in range(gw.device_count()):
            h = gw.handle(index)
            memory = gw.memory(h)
            gpus.append({
                "index": index, "name": str(gw.name(h)), "uuid": str(gw.uuid(h)),
                "bus_id": str(gw.pci_bus_id(h)), "driver": str(driver),
                "memory": "N/A" if is_na(memory) else f"{memory[0] / 2**30:.1f} GiB",
            })
        return {"available": True, "reason": None, "driver": str(driver), "gpus": gpus, "nvml_source": gw.source}


def collect(include_torch: bool = True) -> EnvReport:
    """Everything `mldebug env` reports. GPUs come from NVML through the health gateway."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        tools_future = pool.submit(tools)
        gpus = gpu_inventory()
        nics = interfaces()
        torch = (torch_info() if include_torch
                 else TorchInfo(package_version("torch"), error="not imported (--no-torch)"))
        found_tools = tools_future.result()
    settings = setting_variables()
    warnings = setting_warnings(settings, [n.name for n in nics])
    # no torch at all is the torch-free install (a node's health hook), not a fault; a torch that is there
    # but fails to import is (numpy's absence is the commands' to say: they exit 3 naming it)
    if torch.error and include_torch and torch.version:
        warnings.append(f"torch: {torch.error}")
    ptrace = ptrace_permission()
    if not ptrace.can_attach_own:
        warnings.append(f"ptrace: {ptrace.explanation}; fix: {ptrace.fix}")
    ngpu = len(gpus.get("gpus", []))
    gpu_text = f"{ngpu} GPU(s)" if ngpu else "no NVIDIA GPU/driver"
    from ml_debug.core.nvml import is_fake_source

    source = str(gpus.get("nvml_source") or "")
    if is_fake_source(source):
        # Test data must never read as this node's hardware, in the table as in the JSON.
        gpu_text += " from FAKE NVML"
        warnings.append(f"FAKE NVML: the GPU data comes from a test's NVML look-alike ({source}), not from a GPU")
    summary_line = (f"{socket.gethostname()}: torch {torch.version or 'not installed'}, {gpu_text}, "
                    f"{'may attach to processes' if ptrace.can_attach_own else 'cannot attach to processes'}"
                    + (f", {len(warnings)} warning(s)" if warnings else ""))
    return EnvReport(
        host=socket.gethostname(),
        python={"version": platform.python_version(), "implementation": platform.python_implementation(),
                "executable": sys.executable},
        mldebug=__version__,
        packages={p: package_version(p) for p in ("torch", "typer", "rich", "psutil", "paramiko", "py-spy",
                                                  "nvidia-ml-py", "numpy", "torchao", "pystack")},
        torch=torch,
        gpus=gpus,
        world=world_variables(),
        settings=settings,
        warnings=warnings,
        interfaces=nics,
        tools=found_tools,
        ptrace=ptrace,
        ok=not warnings,
        summary=summary_line,
    )
