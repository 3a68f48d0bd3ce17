#!/usr/bin/env bash
# Scale check of the device tier (issue 4, "Scale"): N simulated devices
# against `okso device` (one, or as many as the open-files limit needs),
# one `okso gateway`, and a nats-server in a process of its own, as a
# split deployment runs them (SCALE_NATS=embedded: on the first tier's
# embedded NATS instead), all on 127.0.0.1. Measures connect time, the tier's RSS before/after and per
# connection, the fleet's RSS; then scripts/scalecheck lists every tool over
# MCP (official Go SDK client, following pagination) and calls
# sysecho.<node>.echo.invoke on every node, checking each node_id.
#
# Usage: scripts/scale.sh [N]        (default 10000; make scale N=1000)
# Environment:
#   SCALE_CONNECT_TIMEOUT  seconds to wait for "mock devices connected" (600)
#   SCALE_CONNECT_RATE     mock-fleet --connect-rate (okso's default when unset)
#   SCALE_CONCURRENCY      calls in flight (64)
#   SCALE_ROUNDS           list-and-call rounds (1; more shows whether RSS keeps growing)
#   SCALE_KEEP             1: keep the work dir (logs) even on success
#   SCALE_TIER_FLAGS       extra flags for `okso device` (e.g. --debug-addr 127.0.0.1:6070)
#   SCALE_SPREAD_DURATION  each `okso bench` run that compares calls over the first
#                          1,000 nodes with calls over all of them (10s; 0: skip)
#   SCALE_IDLE             seconds the connected fleet idles (no calls) while the CPU
#                          time of every process is measured (60; 0: skip)
#   SCALE_BASE_IDLE        seconds the processes idle with no device, before the fleet
#                          (20; 0: skip): the idle figures say what the devices add
#   SCALE_TIERS            device tiers (default: as many as keep each under the
#                          open-files limit, less 1,024; 1 where the limit allows)
#   SCALE_NATS             own (default): nats-server in its own process, set up
#                          with okso nats server-config and okso nats init;
#                          embedded: the first device tier embeds NATS
#   SCALE_FLEET_NICE       the mock fleets' nice value (10): they stand for devices
#                          on machines of their own, and should not take the CPU
#                          the tiers, the gateway and NATS need on this one
#   SCALE_WARM             devices that connect first (N/10, at least 256; 0: none):
#                          the RSS is read again once they are in, and the
#                          "marginal" figures are what each of the other N-WARM
#                          devices adds, without what the first ones bring along
#   SCALE_FLEET_SIZE       devices per mock-fleet process (20000): a larger N runs
#                          several, each dialling from its own loopback address
#                          (127.0.0.2, 127.0.0.3, ...), since one source address
#                          reaches the tier's port from at most ~28,000 ports
# Exit status: 0 when every device connected, every node was listed and
# every call answered correctly; 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."

N=${1:-10000}
CONNECT_TIMEOUT=${SCALE_CONNECT_TIMEOUT:-600}
CONCURRENCY=${SCALE_CONCURRENCY:-64}
ROUNDS=${SCALE_ROUNDS:-1}
SPREAD_DURATION=${SCALE_SPREAD_DURATION:-10s}
IDLE=${SCALE_IDLE:-60}
FLEET_SIZE=${SCALE_FLEET_SIZE:-20000}
NATS_MODE=${SCALE_NATS:-own}
FLEET_NICE=${SCALE_FLEET_NICE:-10}
BASE_IDLE=${SCALE_BASE_IDLE:-20}
WARM=${SCALE_WARM:-$((N / 10 > 256 ? N / 10 : 256))}
[ "$WARM" -gt $((N / 2)) ] && WARM=0
case $NATS_MODE in own | embedded) ;; *) echo "SCALE_NATS: want own or embedded" >&2; exit 2 ;; esac
case $N in '' | *[!0-9]*) echo "usage: $0 [N]" >&2; exit 2 ;; esac
case $WARM in '' | *[!0-9]*) echo "SCALE_WARM: want a number of devices" >&2; exit 2 ;; esac

NAME=scale KEEP=${SCALE_KEEP:-0}
. scripts/lib.sh
data=$work/data
mkdir -p "$data"

# --- build -------------------------------------------------------------------
log "building bin/okso and scalecheck"
go build -o bin/okso . || exit 1
go build -o "$work/scalecheck" ./scripts/scalecheck || exit 1
OKSO=$PWD/bin/okso

