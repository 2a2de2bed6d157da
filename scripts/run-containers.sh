#!/usr/bin/env bash
# Runs the CPU image (ddp:cpu, built by scripts/test-docker.sh) as containers, the way a container
# runtime would, on machines where `podman run` cannot start one (crun is refused its setrlimit
# calls): each container is a writable copy of the image's filesystem (`podman create`, then
# `podman mount`), entered with its own PID, mount, UTS and network namespaces (unshare), with
# /proc, /sys and /dev mounted and a /dev/shm of its own of Docker's default size (64 MB), the
# image's environment and working directory, under chroot. Then:
#
#   1. the image's command (CMD: ddp_train --version);
#   2. `launcher --nproc 2 ddp_train` in one container, with the default backend (shared memory
#      in the container's own /dev/shm) and with gloo;
#   3. two containers on a veth pair as two hosts (`launcher --nnodes 2 --node-rank N`), trained to
#      the end: the weights equal the one-container gloo run's, bit for bit (the image's
#      python3-torch compares them).
#
#   scripts/run-containers.sh [IMAGE]      # default ddp:cpu
#
# Needs root, podman with the image, iproute2 and util-linux. Ends with "containers: passed"
# (exit 0), or names what failed (exit 1).
set -euo pipefail
image="${1:-ddp:cpu}"
# An MLP epoch on 6,400 samples of the image's Fashion-MNIST, as the hosts tests train.
job=(build/ddp_train --config configs/fashion_mnist_mlp.yaml --epochs 1 --train-subset 6400
  --global-batch-size 64 --threads 1)

fail() {
  echo "containers: FAILED: $*" >&2
  exit 1
}

podman image exists "$image" || fail "no image $image (scripts/test-docker.sh builds it)"
workdir="$(podman image inspect --format '{{.Config.WorkingDir}}' "$image")"
mapfile -t image_env < <(podman image inspect --format '{{range .Config.Env}}{{println .}}{{end}}' \
  "$image" | sed '/^$/d')
mapfile -t image_cmd < <(podman image inspect --format '{{range .Config.Cmd}}{{println .}}{{end}}' \
  "$image" | sed '/^$/d')

containers=()
netns=()
cleanup() {
  for c in "${containers[@]}"; do
    podman umount "$c" >/dev/null 2>&1 || true
    podman rm -f "$c" >/dev/null 2>&1 || true
  done
  for n in "${netns[@]}"; do ip netns delete "$n" 2>/dev/null || true; done
}
trap cleanup EXIT

# A new container of the image; prints its root (writable: the container's own layer).
new_root() {
  local id
  id="$(podman create "$image")"
  containers+=("$id")
  podman mount "$id"
}

# in_container ROOT NAME NETNS ARGS...: ARGS run in ROOT's working directory as in a container
# named NAME (its host name); NETNS: a network namespace made with `ip netns` to enter, or "" for
# a new one with only the loopback interface. Output goes to stdout; the exit code is ARGS'.
in_container() {
  local root=$1 name=$2 ns=$3
  shift 3
  local enter=(unshare --pid --fork --mount --uts --propagation private)
  if [[ -n "$ns" ]]; then
    enter=(ip netns exec "$ns" "${enter[@]}")
  else
    enter+=(--net)
  fi
  # Inside: the host's tools set the container up, then chroot starts ARGS with the image's
  # environment only (as a runtime does), as PID 1's child in the new PID namespace.
  # shellcheck disable=SC2016  # the inner shell expands them
  timeout 600 "${enter[@]}" /bin/sh -c '
    root=$1 name=$2 workdir=$3 envs=$4; shift 4
    hostname "$name" && ip link set lo up &&
    mount -t proc proc "$root/proc" && mount -t sysfs sysfs "$root/sys" &&
    mount --rbind /dev "$root/dev" &&
    mount -t tmpfs -o size=64m,mode=1777 shm "$root/dev/shm" || exit 125
    set -f; IFS="
"
    exec chroot "$root" /usr/bin/env -i $envs /bin/sh -c "cd \"\$0\" && exec \"\$@\"" "$workdir" "$@"
  ' sh "$root" "$name" "$workdir" "$(printf '%s\n' "${image_env[@]}")" "$@"
}

# The weights of two checkpoints (model.pt), paths in container ROOT, are the same bits: read by
# the image's python3-torch.
same_weights() {
  in_container "$1" c0 "" python3 - "$2" "$3" <<'EOF'
import sys, torch
a, b = (torch.load(p, map_location="cpu") for p in sys.argv[1:3])
a, b = (x.get("model", x) if isinstance(x, dict) else x for x in (a, b))
assert a.keys() == b.keys(), f"different keys: {sorted(a)} vs {sorted(b)}"
differ = [k for k in a if not torch.equal(a[k], b[k])]
assert not differ, f"tensors differ: {differ}"
print(f"containers: {len(a)} tensors bitwise equal")
EOF
}

echo "== 1. the image's command: ${image_cmd[*]}"
one="$(new_root)"
out="$(in_container "$one" c0 "" "${image_cmd[@]}")" || fail "the image's command ended $?: $out"
echo "$out"
grep -q "backends: " <<<"$out" || fail "ddp_train --version named no backends"

echo "== 2. launcher --nproc 2 ddp_train in one container (default backend, then gloo)"
out="$(in_container "$one" c0 "" build/launcher --nproc 2 "${job[@]}" --output-dir runs/shm 2>&1)" \
  || fail "launcher --nproc 2 ended $?: $out"
grep -q "launched by env: 2 rank(s), backend shm" <<<"$out" \
  || fail "the default backend in a container is not shm: $out"
grep "launched by\|done:" <<<"$out"
out="$(in_container "$one" c0 "" build/launcher --nproc 2 "${job[@]}" --backend gloo \
  --output-dir runs/one-host 2>&1)" || fail "launcher --nproc 2 (gloo) ended $?: $out"
grep "launched by\|done:" <<<"$out"

echo "== 3. two containers on a veth pair, as two hosts"
for n in 0 1; do
  netns+=("ddp-c$n")
  ip netns add "ddp-c$n"
done
ip link add ddp-veth0 netns ddp-c0 type veth peer name ddp-veth1 netns ddp-c1
for n in 0 1; do
  ip -n "ddp-c$n" addr add "10.233.0.$((n + 1))/24" dev "ddp-veth$n"
  ip -n "ddp-c$n" link set "ddp-veth$n" up
done
two="$(new_root)"
roots=("$one" "$two")
pids=()
for n in 0 1; do
  in_container "${roots[$n]}" "c$n" "ddp-c$n" /usr/bin/env DDP_JOB_TOKEN=containers-test \
    build/launcher --nnodes 2 --node-rank "$n" --nproc 1 --master-addr 10.233.0.1 \
    --master-port 29500 "${job[@]}" --output-dir runs/two-hosts > "$two/node$n.log" 2>&1 &
  pids+=($!)
done
for n in 0 1; do
  wait "${pids[$n]}" || fail "node $n ended $?: $(cat "$two/node$n.log")"
done
grep "launched by\|done:" "$two/node0.log"
grep -q "launched by env: 2 rank(s), backend gloo" "$two/node0.log" \
  || fail "the two hosts did not train as 2 ranks over gloo: $(cat "$two/node0.log")"
same_weights "$one" runs/two-hosts/model.pt runs/one-host/model.pt \
  || fail "the two hosts' weights differ from one host's"
echo "containers: passed"
