#!/usr/bin/env bash
# Fleet tools at scale (issue 30): N simulated devices (mock-fleet in its
# own process) on one `okso device` tier and one `okso gateway`, all on
# 127.0.0.1. Then, in the same run:
#   - the same N echo calls made one by one by `okso bench` (64 in flight,
#     8 sessions), as calls/s;
#   - fleet.call of system.echo over all N nodes (scripts/fleetbench:
#     FLEET_ROUNDS fan-outs, each checked for N ok rows), wall time and
#     calls/s;
#   - the p50 of fleet.nodes for a page of 1,000 and of okso.find_tools
#     over every tool (4 a node).
#
# Usage: scripts/fleet-bench.sh [N]       (default 10000; make fleet-bench N=1000)
# Environment:
#   FLEET_ROUNDS        fan-outs timed (3)
#   FLEET_CONCURRENCY   fleet.call's and okso bench's calls in flight (64)
#   FLEET_BENCH_TIME    okso bench's measured time (10s)
#   FLEET_KEEP          1: keep the work dir (logs)
# Exit status: 0 when every device connected and every fan-out answered N
# ok rows; 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."

N=${1:-10000}
ROUNDS=${FLEET_ROUNDS:-3}
CONCURRENCY=${FLEET_CONCURRENCY:-64}
BENCH_TIME=${FLEET_BENCH_TIME:-10s}
case $N in '' | *[!0-9]*) echo "usage: $0 [N]" >&2; exit 2 ;; esac

NAME=fleet-bench KEEP=${FLEET_KEEP:-0}
. scripts/lib.sh
data=$work/data
mkdir -p "$data"
want_open_files $((N + N / 4 + 4096))

log "building bin/okso and fleetbench"
go build -o bin/okso . || exit 1
go build -o "$work/fleetbench" ./scripts/fleetbench || exit 1
OKSO=$PWD/bin/okso

"$OKSO" token mint --data-dir "$data" --tenant demo >"$work/token" 2>"$work/token.err" || {
	log "token mint failed: $(cat "$work/token.err")"; status=1; exit 1; }
start_split "$data" || { status=1; exit 1; }
log "tier pid $tier, gateway pid $gw at $mcp_url"

log "mock-fleet -n $N"
"$OKSO" mock-fleet -n "$N" --connect "$device_url" --data-dir "$data" >"$work/fleet.out" 2>"$work/fleet.log" &
fleet=$!
pids+=("$fleet")
l=$(wait_for "$work/fleet.log" "$fleet" '"msg":"mock devices connected"' 600) || { status=1; exit 1; }
log "connected: $(jq -r .elapsed <<<"$l")"
load_start=$(cut -d' ' -f1-3 /proc/loadavg)

log "okso bench: the same calls one by one, $CONCURRENCY in flight, $BENCH_TIME"
OKSO_TOKEN=$(cat "$work/token") "$OKSO" bench --url "$mcp_url" --tool 'sysecho-*-echo-invoke' --concurrency "$CONCURRENCY" \
	--sessions 8 --duration "$BENCH_TIME" --warmup 2s --json >"$work/bench.json" 2>"$work/bench.err" ||
	{ log "okso bench failed: $(tail -2 "$work/bench.err")"; status=1; }
one_by_one=$(jq -r '.ok_per_s | floor' "$work/bench.json" 2>/dev/null)
log "okso bench: $one_by_one calls/s, p50 $(jq -r .latency_ms.p50 "$work/bench.json" 2>/dev/null) ms"

log "fleetbench: $ROUNDS fan-outs over $N nodes, fleet.nodes and okso.find_tools p50"
"$work/fleetbench" -url "$mcp_url" -token-file "$work/token" -n "$N" -rounds "$ROUNDS" -concurrency "$CONCURRENCY" \
	-out "$work/results" 2>&1 | tee "$work/fleetbench.out"
[ "${PIPESTATUS[0]}" != 0 ] && status=1
load_end=$(cut -d' ' -f1-3 /proc/loadavg)

r() { awk -F= -v k="$1" '$1==k{sub(/^[^=]*=/,""); print; exit}' "$work/results" 2>/dev/null; }
fan=$(r fanout_calls_per_s)
echo
echo "== okso fleet-bench (N=$N, $(nproc) cores, load $load_start -> $load_end)"
row() { printf '  %-44s %s\n' "$1" "$2"; }
row "fleet.call over all N nodes (median wall)" "$(r fanout_wall) = ${fan:-?} calls/s ($ROUNDS rounds, concurrency $CONCURRENCY)"
row "the same calls one by one (okso bench)" "${one_by_one:-?} calls/s"
row "fan-out / one by one" "$(awk -v a="${fan:-0}" -v b="${one_by_one:-0}" 'BEGIN{if (b > 0) printf "%.2f", a/b; else print "-"}')"
row "fleet.nodes, a page of 1,000 (p50)" "$(r nodes_page_p50)"
row "okso.find_tools over $((N * 4)) tools (p50)" "$(r find_tools_p50)"
exit "$status"
