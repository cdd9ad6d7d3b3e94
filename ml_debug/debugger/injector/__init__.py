"""debugpy's injector, quiet in the process it enters: run as ``python <this folder> ARGS`` by
:mod:`ml_debug.debugger.adapter` in place of ``python <debugpy's folder> ARGS`` (see ``__main__.py``)."""
