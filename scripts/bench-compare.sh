#!/usr/bin/env bash
# Side-by-side benchmark (issue 6): okso against the simplest alternative,
# a bare go-sdk Streamable HTTP echo server (scripts/refserver), on the same
# machine in the same run, both driven by `okso bench` in alternation
# (okso, reference, okso, reference, ...) for BENCH_ROUNDS rounds, at one
# call in flight (1 session) and at 64 in flight (8 sessions).
#
# okso is `okso all-in-one --mock 0 --local-agent=false` with a fleet of
# BENCH_NODES mock devices in a separate `okso mock-fleet` process; its calls
# go to 'sysecho.*', spread round-robin over every node (each node allows 10
# calls/s and 4 in flight). The reference's calls go to its one echo tool.
# Everything runs on 127.0.0.1; every process is stopped at the end.
#
# Usage: scripts/bench-compare.sh          (make bench-compare)
# Environment:
#   BENCH_DURATION     measured time of each run (10s)
#   BENCH_WARMUP       warm-up of each run, not counted (2s)
#   BENCH_ROUNDS       rounds (3; at least 3)
#   BENCH_NODES        mock devices (1000)
#   BENCH_SHAPES       which shapes to run: c1 (1 in flight), c64 (64 in
#                      flight over 8 sessions), or both ("c1 c64", the default)
#   BENCH_PROTOCOL     MCP protocol version both are driven with (2025-11-25,
#                      the newest the SDK's default stateful server speaks;
#                      empty: the SDK client's latest, which each server
#                      may negotiate down)
#   BENCH_OKSO_FLAGS   extra flags for okso all-in-one (e.g. --log-level warn)
#   GOGC, GOMAXPROCS   given to okso all-in-one and the reference alike
#                      (unset: Go's defaults for both; okso then adapts
#                      GOMAXPROCS to its load, see --adaptive-procs); the
#                      mock fleet and the load generator run at Go's defaults
#   BENCH_KEEP         1: keep the work dir (logs, each run's JSON)
#   BENCH_OKSO         an okso binary to run instead of building bin/okso
#                      (an older build, say, against the same reference)
# Prints a table of medians over the rounds: calls/s, p50, p99 of each and
# okso/reference ratios, then okso's errors by code. Exit status 0 when
# every run completed, 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."

DURATION=${BENCH_DURATION:-10s}
WARMUP=${BENCH_WARMUP:-2s}
ROUNDS=${BENCH_ROUNDS:-3}
NODES=${BENCH_NODES:-1000}
read -r -a SHAPES <<<"${BENCH_SHAPES:-c1 c64}"
for shape in "${SHAPES[@]}"; do
	case $shape in c1 | c64) ;; *) echo "BENCH_SHAPES: $shape: want c1 or c64" >&2; exit 2 ;; esac
done
PROTOCOL=${BENCH_PROTOCOL-2025-11-25}
read -r -a OKSO_FLAGS <<<"${BENCH_OKSO_FLAGS:-}"
SERVER_GOGC=${GOGC:-}
SERVER_PROCS=${GOMAXPROCS:-}
unset GOGC GOMAXPROCS # only the two servers get them
case $ROUNDS in '' | *[!0-9]*) echo "BENCH_ROUNDS=$ROUNDS: want a number" >&2; exit 2 ;; esac
[ "$ROUNDS" -lt 3 ] && { echo "BENCH_ROUNDS=$ROUNDS: want at least 3" >&2; exit 2; }
command -v jq >/dev/null || { echo "bench-compare needs jq" >&2; exit 2; }

NAME=bench-compare KEEP=${BENCH_KEEP:-0}
. scripts/lib.sh

# --- build ---------------------------------------------------------------------------
use_okso BENCH_OKSO
go build -o "$work/refserver" ./scripts/refserver || exit 1
want_open_files $((NODES + NODES / 4 + 4096))

server_env=()
[ -n "$SERVER_GOGC" ] && server_env+=("GOGC=$SERVER_GOGC")
[ -n "$SERVER_PROCS" ] && server_env+=("GOMAXPROCS=$SERVER_PROCS")

# --- okso: all-in-one, then the fleet ----------------------------------------------------
okso_env=("${server_env[@]}")
start_okso "$NODES" 'sysecho.*' "${OKSO_FLAGS[@]}" || { status=1; exit 1; }

