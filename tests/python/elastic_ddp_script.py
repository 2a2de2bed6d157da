"""A user's five-line PyTorch DDP script (gloo, DDP of a Linear, three steps), as run under
`launcher --nnodes MIN:MAX` (tests/integration/test_launcher.cpp). With --fail-first-run, rank 1
exits with code 3 after its steps in the job's first run, as a crash would; a restarted group
(TORCHELASTIC_RESTART_COUNT > 0) runs clean. Each rank prints its restart count and a checksum of
its weights, which DDP keeps equal on every rank."""
import os
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    optimizer.zero_grad()
    model(torch.randn(8, 4)).sum().backward()
    optimizer.step()
restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
if "--fail-first-run" in sys.argv and restart == 0 and dist.get_rank() == 1:
    os._exit(3)
checksum = sum(p.detach().double().sum().item() for p in model.parameters())
print(f"rank {dist.get_rank()} of {dist.get_world_size()}: restart {restart}, "
      f"weights {checksum:.6f}", flush=True)
dist.destroy_process_group()
