"""The distributed foundation: who am I (world.py), which device/backend (device.py), process-group
init with timeouts and safe teardown (group.py), the job's store (store.py) and self-launch (launch.py).

Importing the package is cheap: no torch until a function that needs it runs.
"""
