# shellcheck shell=bash
# Functions for a Debian root (a chroot) made with mmdebstrap, cached between runs on one machine.
# Sourced by scripts/test-trixie.sh and scripts/check-gpu-kit.sh; needs root.
#
#   debian_root_make SUITE DIR [PACKAGE...]  makes DIR (unless DIR already holds SUITE with those
#                                             packages), from Debian's archive
#   debian_root_clone DIR REPO               a fresh clone of REPO's HEAD at DIR/work/ddp
#   debian_root_run DIR COMMAND              runs COMMAND (a bash string) inside DIR, with /proc,
#                                             /sys, /dev, /dev/pts and /dev/shm mounted for its
#                                             duration; they are unmounted whatever happens. The
#                                             host's DDP_CCACHE_ROOT, where set, is mounted at its
#                                             own path and set inside (the builds' caches outlive
#                                             the root: scripts/lib/ccache.sh)

debian_root_make() {
  local suite="$1" dir="$2"
  shift 2
  local want="$suite ${*}"
  if [ -f "$dir/.ddp-root" ] && [ "$(cat "$dir/.ddp-root")" = "$want" ]; then
    echo "debian-root: reusing $dir ($suite)"
    return 0
  fi
  if ! command -v mmdebstrap >/dev/null; then
    echo "debian-root: installing mmdebstrap"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends mmdebstrap \
      >/dev/null || { apt-get update -q >/dev/null &&
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends mmdebstrap >/dev/null; }
  fi
  # Made aside and moved in place, so that an interrupted run leaves no half root to reuse.
  _debian_root_unmount_all "$dir"
  rm -rf --one-file-system "$dir.new"
  mkdir -p "$(dirname "$dir")"
  local include="ca-certificates${*:+,$(IFS=,; echo "$*")}"
  echo "debian-root: making $dir ($suite, with $include)"
  mmdebstrap --quiet --variant=apt --include="$include" "$suite" "$dir.new" \
    http://deb.debian.org/debian
  echo "$want" >"$dir.new/.ddp-root"
  rm -rf --one-file-system "$dir"
  mv "$dir.new" "$dir"
}

debian_root_clone() {
  local dir="$1" repo="$2"
  rm -rf --one-file-system "$dir/work"
  mkdir -p "$dir/work"
  git clone -q "$repo" "$dir/work/ddp"
}

# Whatever is still mounted under DIR (a run killed before it could clean up): unmounted before
# anything there is removed, so that no rm -rf can reach the host's /dev or /sys through it.
_debian_root_unmount_all() {
  local mounts
  mounts="$(awk -v d="$1" '$2 == d || index($2, d "/") == 1 || index($2, d ".new/") == 1 {print $2}' \
            /proc/mounts | sort -r)"
  if [ -n "$mounts" ]; then
    echo "debian-root: unmounting what a former run left under $1"
    echo "$mounts" | xargs -r -n1 umount -l
  fi
}

# The mounts of one debian_root_run, innermost last; _debian_root_unmount undoes them in reverse.
_debian_root_mounts=()

_debian_root_unmount() {
  local i
  for ((i = ${#_debian_root_mounts[@]} - 1; i >= 0; i--)); do
    umount -l "${_debian_root_mounts[i]}" 2>/dev/null || true
  done
  _debian_root_mounts=()
}

debian_root_run() {
  local dir="$1" command="$2"
  _debian_root_unmount_all "$dir"
  trap _debian_root_unmount EXIT
  # The root a mount point of its own: `ip netns` and `ip -n` remount "/" (--make-rslave), which
  # fails with EINVAL where "/" is a mere directory.
  mount --bind "$dir" "$dir" && _debian_root_mounts+=("$dir")
  mount -t proc proc "$dir/proc" && _debian_root_mounts+=("$dir/proc")
  mount --rbind /sys "$dir/sys" && _debian_root_mounts+=("$dir/sys")
  mount --rbind /dev "$dir/dev" && _debian_root_mounts+=("$dir/dev")
  # A bind of /dev carries /dev/pts and /dev/shm where the host mounts them; where it does not,
  # the progress test's pseudo-terminal and Open MPI's shared memory need their own.
  if ! mountpoint -q "$dir/dev/pts"; then
    mkdir -p "$dir/dev/pts"
    mount -t devpts -o newinstance,ptmxmode=0666 devpts "$dir/dev/pts" &&
      _debian_root_mounts+=("$dir/dev/pts")
  fi
  if ! mountpoint -q "$dir/dev/shm"; then
    mkdir -p "$dir/dev/shm"
    mount -t tmpfs -o mode=1777 shm "$dir/dev/shm" && _debian_root_mounts+=("$dir/dev/shm")
  fi
  if [[ -n "${DDP_CCACHE_ROOT:-}" ]]; then
    mkdir -p "$DDP_CCACHE_ROOT" "$dir$DDP_CCACHE_ROOT"
    mount --bind "$DDP_CCACHE_ROOT" "$dir$DDP_CCACHE_ROOT" && _debian_root_mounts+=("$dir$DDP_CCACHE_ROOT")
  fi
  cp -L /etc/resolv.conf "$dir/etc/resolv.conf" 2>/dev/null || true
  # The host's name must resolve inside as well: Slurm 24.11's slurmctld answers a client (scancel)
  # at the host name in its credential, and fails after 10 s where that name is unknown.
  cp -L /etc/hosts "$dir/etc/hosts" 2>/dev/null || true
  local status=0
  chroot "$dir" /usr/bin/env -i HOME=/root TERM="${TERM:-dumb}" LANG=C.UTF-8 CI="${CI:-}" \
    DDP_CCACHE_ROOT="${DDP_CCACHE_ROOT:-}" DDP_CI_DEADLINE="${DDP_CI_DEADLINE:-}" \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    /bin/bash -c "$command" || status=$?
  _debian_root_unmount
  trap - EXIT
  return "$status"
}
