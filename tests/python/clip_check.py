"""torch.nn.utils.clip_grad_norm_ on the reduced gradients that ddp clipped: the check of
tests/integration/ddp_worker.cpp's clip scenario (Debian's python3-torch).

    python3 clip_check.py RECORD   (the worker's file: "grad.<i>" before clipping, "clipped.<i>"
                                    after, "norm" it returned, "max_norm")

Prints both norms and the largest difference of the clipped gradients; exits 1 when PyTorch's
result differs, or when the norm was not above max_norm (the clipping would not have acted).
"""
import sys

import torch

record = torch.load(sys.argv[1], weights_only=True)
count = sum(1 for key in record if key.startswith("grad."))
params = [torch.nn.Parameter(torch.zeros_like(record[f"grad.{i}"])) for i in range(count)]
for i, p in enumerate(params):
    p.grad = record[f"grad.{i}"].clone()
max_norm = record["max_norm"].item()
norm = torch.nn.utils.clip_grad_norm_(params, max_norm).item()
ours = record["norm"].item()
diff = max((p.grad - record[f"clipped.{i}"]).abs().max().item() for i, p in enumerate(params))
print(f"{count} gradients; norm {norm:.6g} (ours {ours:.6g}), max_norm {max_norm}; "
      f"clipped gradients differ by {diff:.3g} at most")
sys.exit(0 if norm > max_norm and abs(norm - ours) <= 1e-6 * norm and diff <= 1e-7 else 1)
