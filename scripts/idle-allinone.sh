#!/usr/bin/env bash
# idle-allinone (issue 29): what idle devices cost `okso all-in-one`, the
# gateway, the device tier and NATS in one process. It starts all-in-one
# with no device and measures its CPU time over IDLE_BASE seconds, then
# connects N mock devices (another process, at nice 10: they stand for
# devices on machines of their own), waits until the gateway lists them,
# lets them settle, and measures over IDLE seconds again. Prints the CPU
# per idle device, with and without what all-in-one takes with none, and
# the RSS per device.
#
# Usage: scripts/idle-allinone.sh [N]      (default 10000; make idle-allinone N=3000)
# Environment: IDLE (60), IDLE_BASE (20), IDLE_SETTLE (10) seconds.
set -uo pipefail
cd "$(dirname "$0")/.."
N=${1:-10000}
IDLE=${IDLE:-60}
IDLE_BASE=${IDLE_BASE:-20}
IDLE_SETTLE=${IDLE_SETTLE:-10}
case $N in '' | *[!0-9]*) echo "usage: $0 [N]" >&2; exit 2 ;; esac
command -v jq >/dev/null || { echo "idle-allinone needs jq" >&2; exit 2; }

NAME=idle-allinone KEEP=0
. scripts/lib.sh
use_okso IDLE_OKSO
want_open_files $((N + 2048))
hz=$(getconf CLK_TCK)
rss_kb() { awk '/^VmRSS:/{print $2}' "/proc/$1/status"; }

"$OKSO" all-in-one --mock 0 --local-agent=false --data-dir "$work/data" --mcp-addr 127.0.0.1:0 \
	--device-addr 127.0.0.1:0 --conn-rate-per-ip -1 --max-tools-per-tenant $((N * 5 + 1000)) \
	>"$work/okso.out" 2>"$work/okso.log" &
okso=$!
pids+=("$okso")
wait_for "$work/okso.out" "$okso" '^  agent token  : ' 30 >/dev/null || { status=1; exit 1; }
tier_url=$(sed -n 's/^  device tier *: //p' "$work/okso.out" | head -1)
sleep 2
c0=$(cpu "$okso") rss0=$(rss_kb "$okso")
log "all-in-one pid $okso: idling ${IDLE_BASE}s with no device"
sleep "$IDLE_BASE"
base=$(($(cpu "$okso") - c0))

nice -n 10 "$OKSO" mock-fleet -n "$N" --connect "$tier_url" --data-dir "$work/data" \
	>"$work/fleet.out" 2>"$work/fleet.log" &
pids+=($!)
wait_for "$work/fleet.log" "$!" '"msg":"mock devices connected"' 600 >/dev/null || { status=1; exit 1; }
log "$N devices connected; settling ${IDLE_SETTLE}s, then idling ${IDLE}s"
sleep "$IDLE_SETTLE"
c1=$(cpu "$okso")
sleep "$IDLE"
t=$(($(cpu "$okso") - c1))
rss1=$(rss_kb "$okso")

echo
echo "== okso all-in-one idle (N=$N)"
awk -v t="$t" -v b="$base" -v hz="$hz" -v s="$IDLE" -v bs="$IDLE_BASE" -v n="$N" -v r0="$rss0" -v r1="$rss1" \
	-v load="$(cut -d' ' -f1-3 /proc/loadavg)" 'BEGIN{
	printf "  %-26s %.2f%% of a core over %ds (%.2f%% with no device, over %ds)\n", "all-in-one CPU, idle", t/hz/s*100, s, b/hz/bs*100, bs
	printf "  %-26s %.2f µs/s all told, %.2f net of what it takes with none\n", "per device", t/hz*1e6/s/n, (t/hz/s - b/hz/bs)*1e6/n
	printf "  %-26s %.1f MB with no device, %.1f MB with %d: %.1f KB per device\n", "RSS", r0/1024, r1/1024, n, (r1-r0)/n
	printf "  %-26s load avg %s (2 cores, shared)\n", "machine", load
}'