# --- the reference ----------------------------------------------------------------------
env "${server_env[@]}" "$work/refserver" -addr 127.0.0.1:0 >"$work/ref.out" 2>"$work/ref.log" &
ref=$!
pids+=("$ref")
ref_url=$(wait_for "$work/ref.out" "$ref" '^refserver listening ' 10 | sed 's/^refserver listening //') || { status=1; exit 1; }
log "reference pid $ref: $ref_url"

# --- the runs ---------------------------------------------------------------------------
# run NAME SETTING ROUND ARGS...: one okso bench run, its JSON in $work.
run() {
	local name=$1 setting=$2 round=$3 out b pids_cpu p before=() i
	shift 3
	out=$work/$setting-$name-$round.json
	log "round $round/$ROUNDS, $setting, $name"
	case $name in okso) pids_cpu=("$okso" "$fleet") ;; *) pids_cpu=("$ref") ;; esac
	for p in "${pids_cpu[@]}"; do before+=("$(cpu "$p")"); done
	"$OKSO" bench --duration "$DURATION" --warmup "$WARMUP" --protocol "$PROTOCOL" --json "$@" >"$out" 2>"$work/$setting-$name-$round.progress" &
	b=$!
	if ! wait "$b"; then
		log "run failed: $(tail -3 "$work/$setting-$name-$round.progress")"
		status=1
	fi
	# CPU per call of each server process, over warm-up and run alike
	# (calls counted: the measured ones scaled by (warm-up + run) / run).
	local spent=()
	for i in "${!pids_cpu[@]}"; do spent+=($(($(cpu "${pids_cpu[$i]}") - before[i]))); done
	jq --arg spent "${spent[*]}" --arg hz "$(getconf CLK_TCK)" --arg warm "$WARMUP" --arg dur "$DURATION" '
		def secs: if test("ms$") then (.[:-2] | tonumber) / 1000 elif test("s$") then .[:-1] | tonumber else 0 end;
		(.ok * (($warm | secs) + ($dur | secs)) / ($dur | secs)) as $calls |
		. + {server_cpu_us_per_call: ($spent | split(" ") | map(tonumber * 1e6 / ($hz | tonumber) / ($calls + 1e-9) | floor))}' \
		"$out" >"$out.tmp" && mv "$out.tmp" "$out"
	jq -r '"  \(.ok_per_s | floor) ok/s, p50 \(.latency_ms.p50)ms, p99 \(.latency_ms.p99)ms, errors \(.errors), server CPU µs/call \(.server_cpu_us_per_call)"' "$out" >&2 2>/dev/null
}
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
for ((round = 1; round <= ROUNDS; round++)); do
	for setting in "${SHAPES[@]}"; do
		case $setting in
		c1) shape=(--concurrency 1 --sessions 1) ;;
		c64) shape=(--concurrency 64 --sessions 8) ;;
		esac
		run okso "$setting" "$round" --url "$okso_url" --tool 'sysecho.*' "${shape[@]}"
		OKSO_TOKEN= run reference "$setting" "$round" --url "$ref_url" --tool echo "${shape[@]}"
	done
done
load_end=$(cut -d' ' -f1-3 /proc/loadavg)
for pair in "okso all-in-one:$okso" "mock-fleet:$fleet" "reference:$ref"; do
	alive "${pair##*:}" || { status=1; log "DIED during the runs: ${pair%%:*}"; }
done

