#!/usr/bin/env bash
# The gateway's memory per node (issue 29): a device tier and a gateway,
# N mock devices (default 5000), and the gateway's live heap (Go's heap
# profile, after a collection) and RSS before and after they connect.
#
#   make gateway-memory N=5000
#
# Prints the RSS and live heap per node, and the top of the heap's growth
# by function. Loopback only; stops everything it started.
set -u
N=${1:-5000}
NAME=gwmem
. scripts/lib.sh
use_okso GWMEM_OKSO
D=$work/data
mkdir -p "$D"
"$OKSO" token mint --data-dir "$D" --tenant demo > "$work/token" 2>/dev/null
"$OKSO" device --nats-listen 127.0.0.1:0 --device-addr 127.0.0.1:0 --data-dir "$D" --conn-rate-per-ip -1 \
	> "$work/device.out" 2> "$work/device.log" &
dev=$!
pids+=("$dev")
line=$(wait_for "$work/device.log" "$dev" '"msg":"listening"' 30) || exit 1
nats=$(jq -r .nats_url <<< "$line")
tier=$(jq -r .device_url <<< "$line")
"$OKSO" gateway --nats-url "$nats" --mcp-addr 127.0.0.1:0 --data-dir "$D" --debug-addr 127.0.0.1:0 \
	> "$work/gateway.out" 2> "$work/gateway.log" &
gw=$!
pids+=("$gw")
debug=$(wait_for "$work/gateway.log" "$gw" '"msg":"debug listener"' 30 | jq -r .debug_url) || exit 1
wait_for "$work/gateway.log" "$gw" '"msg":"listening"' 30 > /dev/null || exit 1
heap() { curl -s "${debug}heap?gc=1" > "$1"; curl -s "${debug}heap?debug=1" | awk '/^# HeapAlloc/{print $4}'; }
rss() { awk '/VmRSS/{print $2}' "/proc/$gw/status"; }
r0=$(rss); h0=$(heap "$work/heap0.prof")
"$OKSO" mock-fleet -n "$N" --connect "$tier" --data-dir "$D" > "$work/fleet.out" 2> "$work/fleet.log" &
fleet=$!
pids+=("$fleet")
wait_for "$work/fleet.log" "$fleet" 'mock devices connected' 300 > /dev/null || exit 1
sleep 8 # the gateway follows the records after the devices connected: let it settle (a measurement, not a synchronisation)
r1=$(rss); h1=$(heap "$work/heap1.prof")
log "gateway RSS per node:       $(awk -v a="$r0" -v b="$r1" -v n="$N" 'BEGIN{printf "%.1f KB", (b-a)/n}') ($r0 → $r1 KB)"
log "gateway live heap per node: $(awk -v a="$h0" -v b="$h1" -v n="$N" 'BEGIN{printf "%.1f KB", (b-a)/1024/n}') (after GC)"
go tool pprof -sample_index=inuse_space -base "$work/heap0.prof" -top "$OKSO" "$work/heap1.prof" 2>/dev/null | sed -n 5,20p
