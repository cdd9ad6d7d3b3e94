"""`mldebug launch`: torchrun with its logs laid out for `mldebug logs` (``run.py``; its options: ``options.py``)."""
