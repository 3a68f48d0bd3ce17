#!/usr/bin/env bash
# federation-bench: a bare MCP echo server over Streamable HTTP
# (scripts/refserver, the official Go SDK) called directly, and through
# okso (all-in-one --remotes: the gateway's auth, validation and audit,
# NATS, the remote tier, its HTTP client), by the same load generator
# (okso bench), alternating, at 1 and 64 in flight. Prints the medians
# over the rounds and, for each shape, the median of each round's ratio.
#
# Environment:
#   BENCH_DURATION  measured time of each run (10s)
#   BENCH_WARMUP    warm-up of each run, not counted (2s)
#   BENCH_ROUNDS    rounds (3)
#   BENCH_OKSO      an okso binary to run instead of building bin/okso
#   BENCH_KEEP      1: keep the work dir
set -u
cd "$(dirname "$0")/.."
DURATION=${BENCH_DURATION:-10s}
WARMUP=${BENCH_WARMUP:-2s}
ROUNDS=${BENCH_ROUNDS:-3}
command -v jq >/dev/null || { echo "federation-bench needs jq" >&2; exit 2; }

NAME=federation-bench KEEP=${BENCH_KEEP:-0}
. scripts/lib.sh

use_okso BENCH_OKSO
go build -o "$work/refserver" ./scripts/refserver || exit 1

# --- the upstream -----------------------------------------------------------------------
"$work/refserver" -addr 127.0.0.1:0 >"$work/ref.out" 2>"$work/ref.log" &
ref=$!
pids+=("$ref")
ref_url=$(wait_for "$work/ref.out" "$ref" '^refserver listening ' 10 | sed 's/^refserver listening //') || { status=1; exit 1; }
log "upstream pid $ref: $ref_url"

# --- okso, federating it ----------------------------------------------------------------
cat >"$work/remotes.yaml" <<EOF
upstreams:
  - name: ref
    transport: http
    url: $ref_url
    tenants: [demo]
    allow: [echo]
    safety: {echo: read_only}
    idempotent: [echo]
EOF
"$OKSO" all-in-one --mock 0 --local-agent=false --data-dir "$work/data" --mcp-addr 127.0.0.1:0 \
	--device-addr 127.0.0.1:0 --remotes "$work/remotes.yaml" >"$work/okso.out" 2>"$work/okso.log" &
okso=$!
pids+=("$okso")
wait_for "$work/okso.out" "$okso" '^  agent token  : ' 30 >/dev/null || { status=1; exit 1; }
field() { sed -n "s/^  $1 *: //p" "$work/okso.out" | head -1; }
okso_url=$(field "MCP endpoint")
token=$(field "agent token")
for ((i = 0; ; i++)); do
	listed=$(OKSO_TOKEN=$token "$OKSO" bench --url "$okso_url" --mode list --tool ref.echo --concurrency 1 --sessions 1 \
		--duration 1s --warmup 0 --json 2>/dev/null | jq -r '.tools // 0')
	[ "${listed:-0}" -ge 1 ] && break
	[ "$i" -ge 30 ] && { log "the gateway never listed ref.echo"; status=1; exit 1; }
	sleep 1
done
log "okso pid $okso: $okso_url lists ref.echo"

# --- the runs ---------------------------------------------------------------------------
run() {
	local name=$1 shape=$2 round=$3
	shift 3
	log "round $round/$ROUNDS, $shape, $name"
	if ! "$OKSO" bench --duration "$DURATION" --warmup "$WARMUP" --json "$@" \
		>"$work/$shape-$name-$round.json" 2>"$work/$shape-$name-$round.progress"; then
		log "run failed: $(tail -3 "$work/$shape-$name-$round.progress")"
		status=1
	fi
	jq -r '"  \(.ok_per_s | floor) ok/s, p50 \(.latency_ms.p50)ms, errors \(.errors)"' "$work/$shape-$name-$round.json" >&2 2>/dev/null
}
for ((round = 1; round <= ROUNDS; round++)); do
	for shape in c1 c64; do
		case $shape in
		c1) args=(--concurrency 1 --sessions 1) ;;
		c64) args=(--concurrency 64 --sessions 8) ;;
		esac
		OKSO_TOKEN=$token run okso "$shape" "$round" --url "$okso_url" --tool ref.echo "${args[@]}"
		OKSO_TOKEN= run direct "$shape" "$round" --url "$ref_url" --tool echo "${args[@]}"
	done
done

# --- the table --------------------------------------------------------------------------
median() { cat "$work/$1-$2-"*.json 2>/dev/null | jq -s "[.[] | $3 // empty] | sort | if length == 0 then null else .[length/2|floor] end"; }
round_ratio() { # SHAPE JQPATH: the median over the rounds of okso/direct
	local r out=()
	for ((r = 1; r <= ROUNDS; r++)); do
		out+=("$(jq -n --slurpfile a "$work/$1-okso-$r.json" --slurpfile b "$work/$1-direct-$r.json" \
			"(\$a[0] | $2) / (\$b[0] | $2)" 2>/dev/null)")
	done
	printf '%s\n' "${out[@]}" | sort -g | awk '{ v[NR] = $1 } END { if (NR) printf "%.2f", v[int((NR+1)/2)] }'
}
echo
echo "== okso (all-in-one --remotes, HTTP upstream) vs. the same upstream called directly: medians over $ROUNDS rounds ($DURATION each)"
printf '%-22s %12s %12s %8s %12s %12s %10s\n' "" "okso calls/s" "direct" "ratio" "okso p50" "direct p50" "p50 diff"
for shape in c1 c64; do
	o=$(median "$shape" okso .ok_per_s) d=$(median "$shape" direct .ok_per_s)
	op=$(median "$shape" okso .latency_ms.p50) dp=$(median "$shape" direct .latency_ms.p50)
	case $shape in c1) label="1 in flight, 1 sess" ;; c64) label="64 in flight, 8 sess" ;; esac
	printf '%-22s %12.0f %12.0f %8s %10.3fms %10.3fms %8.3fms\n' "$label" "$o" "$d" "$(round_ratio "$shape" .ok_per_s)" \
		"$op" "$dp" "$(awk -v a="$op" -v b="$dp" 'BEGIN{ print a-b }')"
done
echo "  ratio = the median of each round's okso/direct calls/s (target at 64 in flight: >= 0.45);"
echo "  p50 diff = okso's p50 - direct p50 at the medians (target at 1 in flight: <= 0.5 ms)"
echo "  machine: $(nproc) cores, load avg $(cut -d' ' -f1-3 /proc/loadavg); all processes share it, on 127.0.0.1"
