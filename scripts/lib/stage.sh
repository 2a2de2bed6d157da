# shellcheck shell=bash
# shellcheck source=scripts/lib/ccache.sh
source "$(dirname "${BASH_SOURCE[0]}")/ccache.sh"
# stage NAME COMMAND...: runs COMMAND and prints how long it took and the CPU time its processes
# used ("stage: NAME: 3 min 12 s, CPU 351 s", also when it fails), so that a CI log says where its
# minutes went, and a slower machine's minutes can be told from more work. Returns COMMAND's
# status. Where builds go through ccache (scripts/lib/ccache.sh), it adds the stage's
# compilations: "(ccache: 310 hits, 2 misses)".
#
# The CPU time is this shell's children's (user and system, every descendant that its parent
# waited for: compilers, tests, the ranks they start, a chroot's whole run), read from
# /proc/self/stat's cutime and cstime before and after; daemons that leave their parent (a test's
# throw-away Slurm) are not in it.
# (in this shell, not a command substitution's: $BASHPID is the shell that reads)
_stage_children_ticks() {
  local -a fields
  read -r -a fields <"/proc/$BASHPID/stat"
  _stage_ticks=$((fields[15] + fields[16]))
}

stage() {
  local name="$1" start=$SECONDS status=0 before="" ticks
  shift
  [[ -z "${CCACHE_DIR:-}" ]] || before="$(ddp_ccache_counts)"
  _stage_children_ticks
  ticks=$_stage_ticks
  "$@" || status=$?
  _stage_children_ticks
  ticks=$((_stage_ticks - ticks))
  local took=$((SECONDS - start)) cached=""
  if [[ -n "$before" ]]; then
    cached="$(echo "$before $(ddp_ccache_counts)" | awk '
      $4 + $5 + $6 > $1 + $2 + $3 {
        printf " (ccache: %d hits, %d misses", $4 - $1, $5 - $2
        if ($6 > $3) printf ", %d not cacheable", $6 - $3
        printf ")"
      }')"
  fi
  printf 'stage: %s: %d min %02d s, CPU %d s%s%s\n' "$name" $((took / 60)) $((took % 60)) \
    $((ticks / $(getconf CLK_TCK))) "$cached" \
    "$([[ $status -ne 0 ]] && echo " (failed, exit $status)")"
  return "$status"
}
