#!/usr/bin/env bash
# relay-bench: the caller-tool relay (DESIGN.md §9.3) across two gateway
# replicas on one NATS. Replica 1 (okso gateway --nats-listen) holds the
# listen of an agent that answers each caller_tool_request at once;
# another agent of the tenant calls its tool on replica 2 (okso gateway
# --nats-url): each call crosses NATS to replica 1, is pushed to the
# listener, and its answer crosses back. Both agents are official Go SDK
# clients (scripts/relaybench). Prints the relayed calls/s at 64 in
# flight, p50/p99 at 1 in flight, each gateway's goroutines and heap
# before and after RELAY_CALLS relayed calls, the targets, and the CPU
# used per relayed call and the top of the CPU profile at 64 in flight of
# each gateway and of relaybench itself (the load generator shares the
# machine: its share is part of the picture).
#
# Environment:
#   BENCH_DURATION  measured time of each timed phase (10s)
#   BENCH_WARMUP    warm-up of each timed phase, and before the first snapshot (2s)
#   RELAY_CALLS     relayed calls between the two snapshots (100000)
#   RELAY_ANSWER    the replica the listener answers on: 1, its own (default),
#                   or 2 (each answer is then forwarded to replica 1 over NATS)
#   RELAY_SETTLE    also snapshot the gateways this long after the second
#                   snapshot (e.g. 60s, the --caller-timeout, by which each
#                   relayed call's own timer has run out; default none)
#   RELAY_GATEWAY_FLAGS  more flags for both gateways (e.g. --caller-timeout 5s)
#   RELAY_GC_PERCENT  relaybench's own GOGC (1600); the gateways keep Go's default.
#                   The load shares the machine with the gateways, and the Go
#                   SDK's client decodes every message with a fresh 32 KiB
#                   buffer: at the default of 100 relaybench spends about a
#                   third of its CPU collecting garbage, CPU the gateways then
#                   lack. Its live heap is a few MiB, so 1600 costs it some
#                   100 MiB; 100 measures the load as a default Go client runs.
#   BENCH_OKSO      an okso binary to run instead of building bin/okso
#   BENCH_KEEP      1: keep the work dir (logs, JSON, CPU profiles)
set -u
cd "$(dirname "$0")/.."
DURATION=${BENCH_DURATION:-10s}
WARMUP=${BENCH_WARMUP:-2s}
CALLS=${RELAY_CALLS:-100000}
ANSWER=${RELAY_ANSWER:-1}
SETTLE=${RELAY_SETTLE:-0s}
GC_PERCENT=${RELAY_GC_PERCENT:-1600}
read -r -a gateway_flags <<<"${RELAY_GATEWAY_FLAGS:-}"
case $ANSWER in 1 | 2) ;; *) echo "RELAY_ANSWER=$ANSWER: want 1 or 2" >&2; exit 2 ;; esac
command -v jq >/dev/null || { echo "relay-bench needs jq" >&2; exit 2; }

NAME=relay-bench KEEP=${BENCH_KEEP:-0}
. scripts/lib.sh

use_okso BENCH_OKSO
go build -o "$work/relaybench" ./scripts/relaybench || exit 1

# --- tokens: two agents of one tenant (this also makes the signing key) ------------------
mint() {
	"$OKSO" token mint --data-dir "$work/data" --subject "$1" --scope tools:call:mutating 2>"$work/mint.err" || {
		log "token mint failed: $(cat "$work/mint.err")"; status=1; exit 1; }
}
listen_token=$(mint relay-listener)
call_token=$(mint relay-caller)

