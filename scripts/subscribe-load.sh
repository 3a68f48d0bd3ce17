#!/usr/bin/env bash
# CPU cost of many concurrent metric subscriptions (performance issue:
# "1,000 concurrent metric subscriptions at 1 s — CPU used, target < half a
# core").
#
# okso is `okso all-in-one --local-agent=false --mock 0` with a fleet of N
# mock devices in a separate `okso mock-fleet` process. `okso bench --mode
# subscribe` holds N streams open through the SSE door (POST
# /mcp/tools/call), spread round-robin over every tool matching
# 'sys.*.metrics.subscribe' (the metrics stream of every node: one stream
# per node), for a warm-up and the measured time. While the streams are
# open in the measured time, the script samples the CPU time (utime + stime
# of /proc/PID/stat) of all-in-one, of the fleet and of the bench, and their
# RSS. Before the streams open, and again once the bench has closed them,
# it measures the same N devices idle, for comparison (after: the devices
# must have stopped sampling). Everything runs on 127.0.0.1; every process
# is stopped at the end.
#
# Usage: scripts/subscribe-load.sh [N]     (make subscribe-load N=1000 DURATION=30s INTERVAL_MS=1000)
# Environment:
#   SUBSCRIBE_N            streams, and mock devices (1000)
#   SUBSCRIBE_DURATION     measured time, e.g. 30s or 2m (30s; at least 5s)
#   SUBSCRIBE_WARMUP       warm-up while the streams open, not counted (5s)
#   SUBSCRIBE_INTERVAL_MS  interval_ms of every stream (1000)
#   SUBSCRIBE_IDLE         seconds of each idle measurement, before and after the streams (5; 0: none)
#   SUBSCRIBE_TARGET       cores all-in-one may use (0.5)
#   SUBSCRIBE_OKSO_FLAGS   extra flags for okso all-in-one (e.g. --debug-addr 127.0.0.1:6070)
#   SUBSCRIBE_OKSO_BIN     an okso binary to run instead of building bin/okso (another build to compare)
#   SUBSCRIBE_KEEP         1: keep the work dir (logs, the bench's JSON) even on success
# Exit status: 0 when every stream was held to the end and all-in-one used
# less than the target (PASS), 1 otherwise (FAIL), 2 on bad usage.
set -uo pipefail
cd "$(dirname "$0")/.."

N=${1:-${SUBSCRIBE_N:-1000}}
DURATION=${SUBSCRIBE_DURATION:-30s}
WARMUP=${SUBSCRIBE_WARMUP:-5s}
INTERVAL_MS=${SUBSCRIBE_INTERVAL_MS:-1000}
IDLE=${SUBSCRIBE_IDLE:-5}
TARGET=${SUBSCRIBE_TARGET:-0.5}
read -r -a OKSO_FLAGS <<<"${SUBSCRIBE_OKSO_FLAGS:-}"

# secs D: a duration (30, 30s, 1500ms, 2m) in seconds.
secs() {
	case $1 in
	*ms) awk -v v="${1%ms}" 'BEGIN { print v / 1000 }' ;;
	*s) echo "${1%s}" ;;
	*m) awk -v v="${1%m}" 'BEGIN { print v * 60 }' ;;
	*) echo "$1" ;;
	esac
}
num() { [[ $1 =~ ^[0-9]+(\.[0-9]+)?$ ]]; }
case $N in '' | *[!0-9]* | 0) echo "N=$N: want a number of streams" >&2; exit 2 ;; esac
case $INTERVAL_MS in '' | *[!0-9]*) echo "INTERVAL_MS=$INTERVAL_MS: want milliseconds" >&2; exit 2 ;; esac
case $IDLE in '' | *[!0-9]*) echo "SUBSCRIBE_IDLE=$IDLE: want seconds" >&2; exit 2 ;; esac
DUR_S=$(secs "$DURATION")
WARM_S=$(secs "$WARMUP")
num "$DUR_S" && awk -v d="$DUR_S" 'BEGIN { exit !(d >= 5) }' || { echo "DURATION=$DURATION: want 5s or more" >&2; exit 2; }
num "$WARM_S" || { echo "SUBSCRIBE_WARMUP=$WARMUP: want a duration" >&2; exit 2; }
num "$TARGET" || { echo "SUBSCRIBE_TARGET=$TARGET: want cores" >&2; exit 2; }
command -v jq >/dev/null || { echo "subscribe-load needs jq" >&2; exit 2; }

