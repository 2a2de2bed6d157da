#!/usr/bin/env bash
# scripts/plot_metrics on the metrics of two real runs (1 rank, and 2 ranks under the launcher):
# it must write a real PNG and say on stdout what it plotted of each run; a broken metrics line
# must give exit code 2 and name the file and line.
# Usage: tests/scripts/plot_metrics_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
# The Python that has Debian's matplotlib (a python3 first on PATH, e.g. pyenv's, may not).
python=${DDP_PYTHON:-/usr/bin/python3}
plot=$src/scripts/plot_metrics

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"

# Runs a command with its output in a log, shown only when it fails.
quietly() {
  local log=$1
  shift
  if ! "$@" >"$log" 2>&1; then
    echo "FAIL: $* exited non-zero; its output:" >&2
    cat "$log" >&2
    exit 1
  fi
}

[[ -x $plot ]] || { echo "FAIL: $plot is not executable" >&2; exit 1; }

train=(--config "$src/configs/fashion_mnist_mlp.yaml" --train-subset 2000 --epochs 2 --threads 1)
echo "training 1 rank, then 2 ranks under the launcher"
quietly one.log "$build/ddp_train" "${train[@]}" --output-dir "$tmp/one"
quietly two.log "$build/launcher" --nproc 2 \
  "$build/ddp_train" "${train[@]}" --output-dir "$tmp/two"

# A dir and a .jsonl file are both accepted as a run.
quietly plot.log "$python" "$plot" "$tmp/one" "$tmp/two/metrics.jsonl" -o "$tmp/metrics.png" \
  --title "plot_metrics test"
cat plot.log

"$python" - "$tmp" <<'EOF'
import struct
import sys

tmp = sys.argv[1]
png = open(f"{tmp}/metrics.png", "rb").read()
assert png[:8] == b"\x89PNG\r\n\x1a\n", f"no PNG signature: {png[:8]!r}"
assert png[12:16] == b"IHDR", "the first chunk is not IHDR"
width, height = struct.unpack(">II", png[16:24])
assert 600 <= width <= 4000 and 200 <= height <= 2000, f"odd size {width}x{height}"
assert len(png) > 5000, f"only {len(png)} bytes"
out = open(f"{tmp}/plot.log").read().splitlines()
for run in (f"{tmp}/one", f"{tmp}/two/metrics.jsonl"):
    line = f"plot_metrics: {run}: 2 epochs: train_loss, test_loss, test_accuracy, samples_per_s"
    assert line in out, f"no line {line!r} in {out}"
print(f"ok: {width}x{height} PNG, {len(png)} bytes, both runs named with 2 epochs")
EOF

# Bad input: a metrics file whose second line is cut off.
head -n 1 "$tmp/one/metrics.jsonl" >bad.jsonl
echo '{"epoch": 2, "steps": 6' >>bad.jsonl
status=0
"$python" "$plot" "$tmp/bad.jsonl" -o "$tmp/bad.png" >bad.out 2>bad.err || status=$?
"$python" - "$tmp" "$status" <<'EOF'
import sys

tmp, status = sys.argv[1], int(sys.argv[2])
err = open(f"{tmp}/bad.err").read()
assert status == 2, f"exit code {status}, not 2; stderr: {err}"
assert err.startswith(f"plot_metrics: {tmp}/bad.jsonl:2: bad JSON"), f"stderr: {err!r}"
assert len(err.splitlines()) == 1, f"more than one line on stderr: {err!r}"
print(f"ok: broken line gives exit 2 and: {err.strip()}")
EOF
echo "PASS"
