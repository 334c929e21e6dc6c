#!/usr/bin/env bash
# Runs every Go fuzz target in the module for a bounded time each (default 5s), one after
# the other, so `make test` exercises the parsers beyond their seed corpus. Crashers are
# written to testdata/fuzz/ by `go test` and then run as regression tests by `go test`.
set -euo pipefail
fuzztime=${1:-5s}
cd "$(dirname "$0")/.."
for pkg in $(go list ./internal/...); do
  dir=$(go list -f '{{.Dir}}' "$pkg")
  for target in $(grep -ho '^func Fuzz[A-Za-z0-9_]*' "$dir"/*_test.go 2>/dev/null | sed 's/^func //' | sort -u); do
    echo ">> fuzz $pkg $target ($fuzztime)"
    go test -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" "$pkg"
  done
done