NAME=subscribe-load KEEP=${SUBSCRIBE_KEEP:-0}
. scripts/lib.sh

# rss PID FIELD: VmRSS or VmHWM of the process, in MiB.
rss() { awk -v f="$2:" '$1 == f { printf "%.0f", $2 / 1024 }' "/proc/$1/status" 2>/dev/null; }
now() { date +%s.%N; }
HZ=$(getconf CLK_TCK)
# cores TICKS SECONDS: CPU time over wall time.
cores() { awk -v t="$1" -v s="$2" -v hz="$HZ" 'BEGIN { printf "%.3f", (s > 0 ? t / hz / s : 0) }'; }

# --- build ---------------------------------------------------------------------------
use_okso SUBSCRIBE_OKSO_BIN
want_open_files $((2 * N + 4096)) # all-in-one holds a WebSocket and an SSE stream per node
log "open files limit $(ulimit -n)"

# --- okso: all-in-one, then the fleet ----------------------------------------------------
TOOL='sys.*.metrics.subscribe'
start_okso "$N" "$TOOL" --max-streams-per-tenant "$N" "${OKSO_FLAGS[@]}" || { status=1; exit 1; }

# --- idle: the same devices, no stream -----------------------------------------------------
# idle WHEN: CPU of all-in-one and of the fleet over IDLE seconds, in
# idle_okso and idle_fleet.
idle() {
	idle_okso=- idle_fleet=-
	[ "$IDLE" -gt 0 ] || return 0
	local t0 c0 f0 t1 c1 f1 wall
	t0=$(now) c0=$(cpu "$okso") f0=$(cpu "$fleet")
	sleep "$IDLE"
	t1=$(now) c1=$(cpu "$okso") f1=$(cpu "$fleet")
	alive "$okso" && alive "$fleet" || { log "okso all-in-one or mock-fleet died $1"; status=1; return 1; }
	wall=$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')
	idle_okso=$(cores $((c1 - c0)) "$wall")
	idle_fleet=$(cores $((f1 - f0)) "$wall")
	log "idle for ${IDLE}s $1: all-in-one $idle_okso cores, fleet $idle_fleet cores"
}
idle_rss="$(rss "$okso" VmRSS) MiB"
idle "before the streams" || exit 1
before_okso=$idle_okso before_fleet=$idle_fleet

# --- the streams ---------------------------------------------------------------------------
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
log "opening $N streams at interval_ms $INTERVAL_MS: ${WARM_S}s warm-up, ${DUR_S}s measured"
"$OKSO" bench --url "$okso_url" --mode subscribe --tool "$TOOL" --concurrency "$N" \
	--args "{\"interval_ms\":$INTERVAL_MS}" --duration "${DUR_S}s" --warmup "${WARM_S}s" --json \
	>"$work/bench.json" 2>"$work/bench.progress" &
bench=$!
pids+=("$bench")

# The bench writes a progress line every second, marked "(warm-up)" until
# the measured time starts: the first line without the mark is at most a
# second into it. Sample from there to a second before it ends.
wait_window=$(awk -v w="$WARM_S" 'BEGIN { printf "%d", w + 120 }') # the listing of N tools comes first
wait_for "$work/bench.progress" "$bench" ' open .*failed$' "$wait_window" >/dev/null || { status=1; exit 1; }
log "measured time started: $(grep ' open .*failed$' "$work/bench.progress" | head -1 | tr -s ' ')"
measure=$(awk -v d="$DUR_S" 'BEGIN { print d - 2 }')
t0=$(now) c0=$(cpu "$okso") f0=$(cpu "$fleet") b0=$(cpu "$bench")
ta=$t0 ca=$c0 fa=$f0
while :; do
	left=$(awk -v t0="$t0" -v n="$(now)" -v m="$measure" 'BEGIN { l = m - (n - t0); print (l > 0 ? l : 0) }')
	awk -v l="$left" 'BEGIN { exit !(l <= 0) }' && break
	sleep "$(awk -v l="$left" 'BEGIN { print (l < 5 ? l : 5) }')"
	tb=$(now) cb=$(cpu "$okso") fb=$(cpu "$fleet")
	alive "$bench" || { log "the bench ended early: $(tail -3 "$work/bench.progress")"; status=1; exit 1; }
	alive "$okso" && alive "$fleet" || { log "okso all-in-one or mock-fleet died during the run"; status=1; exit 1; }
	wall=$(awk -v a="$ta" -v b="$tb" 'BEGIN { print b - a }')
	log "  all-in-one $(cores $((cb - ca)) "$wall") cores, fleet $(cores $((fb - fa)) "$wall") cores;" \
		"bench: $(tail -1 "$work/bench.progress" | tr -s ' ' | sed 's/^ //')"
	ta=$tb ca=$cb fa=$fb