# --- the table --------------------------------------------------------------------------
# median SETTING NAME JQPATH: the median of JQPATH over the rounds.
median() {
	cat "$work/$1-$2-"*.json 2>/dev/null | jq -s "[.[] | $3 // empty] | sort |
		if length == 0 then null elif length % 2 == 1 then .[length/2|floor]
		else (.[length/2-1] + .[length/2]) / 2 end"
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{ if (a == "null" || b == "null" || b == 0) print "-"; else printf "%.2f", a/b }'; }
num() { awk -v v="$1" -v f="$2" 'BEGIN{ if (v == "null") print "-"; else printf f, v }'; }
# round_ratios SETTING JQPATH: okso / reference of JQPATH, round by round.
round_ratios() {
	local r o f
	for ((r = 1; r <= ROUNDS; r++)); do
		o=$(jq "$2 // null" "$work/$1-okso-$r.json" 2>/dev/null)
		f=$(jq "$2 // null" "$work/$1-reference-$r.json" 2>/dev/null)
		ratio "${o:-null}" "${f:-null}"
		echo
	done
}
# round_ratio SETTING JQPATH: the median of round_ratios.
round_ratio() {
	round_ratios "$1" "$2" | grep -v '^-$' | sort -n | awk '{ v[NR] = $1 } END {
		if (NR == 0) print "-"; else if (NR % 2) printf "%.2f", v[(NR + 1) / 2]; else printf "%.2f", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

echo
echo "== okso vs. a bare go-sdk echo server: medians over $ROUNDS rounds (${DURATION} each after ${WARMUP} warm-up)"
printf '%-22s %12s %12s %8s   %9s %9s %6s   %9s %9s %6s\n' "" "okso calls/s" "ref calls/s" "ratio" \
	"okso p50" "ref p50" "ratio" "okso p99" "ref p99" "ratio"
for setting in "${SHAPES[@]}"; do
	case $setting in
	c1) label="1 in flight, 1 sess" ;;
	c64) label="64 in flight, 8 sess" ;;
	esac
	oc=$(median $setting okso .ok_per_s)
	rc=$(median $setting reference .ok_per_s)
	o50=$(median $setting okso .latency_ms.p50)
	r50=$(median $setting reference .latency_ms.p50)
	o99=$(median $setting okso .latency_ms.p99)
	r99=$(median $setting reference .latency_ms.p99)
	printf '%-22s %12s %12s %8s   %9s %9s %6s   %9s %9s %6s\n' "$label" \
		"$(num "$oc" %.0f)" "$(num "$rc" %.0f)" "$(ratio "$oc" "$rc")" \
		"$(num "$o50" %.3fms)" "$(num "$r50" %.3fms)" "$(ratio "$o50" "$r50")" \
		"$(num "$o99" %.2fms)" "$(num "$r99" %.2fms)" "$(ratio "$o99" "$r99")"
done
echo "  ratio = okso / reference (calls/s: higher is better for okso; latency: lower is)"
echo
echo "== the median of each round's ratio (okso and the reference run back to back in a round,"
echo "   so a machine whose speed drifts during the run weighs on both sides of each ratio alike)"
printf '%-22s %8s %8s %8s   %s\n' "" "calls/s" "p50" "p99" "p50 ratio of each round"
for setting in "${SHAPES[@]}"; do
	case $setting in
	c1) label="1 in flight, 1 sess" ;;
	c64) label="64 in flight, 8 sess" ;;
	esac
	printf '%-22s %8s %8s %8s   %s\n' "$label" "$(round_ratio "$setting" .ok_per_s)" \
		"$(round_ratio "$setting" .latency_ms.p50)" "$(round_ratio "$setting" .latency_ms.p99)" \
		"$(round_ratios "$setting" .latency_ms.p50 | tr '\n' ' ')"
done
echo
echo "== errors, summed over the rounds (code: count)"
for name in okso reference; do
	for setting in "${SHAPES[@]}"; do
		e=$(cat "$work/$setting-$name-"*.json 2>/dev/null | jq -rs '
			(map(.ok) | add) as $ok |
			(map(.errors // {} | to_entries[]) | group_by(.key) | map("\(.[0].key): \(map(.value) | add)") | join(", ")) as $e |
			"\($ok) ok" + (if $e == "" then ", no errors" else ", " + $e end)')
		printf '  %-10s %-4s %s\n' "$name" "$setting" "$e"
	done
done
tools=$(cat "$work/${SHAPES[0]}-okso-"*.json 2>/dev/null | jq -rs 'map(.tools | tostring) | unique | join(",")')
echo
echo "  okso: all-in-one (gateway, tier, embedded NATS) pid $okso + mock-fleet of $NODES devices pid $fleet;"
echo "        calls to 'sysecho.*' spread over $tools tools; protocol $(jq -r .protocol "$work/${SHAPES[0]}-okso-1.json" 2>/dev/null)"
echo "  reference: scripts/refserver (go-sdk $(go list -m -f '{{.Version}}' github.com/modelcontextprotocol/go-sdk), stateful, SSE responses); protocol $(jq -r .protocol "$work/${SHAPES[0]}-reference-1.json" 2>/dev/null)"
echo "  GOGC ${SERVER_GOGC:-unset (100)}, GOMAXPROCS ${SERVER_PROCS:-unset (okso adapts it to its load)} for both servers;"
echo "  machine: $(nproc) cores, load avg $load_start before, $load_end after;"
echo "  the load generator, both servers and the fleet share the machine; all on 127.0.0.1"
exit "$status"
