#!/usr/bin/env bash
# federation-bench (issue 34): a bare MCP echo server over Streamable HTTP,
# the upstream, called three ways by the same load generator (okso bench),
# alternating:
#   direct  the upstream itself;
#   okso    through okso (all-in-one --remotes: the gateway's auth,
#           validation and audit, NATS, the remote tier, its HTTP client);
#   peer    through TBXark/mcp-proxy, a Go aggregating MCP proxy (built on
#           mcp-go; streamable-http, stateless, a bearer token), when its
#           source or binary is found (PEER_PROXY); mcp-go upstream only.
# Upstreams (BENCH_UPSTREAMS): mcpgo, scripts/refserver-mcpgo (mark3labs/
# mcp-go, stateless), issue 34's (target: okso >= 1.5x the peer in raw64);
# gosdk, scripts/refserver (the official go-sdk) stateless with JSON
# answers. Shapes (BENCH_SHAPES): raw64, wrk's, 64 keep-alive connections
# of bare HTTP POSTs, each answer checked for its call's echo (okso bench
# --mode raw); c64 and c1, 64 and 1 calls in flight over MCP client
# sessions. Prints the medians over the rounds and, for each shape, the
# median of each round's ratio: of calls/s, and of the CPU per call of
# the peer and the upstream over okso's and the upstream's (which says
# what each path costs rather than how fast it went; on a shared machine
# it swings with the load as calls/s do, since a process's CPU per call
# grows when it competes for the cores).
#
# Environment:
#   BENCH_DURATION   measured time of each run (10s)
#   BENCH_WARMUP     warm-up of each run, not counted (2s)
#   BENCH_ROUNDS     rounds (3)
#   BENCH_SHAPES     of raw64 c64 c1 ("raw64 c64 c1")
#   BENCH_UPSTREAMS  of mcpgo gosdk ("mcpgo gosdk")
#   PEER_PROXY       TBXark/mcp-proxy: a built binary, or a checkout of its
#                    source, built here with the Go module proxy (default
#                    ../mcp-proxy beside this checkout; not vendored:
#                    git clone https://github.com/TBXark/mcp-proxy ../mcp-proxy);
#                    none there: the peer column is skipped, said so
#   BENCH_PROFILE    a file: write there a CPU profile of okso all-in-one
#                    over the measured time of its first run and print its
#                    top 15 entries, flat and cumulative
#   BENCH_OKSO       an okso binary to run instead of building bin/okso
#                    (the load generator is always this tree's)
#   BENCH_KEEP       1: keep the work dir
set -uo pipefail
cd "$(dirname "$0")/.."
DURATION=${BENCH_DURATION:-10s}
WARMUP=${BENCH_WARMUP:-2s}
ROUNDS=${BENCH_ROUNDS:-3}
read -r -a SHAPES <<<"${BENCH_SHAPES:-raw64 c64 c1}"
for shape in "${SHAPES[@]}"; do
	case $shape in raw64 | c1 | c64) ;; *) echo "BENCH_SHAPES: $shape: want raw64, c64 or c1" >&2; exit 2 ;; esac
done
read -r -a UPSTREAMS <<<"${BENCH_UPSTREAMS:-mcpgo gosdk}"
for u in "${UPSTREAMS[@]}"; do
	case $u in mcpgo | gosdk) ;; *) echo "BENCH_UPSTREAMS: $u: want mcpgo or gosdk" >&2; exit 2 ;; esac
done
PEER=${PEER_PROXY-../mcp-proxy}
PROFILE=${BENCH_PROFILE:-}
command -v jq >/dev/null || { echo "federation-bench needs jq" >&2; exit 2; }

NAME=federation-bench KEEP=${BENCH_KEEP:-0}
. scripts/lib.sh

log "building bin/okso (the load generator)"
go build -o bin/okso . || exit 1
BENCH=$PWD/bin/okso
use_okso BENCH_OKSO
build_refs || exit 1

# --- the peer proxy, if there is one ---------------------------------------------------
peer_bin= peer_note=
if [ -z "$PEER" ]; then
	peer_note="PEER_PROXY is empty"
