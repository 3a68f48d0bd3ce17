#!/usr/bin/env bash
# Side-by-side benchmark (issues 6 and 34): okso against the simplest
# alternatives, bare echo servers written with the two Go MCP libraries,
# on the same machine in the same run, driven by `okso bench` in
# alternation (okso, mcp-go, go-sdk, okso, ...) for BENCH_ROUNDS rounds:
#
#   raw64  64 keep-alive connections of bare HTTP POSTs, wrk's shape, each
#          answer checked for the echo of its call (okso bench --mode raw):
#          issue 34's target, okso >= 0.75x mcp-go;
#   c64    64 calls in flight over 8 MCP client sessions (the go-sdk client);
#   c1     one call in flight, one session.
#
# okso is `okso all-in-one --mock 0 --local-agent=false` with a fleet of
# BENCH_NODES mock devices in a separate `okso mock-fleet` process; its calls
# go to 'sysecho.*', spread round-robin over every node (each node allows 10
# calls/s and 4 in flight: 3,000 nodes allow 30,000 calls/s). The
# references' calls go to their one echo tool:
#   mcp-go  scripts/refserver-mcpgo (mark3labs/mcp-go, stateless, JSON answers)
#   go-sdk  scripts/refserver (the official go-sdk): stateful with SSE
#           answers, its defaults, in c1 and c64; stateless with JSON
#           answers in raw64, which has no sessions
# Everything runs on 127.0.0.1; every process is stopped at the end.
#
# Usage: scripts/bench-compare.sh          (make bench-compare)
# Environment:
#   BENCH_DURATION     measured time of each run (10s)
#   BENCH_WARMUP       warm-up of each run, not counted (2s)
#   BENCH_ROUNDS       rounds (3; at least 3)
#   BENCH_NODES        mock devices (3000)
#   BENCH_SHAPES       which shapes to run, of raw64 c64 c1 ("raw64 c64 c1")
#   BENCH_SERVERS      which servers to run, of okso mcpgo gosdk ("okso mcpgo gosdk")
#   BENCH_PROTOCOL     MCP protocol version all are driven with (2025-11-25,
#                      the newest the SDK's default stateful server speaks;
#                      empty: the SDK client's latest, which each server
#                      may negotiate down; raw64 then sends 2025-11-25)
#   BENCH_OKSO_FLAGS   extra flags for okso all-in-one (e.g. --log-level warn)
#   BENCH_PROFILE      a file: write there a CPU profile of okso all-in-one
#                      over the measured time of the first okso run of the
#                      first shape (through --debug-addr) and print its top
#                      15 entries, flat and cumulative
#   BENCH_FLEET_PROFILE  a file: the same of the mock fleet's process over
#                      the same run (the device end of the call path)
#   GOGC, GOMAXPROCS   given to okso all-in-one and the references alike
#                      (unset: Go's defaults for all; okso then adapts
#                      GOMAXPROCS to its load, see --adaptive-procs); the
#                      mock fleet and the load generator run at Go's defaults
#   BENCH_KEEP         1: keep the work dir (logs, each run's JSON)
#   BENCH_OKSO         an okso binary to run instead of building bin/okso
#                      (an older build, say, against the same references;
#                      the load generator is always this tree's)
#   BENCH_OKSO_BASE    a second okso binary (the build before a change, say),
#                      run as the server "base" with a fleet of its own, in
#                      each round after okso: okso / base is then a ratio of
#                      the same round, as the references' are
# Prints a table of medians over the rounds (calls/s, p50, p99, each
# server's CPU per call), the okso/reference ratios (the median of each
# round's), then the errors by code. Exit status 0 when every run
# completed, 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."

DURATION=${BENCH_DURATION:-10s}
WARMUP=${BENCH_WARMUP:-2s}
ROUNDS=${BENCH_ROUNDS:-3}
NODES=${BENCH_NODES:-3000}
read -r -a SHAPES <<<"${BENCH_SHAPES:-raw64 c64 c1}"
for shape in "${SHAPES[@]}"; do
	case $shape in raw64 | c1 | c64) ;; *) echo "BENCH_SHAPES: $shape: want raw64, c64 or c1" >&2; exit 2 ;; esac
done
read -r -a SERVERS <<<"${BENCH_SERVERS:-okso mcpgo gosdk}"
for s in "${SERVERS[@]}"; do
	case $s in okso | mcpgo | gosdk) ;; *) echo "BENCH_SERVERS: $s: want okso, mcpgo or gosdk" >&2; exit 2 ;; esac
