"""`mldebug gpu-test`: staged checks that every rank and GPU can talk, and the verdict that names who cannot."""