elif [ -d "$PEER" ] && [ -f "$PEER/go.mod" ]; then
	log "building the peer proxy from $PEER"
	if go build -C "$PEER" -o "$work/mcp-proxy" .; then
		peer_bin=$work/mcp-proxy
		peer_note="TBXark/mcp-proxy built from $(realpath "$PEER") ($(git -C "$PEER" describe --tags --always 2>/dev/null || echo 'no git'))"
	else
		peer_note="PEER_PROXY=$PEER does not build"
		status=1
	fi
elif [ -f "$PEER" ] && [ -x "$PEER" ]; then
	peer_bin=$(realpath "$PEER")
	peer_note="TBXark/mcp-proxy binary $peer_bin"
else
	peer_note="no peer proxy at PEER_PROXY=$PEER: the peer column is skipped (git clone https://github.com/TBXark/mcp-proxy $PEER, or set PEER_PROXY to its source or binary)"
fi
log "$peer_note"

# --- the upstreams ----------------------------------------------------------------------
declare -A direct_url up_pid
if [[ " ${UPSTREAMS[*]} " == *" mcpgo "* ]]; then
	start_ref mcpgo "$work/refserver-mcpgo" || { status=1; exit 1; }
	direct_url[mcpgo]=$ref_url up_pid[mcpgo]=$ref_pid
fi
if [[ " ${UPSTREAMS[*]} " == *" gosdk "* ]]; then
	start_ref gosdk "$work/refserver" -stateless -json-response || { status=1; exit 1; }
	direct_url[gosdk]=$ref_url up_pid[gosdk]=$ref_pid
fi

# --- okso, federating them --------------------------------------------------------------
{
	echo "upstreams:"
	for u in "${UPSTREAMS[@]}"; do
		cat <<EOF
  - name: $u
    transport: http
    url: ${direct_url[$u]}
    tenants: [demo]
    allow: [echo]
    safety: {echo: read_only}
    idempotent: [echo]
EOF
	done
} >"$work/remotes.yaml"
okso_flags=()
[ -n "$PROFILE" ] && okso_flags+=(--debug-addr 127.0.0.1:0)
"$OKSO" all-in-one --mock 0 --local-agent=false --data-dir "$work/data" --mcp-addr 127.0.0.1:0 \
	--device-addr 127.0.0.1:0 --remotes "$work/remotes.yaml" "${okso_flags[@]}" >"$work/okso.out" 2>"$work/okso.log" &
okso=$!
pids+=("$okso")
wait_for "$work/okso.out" "$okso" '^  agent token  : ' 30 >/dev/null || { status=1; exit 1; }
field() { sed -n "s/^  $1 *: //p" "$work/okso.out" | head -1; }
okso_url=$(field "MCP endpoint")
token=$(field "agent token")
for u in "${UPSTREAMS[@]}"; do
	for ((i = 0; ; i++)); do
		listed=$(OKSO_TOKEN=$token "$BENCH" bench --url "$okso_url" --mode list --tool "$u.echo" --concurrency 1 --sessions 1 \
			--duration 1s --warmup 0 --json 2>/dev/null | jq -r '.tools // 0')
		[ "${listed:-0}" -ge 1 ] && break
		[ "$i" -ge 30 ] && { log "the gateway never listed $u.echo"; status=1; exit 1; }
		sleep 1
	done
done
log "okso pid $okso: $okso_url lists $(printf '%s.echo ' "${UPSTREAMS[@]}")"
debug_url=
if [ -n "$PROFILE" ]; then
	debug_url=$(wait_for "$work/okso.log" "$okso" '"msg":"debug listener"' 10 | jq -r .debug_url) || { status=1; exit 1; }
fi