done
t1=$(now) c1=$(cpu "$okso") f1=$(cpu "$fleet") b1=$(cpu "$bench")
wall=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
okso_cores=$(cores $((c1 - c0)) "$wall")
fleet_cores=$(cores $((f1 - f0)) "$wall")
bench_cores=$(cores $((b1 - b0)) "$wall")
okso_rss=$(rss "$okso" VmRSS) okso_hwm=$(rss "$okso" VmHWM)
fleet_rss=$(rss "$fleet" VmRSS) bench_rss=$(rss "$bench" VmRSS)

if ! wait "$bench"; then
	log "the bench failed: $(tail -3 "$work/bench.progress")"
	status=1
fi
load_end=$(cut -d' ' -f1-3 /proc/loadavg)
for pair in "okso all-in-one:$okso" "mock-fleet:$fleet"; do
	alive "${pair##*:}" || { status=1; log "DIED during the run: ${pair%%:*}"; }
done
sleep 1 # the closes reach the devices
idle "after the streams"
after_okso=$idle_okso after_fleet=$idle_fleet
[ -s "$work/bench.json" ] || { log "no result from the bench"; status=1; exit 1; }

# --- the report ----------------------------------------------------------------------------
r() { jq -r "$1" "$work/bench.json"; }
held=$(r '.streams_open // 0')
echo
echo "== $N metric subscriptions at interval_ms $INTERVAL_MS: okso bench --mode subscribe --tool '$TOOL' --concurrency $N"
echo "   ${DUR_S}s measured after ${WARM_S}s warm-up; CPU sampled over ${wall}s of the measured time"
printf '  %-18s %s of %s held to the end (%s opened); errors: %s\n' "streams open" "$held" "$N" "$(r '.streams_opened // 0')" \
	"$(r 'if (.errors | length) == 0 then "none" else (.errors | to_entries | map("\(.key) \(.value)") | join(", ")) end')"
printf '  %-18s %s (expected ≈ %s); per stream %s\n' "frames/s" "$(r '.frames_per_s // 0 | . * 10 | round / 10')" \
	"$(awk -v n="$N" -v i="$INTERVAL_MS" 'BEGIN { printf "%.0f", n * 1000 / i }')" \
	"$(r 'if .stream_frames_per_s then "min \(.stream_frames_per_s.min * 1000 | round / 1000), max \(.stream_frames_per_s.max * 1000 | round / 1000)" else "-" end')"
printf '  %-18s %s\n' "first frame" "$(r 'if .first_frame_latency_ms then "p50 \(.first_frame_latency_ms.p50 | round)ms, p99 \(.first_frame_latency_ms.p99 | round)ms, max \(.first_frame_latency_ms.max | round)ms" else "-" end')"
echo "  CPU (cores)        streams open   idle before   idle after (the same devices, no stream)"
printf '    %-16s %12s   %11s   %10s\n' "okso all-in-one" "$okso_cores" "$before_okso" "$after_okso"
printf '    %-16s %12s   %11s   %10s\n' "mock-fleet" "$fleet_cores" "$before_fleet" "$after_fleet"
printf '    %-16s %12s\n' "okso bench" "$bench_cores"
printf '  %-18s all-in-one %s MiB (peak %s; %s before the streams), mock-fleet %s MiB, bench %s MiB\n' "RSS" \
	"$okso_rss" "$okso_hwm" "$idle_rss" "$fleet_rss" "$bench_rss"
echo "  machine: $(nproc) cores, load avg $load_start before, $load_end after; all processes on 127.0.0.1"
verdict=PASS
awk -v c="$okso_cores" -v t="$TARGET" 'BEGIN { exit !(c < t) }' || verdict=FAIL
reason=""
[ "$held" -lt "$N" ] && { verdict=FAIL; reason=" (only $held of $N streams held)"; }
echo "  target: okso all-in-one < $TARGET core with $N streams: $verdict$reason"
[ "$verdict" = PASS ] || status=1
exit "$status"
