#!/usr/bin/env bash
# Runs every Go fuzz target in the module for a bounded budget each (default 200000
# executions; a duration such as 10s works too), one after the other, so `make test`
# exercises the parsers beyond their seed corpus. Crashers are written to testdata/fuzz/ by
# `go test` and then run as regression tests by every plain `go test`.
set -euo pipefail
fuzztime=${1:-200000x}
cd "$(dirname "$0")/.."
for pkg in $(go list ./internal/...); do
  dir=$(go list -f '{{.Dir}}' "$pkg")
  for target in $(grep -ho '^func Fuzz[A-Za-z0-9_]*' "$dir"/*_test.go 2>/dev/null | sed 's/^func //' | sort -u); do
    echo ">> fuzz $pkg $target ($fuzztime)"
    go test -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" -timeout 10m "$pkg"
  done
done