done
BASE_OKSO=${BENCH_OKSO_BASE:-}
if [ -n "$BASE_OKSO" ]; then
	BASE_OKSO=$(realpath "$BASE_OKSO") && [ -x "$BASE_OKSO" ] || { echo "BENCH_OKSO_BASE=${BENCH_OKSO_BASE}: not an executable" >&2; exit 2; }
	# right after okso, or first
	with_base=()
	for s in "${SERVERS[@]}"; do
		with_base+=("$s")
		[ "$s" = okso ] && with_base+=(base)
	done
	[[ " ${with_base[*]} " == *" base "* ]] || with_base=(base "${with_base[@]}")
	SERVERS=("${with_base[@]}")
fi
PROTOCOL=${BENCH_PROTOCOL-2025-11-25}
read -r -a OKSO_FLAGS <<<"${BENCH_OKSO_FLAGS:-}"
PROFILE=${BENCH_PROFILE:-}
FLEET_PROFILE=${BENCH_FLEET_PROFILE:-}
SERVER_GOGC=${GOGC:-}
SERVER_PROCS=${GOMAXPROCS:-}
unset GOGC GOMAXPROCS # only the servers get them
case $ROUNDS in '' | *[!0-9]*) echo "BENCH_ROUNDS=$ROUNDS: want a number" >&2; exit 2 ;; esac
[ "$ROUNDS" -lt 3 ] && { echo "BENCH_ROUNDS=$ROUNDS: want at least 3" >&2; exit 2; }
command -v jq >/dev/null || { echo "bench-compare needs jq" >&2; exit 2; }
has() { [[ " ${SERVERS[*]} " == *" $1 "* ]]; }

NAME=bench-compare KEEP=${BENCH_KEEP:-0}
. scripts/lib.sh

# --- build ---------------------------------------------------------------------------
log "building bin/okso (the load generator)"
go build -o bin/okso . || exit 1
BENCH=$PWD/bin/okso
use_okso BENCH_OKSO
build_refs || exit 1
fleets=1
[ -n "$BASE_OKSO" ] && fleets=2
want_open_files $((fleets * (NODES + NODES / 4) + 4096))

server_env=()
[ -n "$SERVER_GOGC" ] && server_env+=("GOGC=$SERVER_GOGC")
[ -n "$SERVER_PROCS" ] && server_env+=("GOMAXPROCS=$SERVER_PROCS")
ref_env=("${server_env[@]}")

# --- okso: all-in-one, then the fleet ----------------------------------------------------
okso= fleet= debug_url= fleet_debug_url= base= base_fleet=
if has base; then
	# The base build in a work dir of its own, with a fleet of its own.
	main_work=$work main_okso=$OKSO
	work=$work/base OKSO=$BASE_OKSO
	mkdir -p "$work"
	okso_env=("${server_env[@]}")
	start_okso "$NODES" 'sysecho.*' "${OKSO_FLAGS[@]}" || { status=1; exit 1; }
	base=$okso base_fleet=$fleet base_url=$okso_url base_token=$token
	work=$main_work OKSO=$main_okso
	okso= fleet=
	log "base ($BASE_OKSO): all-in-one pid $base, fleet pid $base_fleet"
fi
if has okso; then
	okso_env=("${server_env[@]}")
	[ -n "$PROFILE" ] && OKSO_FLAGS+=(--debug-addr 127.0.0.1:0)
	[ -n "$FLEET_PROFILE" ] && fleet_flags+=(--debug-addr 127.0.0.1:0)
	start_okso "$NODES" 'sysecho.*' "${OKSO_FLAGS[@]}" || { status=1; exit 1; }
	if [ -n "$PROFILE" ]; then
		debug_url=$(wait_for "$work/okso.log" "$okso" '"msg":"debug listener"' 10 | jq -r .debug_url) || { status=1; exit 1; }
		log "okso profiles at $debug_url"
	fi
	if [ -n "$FLEET_PROFILE" ]; then
		fleet_debug_url=$(wait_for "$work/fleet.log" "$fleet" '"msg":"debug listener"' 10 | jq -r .debug_url) || { status=1; exit 1; }
		log "the mock fleet's profiles at $fleet_debug_url"
	fi
fi

# --- the references ----------------------------------------------------------------------
if has mcpgo; then
	start_ref mcpgo "$work/refserver-mcpgo" || { status=1; exit 1; }
	mcpgo=$ref_pid mcpgo_url=$ref_url
