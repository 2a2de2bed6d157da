# shellcheck shell=bash
# stage NAME COMMAND...: runs COMMAND and prints how long it took ("stage: NAME: 3 min 12 s", also
# when it fails), so that a CI log says where its minutes went. Returns COMMAND's status.
stage() {
  local name="$1" start=$SECONDS status=0
  shift
  "$@" || status=$?
  local took=$((SECONDS - start))
  printf 'stage: %s: %d min %02d s%s\n' "$name" $((took / 60)) $((took % 60)) \
    "$([[ $status -ne 0 ]] && echo " (failed, exit $status)")"
  return "$status"
}