# --- file descriptors ----------------------------------------------------------
# Each process holds about one descriptor per device (tier and fleets are
# separate processes); leave headroom for NATS, HTTP and files.
want=$((N + N / 4 + 4096))
hard=$(ulimit -Hn)
if [ "$hard" != unlimited ] && [ "$hard" -lt "$want" ]; then
	ulimit -Hn "$want" 2>/dev/null && hard=$want # root may raise the hard limit
fi
if [ "$hard" = unlimited ]; then
	ulimit -Sn "$want"
else
	ulimit -Sn "$hard" # soft up to the hard limit (plain ulimit -n would lower the hard one too)
fi
nofile=$(ulimit -n)
log "ulimit -n $nofile (hard $(ulimit -Hn), want $want for N=$N)"
# A device tier, and a fleet, holds a descriptor per device: where the
# limit is below N (raising the hard limit takes CAP_SYS_RESOURCE), the
# devices are spread over several tiers on one NATS, as a large fleet runs.
per_process=$((nofile - 1024))
if [ "$per_process" -lt 1000 ]; then
	log "ulimit -n $nofile: too low to run a device tier of any size"
	status=1
	exit 1
fi
NTIERS=${SCALE_TIERS:-$(((N + per_process - 1) / per_process))}
[ "$FLEET_SIZE" -gt "$per_process" ] && FLEET_SIZE=$per_process

