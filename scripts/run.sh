#!/usr/bin/env bash
# The README's first command: install, build, and run the default job (Fashion-MNIST, MLP, CPU)
# on ${DDP_NPROC:-2} ranks started by mpirun. Extra arguments go to ddp_train, e.g.
#   scripts/run.sh --epochs 1
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${DDP_BUILD_DIR:-$root/build}"

"$root/scripts/build.sh" >&2
cd "$root"
# As root Open MPI needs to be told it may run; more ranks than cores need oversubscribe.
mpi_flags=(--oversubscribe --mca btl self,vader)
if [ "$(id -u)" -eq 0 ]; then mpi_flags+=(--allow-run-as-root); fi
exec mpirun "${mpi_flags[@]}" -np "${DDP_NPROC:-2}" \
  "$build/ddp_train" --config configs/fashion_mnist_mlp.yaml "$@"