# --- two gateway replicas on one NATS ------------------------------------------------------
# gateway N [FLAGS...]: starts replica N; sets mcpN and debugN (its
# endpoints) and, for the first, nats_url.
gateway() {
	local n=$1 pid line
	shift
	"$OKSO" gateway --mcp-addr 127.0.0.1:0 --data-dir "$work/data" --debug-addr 127.0.0.1:0 "${gateway_flags[@]}" "$@" \
		>"$work/gw$n.out" 2>"$work/gw$n.log" &
	pid=$!
	pids+=("$pid")
	line=$(wait_for "$work/gw$n.log" "$pid" '"msg":"debug listener"' 30) || { status=1; exit 1; }
	printf -v "debug$n" %s "$(jq -r '.debug_url | sub("/debug/pprof/$"; "")' <<<"$line")"
	line=$(wait_for "$work/gw$n.log" "$pid" '"msg":"listening"' 30) || { status=1; exit 1; }
	printf -v "mcp$n" %s "$(jq -r .mcp_url <<<"$line")"
	[ "$n" = 1 ] && nats_url=$(jq -r .nats_url <<<"$line")
	local m="mcp$n" d="debug$n"
	log "replica $n pid $pid: ${!m}, debug ${!d}"
}
gateway 1 --nats-listen 127.0.0.1:0
gateway 2 --nats-url "$nats_url"
answer_url=$mcp1
[ "$ANSWER" = 2 ] && answer_url=$mcp2

# --- the run --------------------------------------------------------------------------------
mkdir -p "$work/profiles"
log "relaybench (GOGC $GC_PERCENT): warm-up $WARMUP, $CALLS relayed calls, then $DURATION at 1 and at 64 in flight"
if ! RELAYBENCH_LISTEN_TOKEN=$listen_token RELAYBENCH_CALL_TOKEN=$call_token "$work/relaybench" \
	-listen-url "$mcp1" -answer-url "$answer_url" -call-url "$mcp2" \
	-debug "replica1=$debug1,replica2=$debug2" -calls "$CALLS" -concurrency 64 -sessions 8 \
	-duration "$DURATION" -warmup "$WARMUP" -profile-dir "$work/profiles" -settle "$SETTLE" -gc-percent "$GC_PERCENT" >"$work/relay.json"; then
	status=1
fi
[ -s "$work/relay.json" ] || { log "relaybench wrote no figures"; status=1; exit 1; }

# --- the table ------------------------------------------------------------------------------
j() { jq -r "$1" "$work/relay.json"; }
errs() { j "($1 // {}) | to_entries | map(\"\\(.key) \\(.value)\") | join(\", \") | if . == \"\" then \"0\" else . end"; }
mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }
echo
echo "== the caller-tool relay: the listener on replica 1, answering on replica $ANSWER; the caller on replica 2"
printf '%-36s %14s %12s %12s\n' "" "relayed/s" "p50" "p99"
printf '%-36s %14.0f %10.3fms %10.3fms   errors: %s\n' "1 in flight, 1 session ($DURATION)" \
	"$(j '.c1.ok_per_s // 0')" "$(j '.c1.latency_ms.p50 // 0')" "$(j '.c1.latency_ms.p99 // 0')" "$(errs .c1.errors)"
printf '%-36s %14.0f %10.3fms %10.3fms   errors: %s\n' "64 in flight, 8 sessions ($DURATION)" \
	"$(j '.cn.ok_per_s // 0')" "$(j '.cn.latency_ms.p50 // 0')" "$(j '.cn.latency_ms.p99 // 0')" "$(errs .cn.errors)"
echo
printf '%s relayed calls at 64 in flight: %.1f s, %.0f/s, errors: %s\n' "$(j .relay.calls)" \
	"$(j .relay.seconds)" "$(j .relay.per_s)" "$(errs .relay.errors)"