# --- the peer, proxying the mcp-go upstream -----------------------------------------------
# free_port: a port on 127.0.0.1 nothing listens on (mcp-proxy takes no
# :0), below the ephemeral range, whose ports outgoing connections hold.
free_port() {
	local p lo
	lo=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
	for _ in $(seq 50); do
		p=$((10000 + RANDOM % (lo - 10000)))
		(exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return 0; }
	done
	return 1
}
peer= peer_url=
peer_token=okso-federation-bench
if [ -n "$peer_bin" ] && [[ " ${UPSTREAMS[*]} " == *" mcpgo "* ]]; then
	for attempt in 1 2 3; do # a port found free may be taken before the peer binds it
		port=$(free_port) || { log "no free port for the peer"; status=1; exit 1; }
		jq -n --arg addr "127.0.0.1:$port" --arg url "${direct_url[mcpgo]}" --arg tok "$peer_token" '{
			mcpProxy: {baseURL: ("http://" + $addr), addr: $addr, name: "mcp-proxy", version: "1.0.0",
				type: "streamable-http", options: {panicIfInvalid: true, logEnabled: false, authTokens: [$tok]}},
			mcpServers: {mcpgo: {url: $url, transportType: "streamable-http"}}}' >"$work/mcp-proxy.json"
		"$peer_bin" -config "$work/mcp-proxy.json" >"$work/peer.out" 2>"$work/peer.log" &
		peer=$!
		pids+=("$peer")
		wait_for "$work/peer.log" "$peer" 'Handling requests at /mcpgo/' 30 >/dev/null && break
		[ "$attempt" = 3 ] && { status=1; exit 1; }
	done
	peer_url="http://127.0.0.1:$port/mcpgo/"
	log "peer pid $peer: $peer_url"
fi

# --- the runs ---------------------------------------------------------------------------
secs() { awk -v d="$1" 'BEGIN{ if (d ~ /ms$/) print substr(d, 1, length(d)-2) / 1000; else if (d ~ /s$/) print substr(d, 1, length(d)-1) + 0; else print 0 }'; }
profiled=0
# run NAME UPSTREAM SHAPE ROUND ARGS...: one okso bench run, its JSON in
# $work, with the CPU per call of the proxy (okso's or the peer's), the
# upstream and the load generator added.
run() {
	local name=$1 up=$2 shape=$3 round=$4 out prof= b p i before=() spent=() pids_cpu
	shift 4
	out=$work/$up-$shape-$name-$round.json
	log "round $round/$ROUNDS, $up, $shape, $name"
	case $name in
	okso) pids_cpu=("$okso" "${up_pid[$up]}") ;;
	peer) pids_cpu=("$peer" "${up_pid[$up]}") ;;
	direct) pids_cpu=("${up_pid[$up]}") ;;
	esac
	for p in "${pids_cpu[@]}"; do before+=("$(cpu "$p")"); done
	if [ "$name" = okso ] && [ -n "$PROFILE" ] && [ "$profiled" = 0 ]; then
		profiled=1 profiled_run="$up $shape"
		(sleep "$(secs "$WARMUP")" && curl -sf -o "$PROFILE" \
			"${debug_url}profile?seconds=$(awk -v s="$(secs "$DURATION")" 'BEGIN{ s = int(s); print (s < 1 ? 1 : s) }')") &
		prof=$!
	fi
	(
		TIMEFORMAT='%U %S'
		time "$BENCH" bench --duration "$DURATION" --warmup "$WARMUP" --protocol 2025-11-25 --json "$@" \
			>"$out" 2>"$work/$up-$shape-$name-$round.progress"
	) 2>"$out.time" &
	b=$!
	if ! wait "$b"; then
		log "run failed: $(tail -3 "$work/$up-$shape-$name-$round.progress")"
		status=1
	fi
	if [ -n "$prof" ]; then
		wait "$prof" || { log "no CPU profile from $debug_url"; status=1; }
	fi
	# over warm-up and run alike (calls: the measured ones scaled by (warm-up + run) / run)
	for i in "${!pids_cpu[@]}"; do spent+=($(($(cpu "${pids_cpu[$i]}") - before[i]))); done
	[ "$name" = direct ] && spent=(0 "${spent[@]}")
	jq --arg spent "${spent[*]}" --arg hz "$(getconf CLK_TCK)" --arg warm "$(secs "$WARMUP")" --arg dur "$(secs "$DURATION")" \
		--arg bench "$(tail -1 "$out.time" 2>/dev/null)" '
		(.ok * (($warm | tonumber) + ($dur | tonumber)) / ($dur | tonumber)) as $calls |
		($spent | split(" ") | map(tonumber * 1e6 / ($hz | tonumber) / ($calls + 1e-9) | floor)) as $us |
		. + {proxy_cpu_us_per_call: $us[0], upstream_cpu_us_per_call: $us[1],
			bench_cpu_us_per_call: ($bench | split(" ") | map(tonumber? // 0) | add * 1e6 / ($calls + 1e-9) | floor)}' \
		"$out" >"$out.tmp" && mv "$out.tmp" "$out"
	jq -r '"  \(.ok_per_s | floor) ok/s, p50 \(.latency_ms.p50)ms, p99 \(.latency_ms.p99)ms, errors \(.errors), CPU µs/call: proxy \(.proxy_cpu_us_per_call), upstream \(.upstream_cpu_us_per_call), load generator \(.bench_cpu_us_per_call)"' "$out" >&2 2>/dev/null
}
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
for ((round = 1; round <= ROUNDS; round++)); do
	for up in "${UPSTREAMS[@]}"; do
		for shape in "${SHAPES[@]}"; do
			case $shape in
			raw64) args=(--mode raw --concurrency 64) ;;
			c1) args=(--concurrency 1 --sessions 1) ;;
			c64) args=(--concurrency 64 --sessions 8) ;;
			esac
			OKSO_TOKEN=$token run okso "$up" "$shape" "$round" --url "$okso_url" --tool "$up.echo" "${args[@]}"
			if [ "$up" = mcpgo ] && [ -n "$peer" ]; then
				OKSO_TOKEN=$peer_token run peer "$up" "$shape" "$round" --url "$peer_url" --tool echo "${args[@]}"
			fi
			OKSO_TOKEN= run direct "$up" "$shape" "$round" --url "${direct_url[$up]}" --tool echo "${args[@]}"
		done
	done