fi
if has gosdk; then
	start_ref gosdk "$work/refserver" || { status=1; exit 1; }
	gosdk=$ref_pid gosdk_url=$ref_url
	start_ref gosdk-stateless "$work/refserver" -stateless -json-response || { status=1; exit 1; }
	gosdkless=$ref_pid gosdkless_url=$ref_url
fi

# --- the runs ---------------------------------------------------------------------------
secs() { awk -v d="$1" 'BEGIN{ if (d ~ /ms$/) print substr(d, 1, length(d)-2) / 1000; else if (d ~ /s$/) print substr(d, 1, length(d)-1) + 0; else print 0 }'; }
profiled=0
# run NAME SHAPE ROUND ARGS...: one okso bench run, its JSON in $work, with
# the CPU per call of the server's processes added.
run() {
	local name=$1 shape=$2 round=$3 out b pids_cpu p before=() i prof= fprof=
	shift 3
	out=$work/$shape-$name-$round.json
	log "round $round/$ROUNDS, $shape, $name"
	case $name in
	okso) pids_cpu=("$okso" "$fleet") ;;
	base) pids_cpu=("$base" "$base_fleet") ;;
	mcpgo) pids_cpu=("$mcpgo") ;;
	gosdk) [ "$shape" = raw64 ] && pids_cpu=("$gosdkless") || pids_cpu=("$gosdk") ;;
	esac
	for p in "${pids_cpu[@]}"; do before+=("$(cpu "$p")"); done
	if [ "$name" = okso ] && [ "$profiled" = 0 ]; then
		profiled=1
		# over the measured time: start them once the warm-up is over
		local psecs
		psecs=$(awk -v s="$(secs "$DURATION")" 'BEGIN{ s = int(s); print (s < 1 ? 1 : s) }')
		if [ -n "$PROFILE" ]; then
			(sleep "$(secs "$WARMUP")" && curl -sf -o "$PROFILE" "${debug_url}profile?seconds=$psecs") &
			prof=$!
		fi
		if [ -n "$FLEET_PROFILE" ]; then
			(sleep "$(secs "$WARMUP")" && curl -sf -o "$FLEET_PROFILE" "${fleet_debug_url}profile?seconds=$psecs") &
			fprof=$!
		fi
	fi
	(
		TIMEFORMAT='%U %S'
		time "$BENCH" bench --duration "$DURATION" --warmup "$WARMUP" --protocol "$PROTOCOL" --json "$@" >"$out" 2>"$work/$shape-$name-$round.progress"
	) 2>"$out.time" &
	b=$!
	if ! wait "$b"; then
		log "run failed: $(tail -3 "$work/$shape-$name-$round.progress")"
		status=1
	fi
	if [ -n "$prof" ]; then
		wait "$prof" || { log "no CPU profile from $debug_url"; status=1; }
	fi
	if [ -n "$fprof" ]; then
		wait "$fprof" || { log "no CPU profile from $fleet_debug_url"; status=1; }
	fi
	# CPU per call of each server process, over warm-up and run alike
	# (calls counted: the measured ones scaled by (warm-up + run) / run).
	local spent=()
	for i in "${!pids_cpu[@]}"; do spent+=($(($(cpu "${pids_cpu[$i]}") - before[i]))); done
	jq --arg spent "${spent[*]}" --arg hz "$(getconf CLK_TCK)" --arg warm "$(secs "$WARMUP")" --arg dur "$(secs "$DURATION")" \
		--arg bench "$(tail -1 "$out.time" 2>/dev/null)" '
		(.ok * (($warm | tonumber) + ($dur | tonumber)) / ($dur | tonumber)) as $calls |
		. + {server_cpu_us_per_call: ($spent | split(" ") | map(tonumber * 1e6 / ($hz | tonumber) / ($calls + 1e-9) | floor)),
			bench_cpu_us_per_call: ($bench | split(" ") | map(tonumber? // 0) | add * 1e6 / ($calls + 1e-9) | floor)}' \
		"$out" >"$out.tmp" && mv "$out.tmp" "$out"
	jq -r '"  \(.ok_per_s | floor) ok/s, p50 \(.latency_ms.p50)ms, p99 \(.latency_ms.p99)ms, errors \(.errors), server CPU µs/call \(.server_cpu_us_per_call), load generator \(.bench_cpu_us_per_call)"' "$out" >&2 2>/dev/null
}
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
for ((round = 1; round <= ROUNDS; round++)); do
	for shape in "${SHAPES[@]}"; do
		case $shape in
		raw64) args=(--mode raw --concurrency 64) ;;
		c1) args=(--concurrency 1 --sessions 1) ;;
		c64) args=(--concurrency 64 --sessions 8) ;;
		esac
		for s in "${SERVERS[@]}"; do
			case $s in
			okso) OKSO_TOKEN=$token run okso "$shape" "$round" --url "$okso_url" --tool 'sysecho.*' "${args[@]}" ;;
			base) OKSO_TOKEN=$base_token run base "$shape" "$round" --url "$base_url" --tool 'sysecho.*' "${args[@]}" ;;
			mcpgo) OKSO_TOKEN= run mcpgo "$shape" "$round" --url "$mcpgo_url" --tool echo "${args[@]}" ;;
			gosdk)
				u=$gosdk_url
				[ "$shape" = raw64 ] && u=$gosdkless_url
				OKSO_TOKEN= run gosdk "$shape" "$round" --url "$u" --tool echo "${args[@]}"
				;;
			esac
		done
	done
