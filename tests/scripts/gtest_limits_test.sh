#!/usr/bin/env bash
# scripts/lib/gtest_limits.py, which runs the sanitizer stage's test programs: a test past its
# limit is named with the seconds it ran, the program and the process it started are killed, and
# the exit status is 124; a program past its total limit names the test it was in; a passing
# program's "[ RUN ]" and "[ OK ]" lines are left out and its status kept; a failing one's status
# and failure lines are kept. The programs are shell scripts that print what a GoogleTest program
# prints. Usage: tests/scripts/gtest_limits_test.sh SOURCE_DIR
set -euo pipefail
limits="$(cd "$1" && pwd)/scripts/lib/gtest_limits.py"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

fail() {
  echo "FAIL: $1" >&2
  echo "--- output:" >&2
  cat "$tmp/out" >&2
  exit 1
}

# A program whose second test sleeps, with a child that sleeps as long (its pid in $tmp/child).
cat >"$tmp/hangs" <<EOF
#!/usr/bin/env bash
echo "[ RUN      ] Quick.Passes"
echo "[       OK ] Quick.Passes (1 ms)"
echo "[ RUN      ] Slow.SleepsPastItsLimit"
sleep 60 &
echo \$! >"$tmp/child"
sleep 60
EOF
chmod +x "$tmp/hangs"
start=$SECONDS
status=0
python3 "$limits" --per-test 2 --total 100 "$tmp/hangs" >"$tmp/out" 2>&1 || status=$?
took=$((SECONDS - start))
[[ $status -eq 124 ]] || fail "a test past its limit: exit $status, not 124"
grep -qE "^gtest_limits: hangs: Slow\.SleepsPastItsLimit ran [23] s, past its limit of 2 s" \
  "$tmp/out" || fail "the line naming the test and its seconds is missing"
[[ $took -lt 15 ]] || fail "the program was killed after $took s, not at its test's limit"
! grep -q "Quick.Passes" "$tmp/out" || fail "a passing test's RUN and OK lines were printed"
# Killed, it may stay a zombie a moment, until whoever inherited it reaps it.
gone() { ! kill -0 "$1" 2>/dev/null || [[ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" == Z ]]; }
for _ in $(seq 50); do gone "$(cat "$tmp/child")" && break; sleep 0.1; done
gone "$(cat "$tmp/child")" || fail "the test's child process was left running"

# The program's own limit, reached within a test's: the test it was in is named.
status=0
python3 "$limits" --per-test 100 --total 2 "$tmp/hangs" >"$tmp/out" 2>&1 || status=$?
[[ $status -eq 124 ]] || fail "a program past its limit: exit $status, not 124"
grep -qE "^gtest_limits: hangs: the program ran past its limit of 2 s; Slow\.SleepsPastItsLimit was running \([0-9]+ s\)" \
  "$tmp/out" || fail "the program's limit does not name the test it was in"

# A failing test: its lines and the program's status are kept.
cat >"$tmp/fails" <<'EOF'
#!/usr/bin/env bash
echo "[ RUN      ] Math.Adds"
echo "test.cpp:3: Failure: 1 + 1 != 3"
echo "[  FAILED  ] Math.Adds (0 ms)"
exit 1
EOF
chmod +x "$tmp/fails"
status=0
python3 "$limits" --per-test 10 --total 10 "$tmp/fails" >"$tmp/out" 2>&1 || status=$?
[[ $status -eq 1 ]] || fail "a failing program: exit $status, not 1"
grep -q "1 + 1 != 3" "$tmp/out" && grep -q "FAILED  \] Math.Adds" "$tmp/out" ||
  fail "a failure's lines were not kept"

# A passing program: status 0, and what the tests print themselves is kept.
printf '#!/usr/bin/env bash\necho "[ RUN      ] A.B"\necho "said by A.B"\necho "[       OK ] A.B (0 ms)"\n' \
  >"$tmp/passes"
chmod +x "$tmp/passes"
python3 "$limits" --per-test 10 --total 10 "$tmp/passes" >"$tmp/out" 2>&1 || fail "a passing program failed"
[[ "$(cat "$tmp/out")" == "said by A.B" ]] || fail "a passing program's output is not the brief one"
echo "gtest_limits: a test or a program past its limit is named, killed and exits 124"
