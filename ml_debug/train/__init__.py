"""The bundled training job behind `mldebug train`: a Llama-style model trained with FSDP2 in fp32,
bf16, fp8 (torchao) or MX (our own OCP quantiser), with metrics, DCP checkpoints and deterministic
fault injection. Importing this package is cheap; torch is imported by the modules that need it.

    torchrun --nproc-per-node 2 -m ml_debug.train --preset tiny --steps 50
"""

from __future__ import annotations
