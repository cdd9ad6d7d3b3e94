"""How the consoles of a job whose numbers became NaN were made (torch 2.13, CPU, this machine; the same code first ran
as /tmp/lines/numerics.py, the path their frames show):

    python numerics.py anomaly > nan-anomaly.log 2>&1   # autograd's anomaly mode names the op that made a NaN
    python numerics.py clip    > nan-clip.log 2>&1      # clip_grad_norm_(error_if_nonfinite=True) on a NaN gradient
"""

import sys

import torch

what = sys.argv[1]
w = torch.tensor([-1.0, 4.0], requires_grad=True)
if what == "anomaly":
    with torch.autograd.detect_anomaly():
        torch.sqrt(w).sum().backward()
if what == "clip":
    torch.sqrt(w).sum().backward()
    torch.nn.utils.clip_grad_norm_([w], 1.0, error_if_nonfinite=True)