done
load_end=$(cut -d' ' -f1-3 /proc/loadavg)
for pair in "okso all-in-one:${okso:-}" "mock-fleet:${fleet:-}" "base all-in-one:${base:-}" "base mock-fleet:${base_fleet:-}" "mcp-go:${mcpgo:-}" "go-sdk:${gosdk:-}" "go-sdk stateless:${gosdkless:-}"; do
	[ -z "${pair##*:}" ] && continue
	alive "${pair##*:}" || { status=1; log "DIED during the runs: ${pair%%:*}"; }
done

# --- the tables -------------------------------------------------------------------------
# median SHAPE NAME JQPATH: the median of JQPATH over the rounds.
median() {
	cat "$work/$1-$2-"*.json 2>/dev/null | jq -s "[.[] | $3 // empty] | sort |
		if length == 0 then null elif length % 2 == 1 then .[length/2|floor]
		else (.[length/2-1] + .[length/2]) / 2 end"
}
num() { awk -v v="$1" -v f="$2" 'BEGIN{ if (v == "null" || v == "") print "-"; else printf f, v }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{ if (a == "null" || b == "null" || a == "" || b == "" || b == 0) print "-"; else printf "%.2f", a/b }'; }
# round_ratios SHAPE REF JQPATH: okso / REF of JQPATH, round by round.
round_ratios() {
	local r o f
	for ((r = 1; r <= ROUNDS; r++)); do
		o=$(jq "$3 // null" "$work/$1-okso-$r.json" 2>/dev/null)
		f=$(jq "$3 // null" "$work/$1-$2-$r.json" 2>/dev/null)
		ratio "${o:-null}" "${f:-null}"
		echo
	done
}
# round_ratio SHAPE REF JQPATH: the median of round_ratios.
round_ratio() {
	round_ratios "$1" "$2" "$3" | grep -v '^-$' | sort -n | awk '{ v[NR] = $1 } END {
		if (NR == 0) print "-"; else if (NR % 2) printf "%.2f", v[(NR + 1) / 2]; else printf "%.2f", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
label() {
	case $1 in
	raw64) echo "raw HTTP, 64 conns" ;;
	c1) echo "1 in flight, 1 sess" ;;
	c64) echo "64 in flight, 8 sess" ;;
	esac
}
server_name() { case $1 in okso) echo okso ;; base) echo base ;; mcpgo) echo mcp-go ;; gosdk) echo go-sdk ;; esac; }

echo
echo "== okso vs. bare mcp-go and go-sdk echo servers: medians over $ROUNDS rounds (${DURATION} each after ${WARMUP} warm-up)"
printf '%-22s %-8s %10s %10s %10s %6s   %s\n' "" "" "calls/s" "p50" "p99" "load" "server CPU µs/call"
for shape in "${SHAPES[@]}"; do
	l=$(label "$shape")
	for s in "${SERVERS[@]}"; do
		cpu_us=$(median "$shape" "$s" '.server_cpu_us_per_call[0]')
		[ "$s" = okso ] || [ "$s" = base ] && cpu_us="$(num "$cpu_us" %.0f) all-in-one + $(num "$(median "$shape" "$s" '.server_cpu_us_per_call[1]')" %.0f) fleet"
		printf '%-22s %-8s %10s %10s %10s %6s   %s\n' "$l" "$(server_name "$s")" \
			"$(num "$(median "$shape" "$s" .ok_per_s)" %.0f)" \
			"$(num "$(median "$shape" "$s" .latency_ms.p50)" %.3fms)" \
			"$(num "$(median "$shape" "$s" .latency_ms.p99)" %.2fms)" \
			"$(num "$(median "$shape" "$s" .bench_cpu_us_per_call)" %.0f)" "$cpu_us"
		l=""
	done
