"""NicerTrace's parts (options, filter, formats, threads, sinks, backends, watchdog, forking) and the
helpers around :mod:`ml_debug.nicertrace`: running a program under it, reading the files it writes.

Importing this package is cheap and pulls nothing outside the standard library; the parts that
:mod:`ml_debug.nicertrace` imports stay standard-library only.
"""
