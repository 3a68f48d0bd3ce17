#!/usr/bin/env bash
# Where a call's time goes (issue 6): okso all-in-one and a mock fleet of
# LATENCY_NODES devices, driven at one call in flight by `okso bench`; in
# the middle of the run a Go execution trace is taken of both processes
# (--debug-addr), and scripts/pathtrace merges the two on their common
# clock and splits each call into the segments of its path: the gateway's
# checks, NATS to the tier, the kernel's delivery to the device, the
# device's own work, the delivery back, NATS to the gateway, the gateway's
# result checks; and the write syscalls apart. Prints the quartiles of
# each. scripts/latency-compare.sh runs it for two builds in turn.
#
# Usage: scripts/latency-path.sh          (make latency-path)
# Environment:
#   LATENCY_NODES      mock devices (1000)
#   LATENCY_TRACE      trace length (2s; a second of trace is ~1 MB)
#   LATENCY_PROTOCOL   MCP protocol version (2025-11-25)
#   GOGC, GOMAXPROCS   given to okso all-in-one (the fleet and the load
#                      generator run at Go's defaults)
#   LATENCY_KEEP       1: keep the work dir (the traces, for go tool trace)
#   LATENCY_OKSO       an okso binary to run instead of building bin/okso
#                      (to compare two builds, run each in turn)
set -uo pipefail
cd "$(dirname "$0")/.."

NODES=${LATENCY_NODES:-1000}
TRACE=${LATENCY_TRACE:-2s}
PROTOCOL=${LATENCY_PROTOCOL:-2025-11-25}
case $TRACE in *s) secs=${TRACE%s} ;; *) echo "LATENCY_TRACE=$TRACE: want seconds, e.g. 2s" >&2; exit 2 ;; esac
case $secs in '' | *[!0-9]*) echo "LATENCY_TRACE=$TRACE: want whole seconds" >&2; exit 2 ;; esac
command -v curl >/dev/null || { echo "latency-path needs curl" >&2; exit 2; }

NAME=latency-path KEEP=${LATENCY_KEEP:-0}
. scripts/lib.sh

use_okso LATENCY_OKSO
go build -o "$work/pathtrace" ./scripts/pathtrace || exit 1
want_open_files $((NODES + NODES / 4 + 4096))

[ -n "${GOGC:-}" ] && okso_env+=("GOGC=$GOGC")
[ -n "${GOMAXPROCS:-}" ] && okso_env+=("GOMAXPROCS=$GOMAXPROCS")
fleet_flags=(--debug-addr 127.0.0.1:0)
start_okso "$NODES" 'sysecho.*' --debug-addr 127.0.0.1:0 || { status=1; exit 1; }
debug_url() { wait_for "$1" "$2" '"debug_url"' 10 | sed 's/.*"debug_url":"\([^"]*\)".*/\1/'; }
okso_debug=$(debug_url "$work/okso.log" "$okso") || { status=1; exit 1; }
fleet_debug=$(debug_url "$work/fleet.log" "$fleet") || { status=1; exit 1; }

# The run: warm-up, then the trace in its middle.
"$OKSO" bench --url "$okso_url" --tool 'sysecho.*' --concurrency 1 --sessions 1 --protocol "$PROTOCOL" \
	--warmup 2s --duration $((secs + 4))s >"$work/bench.out" 2>&1 &
b=$!
pids+=("$b")
sleep 4
log "tracing both processes for $TRACE"
curl -fsS -o "$work/okso.trace" "${okso_debug}trace?seconds=$secs" &
t1=$!
curl -fsS -o "$work/fleet.trace" "${fleet_debug}trace?seconds=$secs" || status=1
wait "$t1" || status=1
wait "$b" || status=1
[ "$status" = 0 ] || { log "a trace or the bench run failed"; tail -3 "$work/bench.out" >&2; exit 1; }

echo
grep -E '^  (calls/s|latency)' "$work/bench.out"
echo
"$work/pathtrace" "$work/okso.trace" "$work/fleet.trace" || status=1
echo
echo "  okso all-in-one pid $okso + mock-fleet of $NODES devices pid $fleet, calls to 'sysecho.*' at one in flight;"
echo "  GOGC ${GOGC:-unset}, GOMAXPROCS ${GOMAXPROCS:-unset} for all-in-one; machine: $(nproc) cores, load avg $(cut -d' ' -f1-3 /proc/loadavg)"
[ "${LATENCY_KEEP:-0}" = 1 ] && echo "  traces: $work/okso.trace $work/fleet.trace (go tool trace FILE)"
exit "$status"
