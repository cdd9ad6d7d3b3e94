"""The bottom layer: errors, the output sink, the environment summary, the NVML gateway, GPU peaks.

Everything above (services: dist, remote, procs; features; cli) may import from here; nothing here
imports from above. Importing the package is cheap.
"""