printf '%-22s %14s %14s %8s %14s %14s %8s\n' "" "replica 1 before" "after" "diff" "replica 2 before" "after" "diff"
row() { # LABEL FIELD SCALE
	local out=() g b a
	for g in 0 1; do
		b=$(j ".gateways[$g].before.$2") a=$(j ".gateways[$g].after.$2")
		if [ "$3" = mib ]; then
			out+=("$(mib "$b")" "$(mib "$a")" "$(awk -v b="$b" -v a="$a" 'BEGIN { printf "%+.1f", (a - b) / 1048576 }')")
		else
			out+=("$b" "$a" "$(awk -v b="$b" -v a="$a" 'BEGIN { printf "%+d", a - b }')")
		fi
	done
	printf '%-22s %16s %14s %8s %16s %14s %8s\n' "$1" "${out[@]}"
}
row goroutines goroutines n
row "heap in use (MiB)" heap_inuse mib
row "heap objects" heap_objects n
echo "  (each after a GC, with the clients' idle connections closed; the listen stays open)"
if [ "$(j '.gateways[0].settled != null')" = true ]; then
	echo "  $SETTLE later: $(j '[.gateways[] | "\(.name) \(.settled.goroutines) goroutines, \(.settled.heap_inuse / 1048576 * 10 | round / 10) MiB heap, \(.settled.heap_objects) objects"] | join("; ")')"
fi
listener=$(j '.listener | "\(.requests) requests pushed, \(.answered) answers accepted" + (if (.refused // {}) == {} then "" else ", refused: \(.refused)" end) + (if .ended then ", " + .ended else "" end)')
echo "  listener: $listener"

echo
echo "targets (DESIGN.md §9.3, issue 18), on this machine:"
verdict() { awk -v v="$1" -v t="$2" -v op="$3" 'BEGIN { ok = (op == "le") ? v <= t : v >= t; print ok ? "met" : "NOT met" }'; }
p50=$(j '.c1.latency_ms.p50 // 1e9') rate=$(j '.cn.ok_per_s // 0')
printf '  p50 <= 2 ms at 1 in flight:                     %8.3f ms  %s\n' "$p50" "$(verdict "$p50" 2 le)"
printf '  >= 2,000 relayed calls/s at 64 in flight:       %8.0f /s  %s\n' "$rate" "$(verdict "$rate" 2000 ge)"
growth=$(j '[.gateways[] | "\(.name): \(.after.goroutines - .before.goroutines) goroutines, \((.after.heap_inuse - .before.heap_inuse) / 1048576 * 10 | round / 10) MiB heap"] | join("; ")')
echo "  no growth in goroutines or memory after $(j .relay.calls) relayed calls: $growth"
echo "  machine: $(nproc) cores, load avg $(cut -d' ' -f1-3 /proc/loadavg); all processes share it, on 127.0.0.1"
echo "  relaybench runs with GOGC $GC_PERCENT (RELAY_GC_PERCENT), the gateways with Go's defaults"

# --- where the CPU goes at 64 in flight: each gateway, and relaybench itself ----------------
calls=$(j '(.cn.ok // 0) + ((.cn.errors // {}) | add // 0)')
echo
echo "CPU at 64 in flight ($DURATION, $calls relayed calls; from the CPU profiles):"
for f in $(j '.profiles // [] | .[]'); do
	secs=$(go tool pprof -top -nodecount=1 "$f" 2>/dev/null | sed -n 's/.*Total samples = \([0-9.]*\)\(m\?s\).*/\1 \2/p')
	read -r v unit <<<"${secs:-0 s}"
	[ "$unit" = ms ] && v=$(awk -v v="$v" 'BEGIN { print v / 1000 }')
	printf '  %-12s %6.2f s CPU, %6.3f ms per relayed call\n' "$(basename "$f" .cpu.pprof)" "$v" \
		"$(awk -v v="$v" -v n="$calls" 'BEGIN { print (n > 0 ? v * 1000 / n : 0) }')"
done
for f in $(j '.profiles // [] | .[]'); do
	echo
	echo "== $(basename "$f" .cpu.pprof): go tool pprof -top ($DURATION at 64 in flight)"
	go tool pprof -top -nodecount=20 "$f" 2>/dev/null | sed -n '/^Showing\|flat%/,$p'
done
exit "$status"