done
echo "  load: the load generator's CPU µs per call (okso bench, on the same cores as the servers)"
if has okso; then
	echo
	echo "== okso / each reference: the median of each round's ratio (the servers run back to back in a"
	echo "   round, so a machine whose speed drifts during the run weighs on both sides of each ratio alike)"
	printf '%-22s %-10s %8s %8s %8s   %s\n' "" "okso vs" "calls/s" "p50" "p99" "calls/s ratio of each round"
	for shape in "${SHAPES[@]}"; do
		l=$(label "$shape")
		for s in "${SERVERS[@]}"; do
			[ "$s" = okso ] && continue
			printf '%-22s %-10s %8s %8s %8s   %s\n' "$l" "$(server_name "$s")" \
				"$(round_ratio "$shape" "$s" .ok_per_s)" "$(round_ratio "$shape" "$s" .latency_ms.p50)" \
				"$(round_ratio "$shape" "$s" .latency_ms.p99)" "$(round_ratios "$shape" "$s" .ok_per_s | tr '\n' ' ')"
			l=""
		done
	done
	echo "  calls/s: higher is better for okso; latency: lower is. Issue 34's target: raw HTTP, okso vs mcp-go >= 0.75"
	if has base; then
		echo "  server CPU per call, okso / base, all-in-one then fleet, of each round:"
		for shape in "${SHAPES[@]}"; do
			printf '    %-20s %s / %s\n' "$(label "$shape")" "$(round_ratios "$shape" base '.server_cpu_us_per_call[0]' | tr '\n' ' ')" \
				"$(round_ratios "$shape" base '.server_cpu_us_per_call[1]' | tr '\n' ' ')"
		done
	fi
fi
echo
echo "== calls, summed over the rounds (ok, then errors by code)"
for s in "${SERVERS[@]}"; do
	for shape in "${SHAPES[@]}"; do
		e=$(cat "$work/$shape-$s-"*.json 2>/dev/null | jq -rs '
			(map(.ok) | add) as $ok |
			(map(.errors // {} | to_entries[]) | group_by(.key) | map("\(.[0].key): \(map(.value) | add)") | join(", ")) as $e |
			"\($ok) ok" + (if $e == "" then ", no errors" else ", " + $e end)')
		printf '  %-8s %-6s %s\n' "$(server_name "$s")" "$shape" "$e"
	done
done
if [ -n "$PROFILE" ] && [ -s "$PROFILE" ]; then
	echo
	echo "== okso all-in-one's CPU profile over the measured time of its first ${SHAPES[0]} run ($PROFILE)"
	pprof_tops "$OKSO" "$PROFILE"
fi
if [ -n "$FLEET_PROFILE" ] && [ -s "$FLEET_PROFILE" ]; then
	echo
	echo "== the mock fleet's CPU profile over the same run ($FLEET_PROFILE)"
	pprof_tops "$OKSO" "$FLEET_PROFILE"
fi
echo
if has okso; then
	tools=$(cat "$work/${SHAPES[0]}-okso-"*.json 2>/dev/null | jq -rs 'map(.tools | tostring) | unique | join(",")')
	echo "  okso: all-in-one (gateway, tier, embedded NATS) pid $okso + mock-fleet of $NODES devices pid $fleet;"
	echo "        calls to 'sysecho.*' spread over $tools tools"
fi
has base && echo "  base: $BASE_OKSO, all-in-one pid $base + its own mock-fleet of $NODES devices pid $base_fleet"
has mcpgo && echo "  mcp-go: scripts/refserver-mcpgo (mcp-go $(go list -C scripts/refserver-mcpgo -m -f '{{.Version}}' github.com/mark3labs/mcp-go), stateless, JSON answers)"
has gosdk && echo "  go-sdk: scripts/refserver (go-sdk $(go list -m -f '{{.Version}}' github.com/modelcontextprotocol/go-sdk)): stateful with SSE answers in c1 and c64, stateless with JSON answers in raw64"
echo "  protocol ${PROTOCOL:-of the SDK client (its latest)} (raw64: ${PROTOCOL:-2025-11-25}); load generator: okso bench of this tree"
echo "  GOGC ${SERVER_GOGC:-unset (100)}, GOMAXPROCS ${SERVER_PROCS:-unset (okso adapts it to its load)} for every server;"
echo "  machine: $(nproc) cores, load avg $load_start before, $load_end after;"
echo "  the load generator, the servers and the fleet share the machine; all on 127.0.0.1"
exit "$status"
