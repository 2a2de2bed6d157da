#!/usr/bin/env bash
# Builds docker/Dockerfile.cpu for real, on a machine without a Docker engine and without a
# registry: Debian's podman builds it, from a debian:bookworm base made here with mmdebstrap and
# imported under the name Docker Hub's would have. The Dockerfile runs every test during the build
# (scripts/test.sh), so an image that builds has passed them; then scripts/run-containers.sh runs
# the image as containers (namespaces and chroot, as a runtime would).
#
#   scripts/test-docker.sh                  # as `docker build`, every stage
#   scripts/test-docker.sh --build-arg DDP_SANITIZE_TESTS=0 --build-arg DDP_FUZZ_SECONDS=0
#
# Arguments go to `podman build` (build ARGs: docker/README.md). Needs root, and Debian's mirror.
# Why chroot isolation: podman's default (an OCI runtime, crun) needs setrlimit calls that some
# sandboxes refuse, and then no RUN step starts; a chroot needs none. `podman run` uses the OCI
# runtime too, which is why the image's tests run inside its build, and its containers are made by
# scripts/run-containers.sh.
#
# DDP_DOCKER_REBASE=1 makes the base image again (a newer bookworm point release).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/lib/stage.sh
source "$root/scripts/lib/stage.sh"
mirror="${DDP_DEBIAN_MIRROR:-http://deb.debian.org}"
base=docker.io/library/debian:bookworm

install_podman() {
  command -v podman >/dev/null && return
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends podman
}

# The base as Docker Hub's debian:bookworm is made: a minimal bookworm (mmdebstrap's minbase:
# Essential and apt) with the release, updates and security suites, as one layer.
make_base() {
  if podman image exists "$base" && [[ "${DDP_DOCKER_REBASE:-0}" != 1 ]]; then
    echo "test-docker.sh: $base is there already (DDP_DOCKER_REBASE=1 makes it again)"
    return
  fi
  local tar status=0
  tar="$(mktemp --suffix=.tar)"
  mmdebstrap --variant=minbase --quiet bookworm "$tar" \
    "deb $mirror/debian bookworm main" \
    "deb $mirror/debian bookworm-updates main" \
    "deb $mirror/debian-security bookworm-security main" \
    && podman import --quiet "$tar" "$base" || status=$?
  rm -f "$tar"
  return "$status"
}

stage "podman" install_podman
stage "base image" make_base
# Without npm's workflow linter: a root made here does not trust the certificate authority the
# host may need to reach npm's registry (scripts/install-deps.sh); Debian's mirror is plain HTTP.
stage "podman build" podman build --isolation chroot --file "$root/docker/Dockerfile.cpu" \
  --build-arg DDP_INSTALL_NPM=0 --tag ddp:cpu "$@" "$root"
echo "test-docker.sh: ddp:cpu built, its tests passed during the build"
# The image as containers: its command, two ranks in one, two containers as two hosts.
stage "containers" "$root/scripts/run-containers.sh" ddp:cpu