done
load_end=$(cut -d' ' -f1-3 /proc/loadavg)
for pair in "okso all-in-one:$okso" "peer:${peer:-}"; do
	[ -z "${pair##*:}" ] && continue
	alive "${pair##*:}" || { status=1; log "DIED during the runs: ${pair%%:*}"; }
done

# --- the tables -------------------------------------------------------------------------
# median UPSTREAM SHAPE NAME JQPATH: the median of JQPATH over the rounds.
median() {
	cat "$work/$1-$2-$3-"*.json 2>/dev/null | jq -s "[.[] | $4 // empty] | sort |
		if length == 0 then null elif length % 2 == 1 then .[length/2|floor]
		else (.[length/2-1] + .[length/2]) / 2 end"
}
num() { awk -v v="$1" -v f="$2" 'BEGIN{ if (v == "null" || v == "") print "-"; else printf f, v }'; }
# round_ratio UPSTREAM SHAPE A B JQPATH: the median over the rounds of A/B.
round_ratio() {
	local r out=()
	for ((r = 1; r <= ROUNDS; r++)); do
		out+=("$(jq -n --slurpfile a "$work/$1-$2-$3-$r.json" --slurpfile b "$work/$1-$2-$4-$r.json" \
			"(\$a[0] | $5) / (\$b[0] | $5)" 2>/dev/null)")
	done
	printf '%s\n' "${out[@]}" | grep -v '^$' | sort -g | awk '{ v[NR] = $1 } END {
		if (NR == 0) print "-"; else if (NR % 2) printf "%.2f", v[(NR + 1) / 2]; else printf "%.2f", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
label() {
	case $1 in
	raw64) echo "raw HTTP, 64 conns" ;;
	c1) echo "1 in flight, 1 sess" ;;
	c64) echo "64 in flight, 8 sess" ;;
	esac
}
echo
echo "== an HTTP upstream called directly, through okso (all-in-one --remotes) and through the peer proxy:"
echo "   medians over $ROUNDS rounds ($DURATION each after $WARMUP warm-up)"
printf '%-8s %-22s %-7s %10s %10s %10s   %s\n' upstream "" "" "calls/s" "p50" "p99" "CPU µs/call: proxy upstream load"
for up in "${UPSTREAMS[@]}"; do
	for shape in "${SHAPES[@]}"; do
		l=$(label "$shape")
		for name in okso peer direct; do
			[ "$name" = peer ] && { [ "$up" != mcpgo ] || [ -z "$peer" ]; } && continue
			printf '%-8s %-22s %-7s %10s %10s %10s   %17s %8s %4s\n' "$up" "$l" "$name" \
				"$(num "$(median "$up" "$shape" "$name" .ok_per_s)" %.0f)" \
				"$(num "$(median "$up" "$shape" "$name" .latency_ms.p50)" %.3fms)" \
				"$(num "$(median "$up" "$shape" "$name" .latency_ms.p99)" %.2fms)" \
				"$([ "$name" = direct ] && echo - || num "$(median "$up" "$shape" "$name" .proxy_cpu_us_per_call)" %.0f)" \
				"$(num "$(median "$up" "$shape" "$name" .upstream_cpu_us_per_call)" %.0f)" \
				"$(num "$(median "$up" "$shape" "$name" .bench_cpu_us_per_call)" %.0f)"
			l=""
		done
	done
