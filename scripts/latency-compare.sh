#!/usr/bin/env bash
# Two builds of okso side by side on make latency-path: REF (any git
# revision) as A and the working tree as B, run in turn (A B A B ...) for
# ROUNDS rounds, then the median over the rounds of each segment of the
# path, for A and for B, and B - A.
#
# Usage: scripts/latency-compare.sh REF [ROUNDS]      (ROUNDS: 3)
# Environment: as scripts/latency-path.sh (GOGC, LATENCY_NODES, ...).
set -uo pipefail
cd "$(dirname "$0")/.."
ref=${1:?usage: scripts/latency-compare.sh REF [ROUNDS]}
rounds=${2:-3}
case $rounds in '' | *[!0-9]*) echo "ROUNDS=$rounds: want a number" >&2; exit 2 ;; esac
command -v go >/dev/null || { echo "latency-compare needs go" >&2; exit 2; }

work=$(mktemp -d /tmp/okso-latency-compare.XXXXXX)
trap 'git worktree remove --force "$work/a" 2>/dev/null; rm -rf "$work"' EXIT
git worktree add --detach "$work/a" "$ref" >/dev/null 2>&1 || { echo "no revision $ref" >&2; exit 2; }
echo "[latency-compare] building A ($ref) and B (the working tree)" >&2
(cd "$work/a" && go build -o "$work/okso-A" .) || exit 1
go build -o "$work/okso-B" . || exit 1

for ((r = 1; r <= rounds; r++)); do
	for v in A B; do
		echo "[latency-compare] round $r/$rounds: $v" >&2
		LATENCY_OKSO=$work/okso-$v ./scripts/latency-path.sh 2>/dev/null >"$work/$v-$r.out" ||
			{ echo "latency-path failed for $v:" >&2; tail -5 "$work/$v-$r.out" >&2; exit 1; }
	done
done

# Each row of pathtrace's table: a name, then p25, median, p75. The
# median over the rounds of each row's median, for A and for B.
awk -v rounds="$rounds" -v ref="$ref" '
	FNR == 1 { v = substr(FILENAME, length(FILENAME) - 6, 1) }  # A-1.out .. B-9.out
	/^  latency / {
		p = $3; us = p + 0; if (p ~ /ms$/ && p !~ /µs$/) us *= 1000; else if (p ~ /[0-9]s$/) us *= 1e6
		name = "client: p50 of the whole call (okso bench)"
		if (!(name in row)) { row[name] = 1; order[++rows] = name }
		val[name, v, ++n[name, v]] = us
		next
	}
	/^  (all-in-one|mock-fleet|total)/ {
		name = $0; sub(/ +[0-9.]+ +[0-9.]+ +[0-9.]+ *$/, "", name); sub(/^  /, "", name)
		if (!(name in row)) { row[name] = 1; order[++rows] = name }
		val[name, v, ++n[name, v]] = $(NF - 1)
	}
	function median(name, v,    k, i, j, t, a) {
		k = n[name, v]
		for (i = 1; i <= k; i++) a[i] = val[name, v, i] + 0
		for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
		return k % 2 ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2
	}
	END {
		printf "medians over %d rounds, µs (A: %s, B: the working tree)\n", rounds, ref
		printf "  %-64s %8s %8s %8s\n", "", "A", "B", "B - A"
		for (i = 1; i <= rows; i++) {
			a = median(order[i], "A"); b = median(order[i], "B")
			printf "  %-64s %8.1f %8.1f %+8.1f\n", order[i], a, b, b - a
		}
	}' "$work"/A-*.out "$work"/B-*.out
