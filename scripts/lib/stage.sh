# shellcheck shell=bash
# shellcheck source=scripts/lib/ccache.sh
source "$(dirname "${BASH_SOURCE[0]}")/ccache.sh"
# stage NAME COMMAND...: runs COMMAND and prints how long it took ("stage: NAME: 3 min 12 s", also
# when it fails), so that a CI log says where its minutes went. Returns COMMAND's status. Where
# builds go through ccache (scripts/lib/ccache.sh), it adds the stage's compilations: "(ccache:
# 310 hits, 2 misses)".
stage() {
  local name="$1" start=$SECONDS status=0 before=""
  shift
  [[ -z "${CCACHE_DIR:-}" ]] || before="$(ddp_ccache_counts)"
  "$@" || status=$?
  local took=$((SECONDS - start)) cached=""
  if [[ -n "$before" ]]; then
    cached="$(echo "$before $(ddp_ccache_counts)" | awk '
      $4 + $5 + $6 > $1 + $2 + $3 {
        printf " (ccache: %d hits, %d misses", $4 - $1, $5 - $2
        if ($6 > $3) printf ", %d not cacheable", $6 - $3
        printf ")"
      }')"
  fi
  printf 'stage: %s: %d min %02d s%s%s\n' "$name" $((took / 60)) $((took % 60)) "$cached" \
    "$([[ $status -ne 0 ]] && echo " (failed, exit $status)")"
  return "$status"
}