# --- helpers -------------------------------------------------------------------
rss_kb() { awk '/^VmRSS:/{print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }
fds() { ls "/proc/$1/fd" 2>/dev/null | wc -l; }
mb() { awk -v k="$1" 'BEGIN{printf "%.1f MB", k/1024}'; }


# --- device tier and gateway ------------------------------------------------------
# The agent token first: it also creates the signing key every role shares.
"$OKSO" token mint --data-dir "$data" --tenant demo >"$work/token" 2>"$work/token.err" || {
	log "token mint failed: $(cat "$work/token.err")"; status=1; exit 1; }
read -r -a tier_flags <<<"${SCALE_TIER_FLAGS:-}"
# A mock device has 5 tools; the default cap of a tenant's tools (100,000)
# is below a 20,000-device fleet's.
tier_flags=(--max-tools-per-tenant "$((N * 5 + 1000))" "${tier_flags[@]}")
nats=
if [ "$NATS_MODE" = own ]; then
	start_nats "$data" || { status=1; exit 1; }
fi
start_split "$data" "${tier_flags[@]}" || { status=1; exit 1; }
log "device tier pid $tier: nats $nats_url, devices $device_url"
log "gateway pid $gw: $mcp_url"
# More tiers, on the first one's NATS: tiers and device_urls list them all.
tiers=("$tier") device_urls=("$device_url")
for ((k = 1; k < NTIERS; k++)); do
	"$OKSO" device --nats-url "$nats_url" --device-addr 127.0.0.1:0 --data-dir "$data" --conn-rate-per-ip -1 \
		"${tier_flags[@]}" >"$work/device$k.out" 2>"$work/device$k.log" &
	tiers+=($!)
	pids+=($!)
	l=$(wait_for "$work/device$k.log" "$!" '"msg":"listening"' 30) || { status=1; exit 1; }
	device_urls+=("$(jq -r .device_url <<<"$l")")
	log "device tier $k pid ${tiers[$k]}: devices ${device_urls[$k]}"
done
tiers_rss() { local p t=0; for p in "${tiers[@]}"; do t=$((t + $(rss_kb "$p"))); done; echo "$t"; }
tiers_fds() { local p t=0; for p in "${tiers[@]}"; do t=$((t + $(fds "$p"))); done; echo "$t"; }
tiers_cpu() { local p t=0; for p in "${tiers[@]}"; do t=$((t + $(cpu "$p"))); done; echo "$t"; }

sleep 2
tier_rss_before=$(tiers_rss)
gw_rss_before=$(rss_kb "$gw")
nats_rss_before=0
[ -n "$nats" ] && nats_rss_before=$(rss_kb "$nats")
tier_fds_before=$(tiers_fds)
log "before: tier RSS $(mb "$tier_rss_before") ($NTIERS tier(s)), gateway RSS $(mb "$gw_rss_before"), tier fds $(tiers_fds)"
# What the processes take idle with no device at all (their leases, NATS
# pings, timers), so that the idle figures below can say what the devices
# add: at N=1,000 it is most of the total.
base_tier=0 base_gw=0 base_nats=0
if [ "$IDLE" != 0 ] && [ "$BASE_IDLE" != 0 ]; then
	log "idling ${BASE_IDLE}s with no device: the CPU time it takes"
	c0t=$(tiers_cpu) c0g=$(cpu "$gw") c0n=0
	[ -n "$nats" ] && c0n=$(cpu "$nats")
	sleep "$BASE_IDLE"
	base_tier=$(($(tiers_cpu) - c0t)) base_gw=$(($(cpu "$gw") - c0g))
	[ -n "$nats" ] && base_nats=$(($(cpu "$nats") - c0n))
fi

# --- the fleet(s) -----------------------------------------------------------------
# One mock-fleet per FLEET_SIZE devices, each with its own seed (its own
# node ids) and, when there are several, its own loopback source address.
# WARM of the N devices connect first, one warm-up fleet per tier, and
# the processes' RSS is read again once they are in: what the first
# devices bring along (pools, caches, the heap's growth) is paid once,
# and the rest of the fleet shows what one device more costs.
rate_flag=()
[ -n "${SCALE_CONNECT_RATE:-}" ] && rate_flag=(--connect-rate "$SCALE_CONNECT_RATE")
[ "$WARM" -gt 0 ] && [ "$WARM" -lt "$NTIERS" ] && WARM=$NTIERS
nwarm=0
[ "$WARM" -gt 0 ] && nwarm=$NTIERS
main=$((N - WARM))
nmain=$(((main + FLEET_SIZE - 1) / FLEET_SIZE))
[ "$nmain" -lt "$NTIERS" ] && nmain=$NTIERS # fleet i dials tier i mod NTIERS
nfleets=$((nwarm + nmain))
fleets=()
start_fleet() { # start_fleet I N: fleet I (seed I+1) with N devices, to tier I mod NTIERS
	local i=$1 n=$2 src=() url=${device_urls[$(($1 % NTIERS))]}
	[ "$nfleets" -gt 1 ] && src=(--source-addr "127.0.0.$((i + 2))")
	log "starting mock-fleet $i: -n $n --seed $((i + 1)) ${src[*]} ${rate_flag[*]} to tier $((i % NTIERS))"
	nice -n "$FLEET_NICE" "$OKSO" mock-fleet -n "$n" --seed "$((i + 1))" --connect "$url" --data-dir "$data" "${src[@]}" "${rate_flag[@]}" \
		>"$work/fleet$i.out" 2>"$work/fleet$i.log" &
	fleets+=($!)
	pids+=($!)
}

# connected_count: devices of every fleet that got their first announce_ok.
connected_count() {
	local i c total=0
	for ((i = 0; i < ${#fleets[@]}; i++)); do
		c=$(grep '"msg":"mock devices conn' "$work/fleet$i.log" 2>/dev/null | tail -1 | jq -r '.connected // .count // 0' 2>/dev/null)
		total=$((total + ${c:-0}))
	done
	echo "$total"
}
# wait_fleets: until every fleet started says it connected all its devices;
# false if one exits first or CONNECT_TIMEOUT passes.
wait_fleets() {
	local i done_fleets gone f now last_print=0 deadline=$(($(date +%s) + CONNECT_TIMEOUT))
	while :; do
		done_fleets=0
		for ((i = 0; i < ${#fleets[@]}; i++)); do
			grep -q '"msg":"mock devices connected"' "$work/fleet$i.log" 2>/dev/null && done_fleets=$((done_fleets + 1))
		done
		[ "$done_fleets" = "${#fleets[@]}" ] && return 0
		gone=
		for f in "${fleets[@]}"; do alive "$f" || gone=1; done
		if [ -n "$gone" ]; then
			log "a mock-fleet exited before connecting all its devices"
			return 1
		fi
		now=$(date +%s)
		if [ "$now" -ge "$deadline" ]; then
			log "TIMEOUT: not all devices connected within ${CONNECT_TIMEOUT}s"
			return 1
		fi
		if [ $((now - last_print)) -ge 5 ]; then
			log "progress: $(connected_count)/$N connected, tier RSS $(mb "$(tiers_rss)"), tier fds $(tiers_fds)"
			last_print=$now
		fi
		sleep 0.2
	done
}

tier_rss_warm=$tier_rss_before gw_rss_warm=$gw_rss_before nats_rss_warm=$nats_rss_before
if [ "$nwarm" -gt 0 ]; then
	for ((i = 0; i < nwarm; i++)); do start_fleet "$i" $((WARM / nwarm + (i < WARM % nwarm ? 1 : 0))); done
	wait_fleets || { status=1; exit 1; }
	sleep 5 # let the registry writes settle, and the tier give back what the handshakes left
	tier_rss_warm=$(tiers_rss) gw_rss_warm=$(rss_kb "$gw")
	[ -n "$nats" ] && nats_rss_warm=$(rss_kb "$nats")
	log "$WARM warm-up devices in: tier RSS $(mb "$tier_rss_warm"), gateway RSS $(mb "$gw_rss_warm")$([ -n "$nats" ] && echo ", nats-server RSS $(mb "$nats_rss_warm")")"
fi

load_start=$(cut -d' ' -f1-3 /proc/loadavg)
t0=$(date +%s.%N)
for ((i = nwarm; i < nfleets; i++)); do
	k=$((i - nwarm))
	start_fleet "$i" $((main / nmain + (k < main % nmain ? 1 : 0)))
done
all_connected=
wait_fleets && all_connected=1
t1=$(date +%s.%N)
connect_wall=$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1fs", b-a}')
if [ -n "$all_connected" ]; then
	connect_elapsed=$(for ((i = nwarm; i < nfleets; i++)); do grep -m1 '"msg":"mock devices connected"' "$work/fleet$i.log" | jq -r .elapsed; done | sort -V | tail -1)
	log "all $N devices connected: slowest fleet says $connect_elapsed, wall $connect_wall (incl. process start) for the last $main"
	connect_summary="$connect_elapsed (wall $connect_wall, $nmain fleet process(es), the $main after the $WARM warm-up devices)"
else
	status=1
	connect_summary="INCOMPLETE after $connect_wall: $(connected_count)/$N connected"
	log "connect: $connect_summary"
fi

fleet_rss_kb() { local f t=0; for f in "${fleets[@]}"; do t=$((t + $(rss_kb "$f"))); done; echo "$t"; }
tier_rss_conn=$(tiers_rss)
sleep 5 # let the registry writes and the GC settle
tier_rss_after=$(tiers_rss)
fleet_rss=$(fleet_rss_kb)
gw_rss_listed=$(rss_kb "$gw")
tier_fds=$(tiers_fds)
per_conn=$(awk -v a="$tier_rss_after" -v b="$tier_rss_before" -v n="$N" 'BEGIN{printf "%.1f", (a-b)/n}')
gw_per_node=$(awk -v a="$gw_rss_listed" -v b="$gw_rss_before" -v n="$N" 'BEGIN{printf "%.1f", (a-b)/n}')
if [ -n "$nats" ]; then
	nats_rss=$(rss_kb "$nats")
	nats_per_node=$(awk -v a="$nats_rss" -v b="$nats_rss_before" -v n="$N" 'BEGIN{printf "%.1f", (a-b)/n}')
fi
fleet_per_dev=$(awk -v a="$fleet_rss" -v n="$N" 'BEGIN{printf "%.1f", a/n}')
# marginal A WARM: KB per device of the last N-WARM devices, from RSS A.
marginal() { awk -v a="$1" -v b="$2" -v n="$main" 'BEGIN{printf "%.1f", (a-b)/n}'; }
if [ "$nwarm" -gt 0 ]; then
	per_conn_m=$(marginal "$tier_rss_after" "$tier_rss_warm")
	gw_per_node_m=$(marginal "$gw_rss_listed" "$gw_rss_warm")
	[ -n "$nats" ] && nats_per_node_m=$(marginal "$nats_rss" "$nats_rss_warm")
fi
log "after: tier RSS $(mb "$tier_rss_conn") at connect, $(mb "$tier_rss_after") +5s; $per_conn KB/connection; gateway $gw_per_node KB/node; tier fds $tier_fds; fleet RSS $(mb "$fleet_rss")"

# --- idle: the CPU time of every process while nothing is called ----------------------
# The figure that says whether idle devices cost work (lease refreshes,
# registry re-reads) and how it grows with N.
hz=$(getconf CLK_TCK)
idle_row() { # idle_row TICKS BASE_TICKS: "% of a core, µs/s per device, net of the base"
	awk -v t="$1" -v b="${2:-0}" -v hz="$hz" -v s="$IDLE" -v bs="$BASE_IDLE" -v n="$N" 'BEGIN{
		printf "%.2f%% of a core, %.2f µs/s per device", t/hz/s*100, t/hz*1e6/s/n
		if (bs > 0) printf " (%.2f net of the %.2f%% it takes with no device)", (t/hz/s - b/hz/bs)*1e6/n, b/hz/bs*100
	}'
}
if [ "$IDLE" != 0 ]; then
	log "idling ${IDLE}s: CPU time of the tier, the gateway and the fleet(s), no calls"
	tier_c0=$(tiers_cpu) gw_c0=$(cpu "$gw") fleet_c0=0 nats_c0=0
	[ -n "$nats" ] && nats_c0=$(cpu "$nats")
	for f in "${fleets[@]}"; do fleet_c0=$((fleet_c0 + $(cpu "$f"))); done
	sleep "$IDLE"
	tier_c1=$(tiers_cpu) gw_c1=$(cpu "$gw") fleet_c1=0 nats_c1=0
	[ -n "$nats" ] && nats_c1=$(cpu "$nats")
	idle_nats=$(idle_row $((nats_c1 - nats_c0)) "$base_nats")
	for f in "${fleets[@]}"; do fleet_c1=$((fleet_c1 + $(cpu "$f"))); done
	idle_tier=$(idle_row $((tier_c1 - tier_c0)) "$base_tier")
	idle_gw=$(idle_row $((gw_c1 - gw_c0)) "$base_gw")
	idle_fleet=$(BASE_IDLE=0 idle_row $((fleet_c1 - fleet_c0)))
	log "idle: tier $idle_tier; gateway $idle_gw; fleet(s) $idle_fleet; nats-server $idle_nats"
	# After the idle time every device has been pinged (and has answered)
	# a few times: what an idle connection costs the tier for good.
	tier_rss_idle=$(tiers_rss)
	per_conn_idle=$(awk -v a="$tier_rss_idle" -v b="$tier_rss_before" -v n="$N" 'BEGIN{printf "%.1f", (a-b)/n}')
	[ "$nwarm" -gt 0 ] && per_conn_idle_m=$(marginal "$tier_rss_idle" "$tier_rss_warm")
	log "after idling: tier RSS $(mb "$tier_rss_idle"); $per_conn_idle KB/connection"
	if [ -n "$nats" ]; then
		nats_rss_idle=$(rss_kb "$nats")
		nats_per_node_idle=$(awk -v a="$nats_rss_idle" -v b="$nats_rss_before" -v n="$N" 'BEGIN{printf "%.1f", (a-b)/n}')
		[ "$nwarm" -gt 0 ] && nats_per_node_idle_m=$(marginal "$nats_rss_idle" "$nats_rss_warm")
	fi
fi

# --- MCP: list everything, call every node --------------------------------------------
wait_list=180s
[ -z "$all_connected" ] && wait_list=20s
log "scalecheck: list all tools, call echo on every node (concurrency $CONCURRENCY)"
for ((round = 1; round <= ROUNDS; round++)); do
	[ "$ROUNDS" -gt 1 ] && log "round $round/$ROUNDS"
	timeout 15m "$work/scalecheck" -url "$mcp_url" -token-file "$work/token" -n "$N" \
		-concurrency "$CONCURRENCY" -wait-list "$wait_list" -out "$work/results" 2>&1 | tee -a "$work/scalecheck.out"
	sc=${PIPESTATUS[0]}
	[ "$sc" != 0 ] && status=1
	[ "$ROUNDS" -gt 1 ] && log "after round $round: tier RSS $(mb "$(tiers_rss)"), gateway RSS $(mb "$(rss_kb "$gw")")"
done

# --- throughput: calls spread over every node, and over the first 1,000 ----------------
# Same fleet, same gateway and tier: only the spread differs (each echo
# allows 10 calls/s and 4 in flight per node, so 1,000 nodes are enough
# for the rate the machine can reach).
spread() { # spread NAME FLAGS...: one okso bench run; prints its ok/s
	local name=$1
	shift
	OKSO_TOKEN=$(cat "$work/token") "$OKSO" bench --url "$mcp_url" --tool 'sysecho.*' --concurrency "$CONCURRENCY" \
		--sessions 8 --duration "$SPREAD_DURATION" --warmup 2s --json "$@" >"$work/bench-$name.json" 2>"$work/bench-$name.err" ||
		{ log "bench $name failed: $(tail -2 "$work/bench-$name.err")"; status=1; }
	jq -r '"\(.ok_per_s | floor) calls/s over \(.tools) nodes, p50 \(.latency_ms.p50)ms, errors \(.errors)"' "$work/bench-$name.json" 2>/dev/null
}
if [ "$SPREAD_DURATION" != 0 ]; then
	few=$((N < 1000 ? N : 1000))
	spread_few=$(spread few --max-tools "$few")
	log "bench over $few nodes: $spread_few"
	spread_all=$(spread all)
	log "bench over all nodes: $spread_all"
	spread_ratio=$(jq -rn --slurpfile a "$work/bench-all.json" --slurpfile f "$work/bench-few.json" \
		'if ($f[0].ok_per_s // 0) > 0 then ($a[0].ok_per_s / $f[0].ok_per_s * 100 | floor | tostring) + "%" else "-" end' 2>/dev/null)
fi

load_end=$(cut -d' ' -f1-3 /proc/loadavg)
gw_rss_after=$(rss_kb "$gw")
tier_rss_calls=$(tiers_rss)

r() { awk -F= -v k="$1" '$1==k{sub(/^[^=]*=/,""); print; exit}' "$work/results" 2>/dev/null; }

# --- liveness and logs ----------------------------------------------------------------
died=
for pair in "gateway:$gw" ${nats:+"nats-server:$nats"}; do
	alive "${pair##*:}" || died="$died ${pair%%:*}"
done
for ((k = 0; k < NTIERS; k++)); do
	alive "${tiers[$k]}" || died="$died device-tier$k"
done
for ((i = 0; i < nfleets; i++)); do
	alive "${fleets[$i]}" || died="$died mock-fleet$i"
done
[ -n "$died" ] && { status=1; log "DIED during the run:$died"; }

# --- orderly stop, so that teardown errors at scale show in the logs too --------------
# stop PID SECONDS: SIGTERM, wait; prints the time it took, or "KILLED".
stop() {
	local pid=$1 secs=$2 t0 i
	alive "$pid" || { echo "already gone"; return; }
	t0=$(date +%s.%N)
	kill -TERM "$pid"
	for ((i = 0; i < secs * 10; i++)); do
		alive "$pid" || break
		sleep 0.1
	done
	if alive "$pid"; then
		kill -KILL "$pid"
		echo "KILLED after ${secs}s"
	else
		awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1fs", b-a}'
	fi
}
stop_fleet=
for f in "${fleets[@]}"; do stop_fleet="$stop_fleet $(stop "$f" 60)"; done
stop_fleet=${stop_fleet# }
# the tiers should see every device leave: their descriptors back to what
# they held before the fleet (the audit log counts repeats, not each one)
for ((i = 0; i < 300; i++)); do
	still=$(($(tiers_fds) - tier_fds_before))
	[ "$still" -le 0 ] && break
	sleep 0.1
done
gone=$((N - (still > 0 ? still : 0)))
stop_gw=$(stop "$gw" 30)
stop_tier=
for p in "${tiers[@]}"; do stop_tier="$stop_tier $(stop "$p" 30)"; done
stop_tier=${stop_tier# }
log "stopped: mock-fleet $stop_fleet ($gone of $N connections closed at the tiers), gateway $stop_gw, tier $stop_tier"
case "$stop_fleet$stop_gw$stop_tier" in *KILLED*) status=1 ;; esac

echo
echo "== WARN/ERROR lines in the roles' logs (count, level, msg)"
for role in device $(for ((k = 1; k < NTIERS; k++)); do echo "device$k"; done) gateway $(for ((i = 0; i < nfleets; i++)); do echo "fleet$i"; done); do
	f=$work/$role.log
	n=$(grep -cE '"level":"(ERROR|WARN)"' "$f")
	echo "-- $role: $n"
	if [ "$n" -gt 0 ]; then
		grep -E '"level":"(ERROR|WARN)"' "$f" | jq -r '"\(.level) \(.msg)"' 2>/dev/null | sort | uniq -c | sort -rn | head -10
		echo "   first lines:"
		grep -E '"level":"(ERROR|WARN)"' "$f" | head -3 | cut -c1-400 | sed 's/^/   /'
	fi
done

# --- summary --------------------------------------------------------------------------
echo
echo "== okso scale summary (N=$N)"
row() { printf '  %-28s %s\n' "$1" "$2"; }
row "devices (N)" "$N"
row "connect time" "$connect_summary"
row "device tiers" "$NTIERS (each under the descriptor limit, $nofile)"
row "tier RSS before" "$(mb "$tier_rss_before")"
row "tier RSS after connect" "$(mb "$tier_rss_conn") (+5s: $(mb "$tier_rss_after"); after calls: $(mb "$tier_rss_calls"))"
row "tier per connection" "$per_conn KB  ((after+5s - before) / N)"
[ "$nwarm" -gt 0 ] && row "" "$per_conn_m KB marginal  ((after+5s - with the $WARM warm-up devices) / $main)"
[ "$IDLE" != 0 ] && row "" "$per_conn_idle KB after idling ${IDLE}s (keepalives included)${per_conn_idle_m:+; $per_conn_idle_m KB marginal}"
row "tier open fds" "$tier_fds"
row "gateway per node" "$gw_per_node KB  ((after connect+5s - before) / N)${gw_per_node_m:+; $gw_per_node_m KB marginal}"
if [ "$IDLE" != 0 ]; then
	row "idle CPU over ${IDLE}s, tier" "$idle_tier"
	row "idle CPU, gateway" "$idle_gw"
	row "idle CPU, fleet(s)" "$idle_fleet"
	[ -n "$nats" ] && row "idle CPU, nats-server" "$idle_nats"
fi
row "fleet RSS" "$(mb "$fleet_rss") ($fleet_per_dev KB/device, $nfleets process(es))"
row "gateway RSS" "$(mb "$gw_rss_before") before, $(mb "$gw_rss_listed") after connect, $(mb "$gw_rss_after") after calls"
if [ -n "$nats" ]; then
	row "nats-server RSS" "$(mb "$nats_rss_before") before, $(mb "$nats_rss") after connect: $nats_per_node KB/node${nats_per_node_m:+; $nats_per_node_m KB marginal}"
	[ "$IDLE" != 0 ] && row "" "$(mb "$nats_rss_idle") after idling ${IDLE}s: $nats_per_node_idle KB/node${nats_per_node_idle_m:+; $nats_per_node_idle_m KB marginal}"
fi
row "MCP connect (initialize)" "$(r mcp_connect) (first request of the token's view)"
row "tools listed" "$(r list_tools) tools, $(r list_echo) echo ($(r list_attempts) attempt(s), complete after $(r list_ready_after))"
row "list time" "$(r list_total) total, $(r list_pages) pages (first $(r list_page_first), mean $(r list_page_mean), max $(r list_page_max))"
row "calls ok / failed" "$(r calls_ok) / $(r calls_failed) $(r calls_failed_by_code)"
row "calls/s" "$(r calls_per_s) (concurrency $(r concurrency), wall $(r calls_wall))"
row "call latency" "p50 $(r call_p50), p99 $(r call_p99), max $(r call_max)"
if [ "$SPREAD_DURATION" != 0 ]; then
	row "okso bench, $few nodes" "${spread_few:-failed}"
	row "okso bench, all $N nodes" "${spread_all:-failed} (${spread_ratio:--} of the $few-node rate)"
fi
[ -n "$(r error)" ] && row "error" "$(r error)"
[ -n "$died" ] && row "processes that died" "$died"
row "stop (SIGTERM)" "fleet $stop_fleet, gateway $stop_gw, tier $stop_tier"
row "machine" "$(nproc) cores, shared with other work (load avg $load_start at fleet start, $load_end after calls);"
row "" "$([ -n "$nats" ] && echo "nats-server, tier(s)" || echo "tier (with embedded NATS)"), gateway, fleet and client all on one host, 127.0.0.1"
row "result" "$([ "$status" = 0 ] && echo PASS || echo FAIL)"
exit "$status"
