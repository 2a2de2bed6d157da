#!/usr/bin/env bash
# The README's first command: install, build, and run the default job (Fashion-MNIST, MLP, CPU).
# Extra arguments are passed to ddp_train, e.g. scripts/run.sh --epochs 1
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${DDP_BUILD_DIR:-$root/build}"

"$root/scripts/build.sh" >&2
cd "$root"
exec "$build/ddp_train" --config configs/fashion_mnist_mlp.yaml "$@"
