#!/usr/bin/env bash
# What metrics and tracing (off) cost a call, in benchmarks rather than
# noisy throughput (issue 32): BenchmarkFastPath (the gateway's fast path
# alone) and BenchmarkCallPath (the whole path in one process) at REF, a
# revision from before the telemetry, and at the working tree, run in
# turn (A B A B ...) ROUNDS times, then compared by benchstat: ns/op and
# allocs/op of each. BenchmarkCallPath's nats=roles,metrics exists only
# in B: compare it with B's nats=roles for what the metrics add.
#
# Usage: scripts/telemetry-cost.sh [REF] [ROUNDS]
#        (REF: 333afd1^, the last revision without metrics or tracing;
#        ROUNDS: 6)
set -uo pipefail
cd "$(dirname "$0")/.."
ref=${1:-333afd1^}
rounds=${2:-6}
case $rounds in '' | *[!0-9]*) echo "ROUNDS=$rounds: want a number" >&2; exit 2 ;; esac
command -v go >/dev/null || { echo "telemetry-cost needs go" >&2; exit 2; }
benchstat=$(go env GOPATH)/bin/benchstat
[ -x "$benchstat" ] || go install golang.org/x/perf/cmd/benchstat@latest || exit 1

work=$(mktemp -d /tmp/okso-telemetry-cost.XXXXXX)
trap 'git worktree remove --force "$work/a" 2>/dev/null; rm -rf "$work"' EXIT
git worktree add --detach "$work/a" "$ref" >/dev/null 2>&1 || { echo "no revision $ref" >&2; exit 2; }
echo "[telemetry-cost] building the benchmarks of A ($ref) and B (the working tree)" >&2
for v in A B; do
	dir=.
	[ "$v" = A ] && dir=$work/a
	(cd "$dir" && go test -c -o "$work/mcp-$v.test" ./mcp && go test -c -o "$work/roles-$v.test" ./roles) || exit 1
done
for ((r = 1; r <= rounds; r++)); do
	for v in A B; do
		echo "[telemetry-cost] round $r/$rounds: $v" >&2
		(cd mcp && "$work/mcp-$v.test" -test.run '^$' -test.bench '^BenchmarkFastPath$' -test.benchmem -test.benchtime 20000x) >>"$work/$v.txt" || exit 1
		(cd roles && "$work/roles-$v.test" -test.run '^$' -test.bench '^BenchmarkCallPath$' -test.benchmem -test.benchtime 3000x) >>"$work/$v.txt" || exit 1
	done
done
"$benchstat" A="$work/A.txt" B="$work/B.txt"
