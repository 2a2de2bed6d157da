#!/usr/bin/env bash
# A LibTorch program as its users write it, made data-parallel (tests/install/mnist_ddp: the shape
# of pytorch/examples' cpp/mnist, torch::data's MNIST dataset and loader with two workers, a
# std::shared_ptr<Net>), built against the installed package and run on Fashion-MNIST's training
# files unpacked under MNIST's names. Checks:
#   - 2 ranks under the launcher and under mpirun: each rank's batches are
#     torch.utils.data.DistributedSampler's indices (python3-torch, same seed and epoch);
#   - their weights after the epoch equal one process with the doubled batch (to float tolerance),
#     and load into Python's nn.DataParallel(Net()) with strict=True;
#   - a run stopped after 5 batches, its sampler saved, then a new run that loads it trains the
#     rest of the epoch's indices exactly (the loader's workers had fetched ahead).
#
#   tests/scripts/install_mnist_test.sh BUILD_DIR SOURCE_DIR      (ctest: Install.*)
set -euo pipefail

# shellcheck source=tests/scripts/install_package.sh
source "$(dirname "${BASH_SOURCE[0]}")/install_package.sh"
install_test_arguments mnist-test "$@"
mpirun=${DDP_MPIEXEC:-mpirun}

install_package "$build_dir" "$tmp/prefix"
build_against_package "$source_dir/tests/install/mnist_ddp" "$tmp/build" "$tmp/prefix"

unpack_mnist "$data_dir" "$tmp/mnist" train-images-idx3-ubyte train-labels-idx1-ubyte

program="$tmp/build/mnist_ddp"
launcher="$tmp/prefix/bin/launcher"
# run NAME COMMAND...: runs the program's command into $tmp/NAME (its OUT_DIR), 2 minutes at most.
run() {
  local name=$1
  shift
  step "$name: $*"
  mkdir "$tmp/$name"
  timeout 120 "$@" 2>&1 | tee "$tmp/$name.log" || fail "$name failed (exit ${PIPESTATUS[0]})"
}
run launcher "$launcher" --nproc 2 "$program" "$tmp/mnist" "$tmp/launcher"
run mpirun "$mpirun" --allow-run-as-root --oversubscribe --mca btl self,vader -np 2 \
  "$program" "$tmp/mnist" "$tmp/mpirun"
run single "$program" "$tmp/mnist" "$tmp/single" --batch-size 64
run stopped "$launcher" --nproc 2 "$program" "$tmp/mnist" "$tmp/stopped" --stop-after 5
run resumed "$launcher" --nproc 2 "$program" "$tmp/mnist" "$tmp/resumed" --resume "$tmp/stopped"
for name in launcher mpirun; do
  [[ $(grep -c "/2: epoch 1, 16 batches" "$tmp/$name.log") == 2 ]] ||
    fail "$name: not both ranks trained 16 batches"
done

step "compare with PyTorch's DistributedSampler and with one process; load into nn.DataParallel"
"$python" - "$tmp" <<'PY'
import sys
import torch, torch.nn as nn, torch.nn.functional as F
from torch.utils.data import DistributedSampler

tmp = sys.argv[1]
IMAGES, BATCH, EPOCH, WORLD = 1024, 32, 1, 2

class Sized:
    def __len__(self):
        return IMAGES

def batches(run, rank):
    with open(f"{tmp}/{run}/indices.rank{rank}") as f:
        return [list(map(int, line.split())) for line in f]

for rank in range(WORLD):
    sampler = DistributedSampler(Sized(), num_replicas=WORLD, rank=rank, shuffle=True, seed=0)
    sampler.set_epoch(EPOCH)
    expected = list(sampler)
    want = [expected[i:i + BATCH] for i in range(0, len(expected), BATCH)]
    for run in ("launcher", "mpirun"):
        if batches(run, rank) != want:
            sys.exit(f"FAIL: {run} rank {rank}'s batches are not DistributedSampler's indices")
    stopped, resumed = batches("stopped", rank), batches("resumed", rank)
    if len(stopped) != 5 or stopped + resumed != want:
        sys.exit(f"FAIL: rank {rank}: 5 batches, then the resumed run's {len(resumed)}, are not "
                 "the epoch's batches")
print(f"python: every rank's batches are DistributedSampler's (seed 0, epoch {EPOCH}); the "
      "resumed run trained the rest of the epoch exactly")

class Net(nn.Module):  # tests/install/mnist_ddp/main.cpp's Net
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2(x), 2))
        x = F.relu(self.fc1(x.view(-1, 320)))
        return F.log_softmax(self.fc2(x), dim=1)

models = {}
for run in ("launcher", "mpirun", "single"):
    model = nn.DataParallel(Net())
    model.load_state_dict(torch.load(f"{tmp}/{run}/weights.pt", weights_only=True), strict=True)
    models[run] = model.state_dict()
largest = 0.0
for run in ("launcher", "mpirun"):
    for key, single in models["single"].items():
        error = ((models[run][key] - single).abs().max() / single.abs().max()).item()
        largest = max(largest, error)
        if error > 1e-4:
            sys.exit(f"FAIL: {run}'s {key} differs from one process with the doubled batch "
                     f"(relative {error:.3g})")
print("python: the 2-rank weights load into nn.DataParallel(Net()) strict=True and equal one "
      f"process with batch 64 (largest relative difference {largest:.2g}, tolerance 1e-4)")
PY
echo "PASS: the cpp/mnist-shaped program trains on 2 ranks with PyTorch's shards, equals one process, and resumes mid-epoch"
