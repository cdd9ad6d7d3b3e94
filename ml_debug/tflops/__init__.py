"""`mldebug tflops`: achieved TFLOP/s per GPU and MFU from a model's shape and the time per iteration."""