done
echo
echo "== the median of each round's ratio"
printf '%-8s %-22s %14s %14s %12s %12s %14s\n' upstream "" "okso/direct" "okso/peer" "p50 diff" "peer/direct" "CPU peer/okso"
cpu_path='(.proxy_cpu_us_per_call + .upstream_cpu_us_per_call)'
for up in "${UPSTREAMS[@]}"; do
	for shape in "${SHAPES[@]}"; do
		op=$(median "$up" "$shape" okso .latency_ms.p50) dp=$(median "$up" "$shape" direct .latency_ms.p50)
		vp=- pd=- cp=-
		if [ "$up" = mcpgo ] && [ -n "$peer" ]; then
			vp=$(round_ratio "$up" "$shape" okso peer .ok_per_s)
			pd=$(round_ratio "$up" "$shape" peer direct .ok_per_s)
			cp=$(round_ratio "$up" "$shape" peer okso "$cpu_path")
		fi
		printf '%-8s %-22s %14s %14s %12s %12s %14s\n' "$up" "$(label "$shape")" \
			"$(round_ratio "$up" "$shape" okso direct .ok_per_s)" "$vp" \
			"$(awk -v a="$op" -v b="$dp" 'BEGIN{ if (a == "null" || b == "null") print "-"; else printf "%.3fms", a-b }')" "$pd" "$cp"
	done
done
echo "  ratios of calls/s; p50 diff = okso's p50 - the direct p50 at the medians."
echo "  CPU peer/okso: the peer's CPU per call plus the upstream's, over okso's plus the upstream's (higher: okso"
echo "  costs less); it swings with the machine's load as calls/s do."
echo "  Issue 34's target: mcpgo, raw HTTP, okso/peer >= 1.5. Earlier ones: 64 in flight okso/direct >= 0.45;"
echo "  1 in flight p50 diff <= 0.5 ms"
echo
echo "== calls, summed over the rounds (ok, then errors by code)"
for up in "${UPSTREAMS[@]}"; do
	for shape in "${SHAPES[@]}"; do
		for name in okso peer direct; do
			ls "$work/$up-$shape-$name-"*.json >/dev/null 2>&1 || continue
			e=$(cat "$work/$up-$shape-$name-"*.json | jq -rs '
				(map(.ok) | add) as $ok |
				(map(.errors // {} | to_entries[]) | group_by(.key) | map("\(.[0].key): \(map(.value) | add)") | join(", ")) as $e |
				"\($ok) ok" + (if $e == "" then ", no errors" else ", " + $e end)')
			printf '  %-6s %-6s %-7s %s\n' "$up" "$shape" "$name" "$e"
		done
	done
done
if [ -n "$PROFILE" ] && [ -s "$PROFILE" ]; then
	echo
	echo "== okso all-in-one's CPU profile over the measured time of its first run (${profiled_run:-}) ($PROFILE)"
	pprof_tops "$OKSO" "$PROFILE"
fi
echo
echo "  peer: $peer_note"
for up in "${UPSTREAMS[@]}"; do
	case $up in
	mcpgo) echo "  upstream mcpgo: scripts/refserver-mcpgo (mcp-go $(go list -C scripts/refserver-mcpgo -m -f '{{.Version}}' github.com/mark3labs/mcp-go), stateless)" ;;
	gosdk) echo "  upstream gosdk: scripts/refserver (go-sdk $(go list -m -f '{{.Version}}' github.com/modelcontextprotocol/go-sdk), stateless, JSON answers)" ;;
	esac
done
echo "  CPU µs/call: of all-in-one or the peer, of the upstream, and of the load generator (okso bench), over warm-up and run"
echo "  protocol 2025-11-25; load generator: okso bench of this tree"
echo "  machine: $(nproc) cores, load avg $load_start before, $load_end after; all processes share it, on 127.0.0.1"
exit "$status"
