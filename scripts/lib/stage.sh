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

# ci_summary START STATUS: the one line a CI run ends with, whatever its status: its wall time
# since START ($SECONDS then), the CPU seconds of this shell and every process it waited for (all
# the stages', as stage() counts them), and the machine's CPU, so that a run on a slower machine
# can be told from a run that did more work. docs/design.md ("Build and CI time") keeps the figures.
ci_summary() {
  local start="$1" status="$2" took model
  local -a fields
  read -r -a fields <"/proc/$BASHPID/stat"
  took=$((SECONDS - start))
  # "AMD EPYC, family 25 model 17, 2.6 GHz": a virtual machine's model name may be no more than
  # the vendor's brand, and the family, model and clock tell the machines of a kind apart.
  model="$(awk -F': *' '/^model name/ && !n {n = $2} /^cpu family/ && !f {f = $2}
    /^model[[:space:]]*:/ && !m {m = $2} /^cpu MHz/ && !c {c = $2}
    END {printf "%s, family %s model %s, %.1f GHz", n, f, m, c / 1000}' /proc/cpuinfo)"
  printf 'ci: %s in %d min %02d s, CPU %d s, on %s (%d cores)\n' \
    "$([[ $status -eq 0 ]] && echo passed || echo "failed (exit $status)")" $((took / 60)) \
    $((took % 60)) $(((fields[13] + fields[14] + fields[15] + fields[16]) / $(getconf CLK_TCK))) \
    "$model" "$(nproc)"
}
