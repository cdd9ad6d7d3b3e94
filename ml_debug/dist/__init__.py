"""The distributed foundation: who am I (world), which device/backend, init/teardown, self-launch.

Importing this package is cheap (no torch); torch is imported by the functions that need it.
"""

from __future__ import annotations

from ml_debug.dist.device import DeviceChoice, choose_device
from ml_debug.dist.group import distributed, init_process_group, teardown
from ml_debug.dist.launch import LaunchResult, LaunchSpec, launch
from ml_debug.dist.world import World, detect_world, is_launched

__all__ = ["DeviceChoice", "LaunchResult", "LaunchSpec", "World", "choose_device", "detect_world",
           "distributed", "init_process_group", "is_launched", "launch", "teardown"]
