# shellcheck shell=bash
# Shared by okso's load scripts (bench-compare.sh, federation-bench.sh, scale.sh,
# subscribe-load.sh): a work dir, background processes that are stopped on
# exit, logging and waiting for a log line. Source it after setting
#   NAME  the log prefix (e.g. scale)
#   KEEP  1 keeps the work dir even on success
# It sets work (the work dir), pids (append every background pid) and
# status (set it to 1 on failure: the work dir is then kept).

# The load scripts run several roles on one host, which would all want
# the default --metrics-addr; what they measure is not in it: off.
export OKSO_METRICS_ADDR=

log() { printf '[%s %s] %s\n' "$NAME" "$(date +%T)" "$*" >&2; }

alive() { kill -0 "$1" 2>/dev/null; }

work=$(mktemp -d "/tmp/okso-$NAME.XXXXXX")
pids=()
status=0

# cleanup stops every process in pids (TERM, up to 10 s, then KILL) and
# removes the work dir unless the run failed or KEEP=1.
cleanup() {
	local p
	for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
	for _ in $(seq 100); do
		local any=0
		for p in "${pids[@]}"; do alive "$p" && any=1; done
		[ $any = 0 ] && break
		sleep 0.1
	done
	for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
	wait 2>/dev/null
	if [ "$status" = 0 ] && [ "${KEEP:-0}" != 1 ]; then
		rm -rf "$work"
	else
		log "logs and results kept in $work"
	fi
}
trap cleanup EXIT
trap 'status=130; exit 130' INT TERM

# wait_for FILE PID PATTERN SECONDS: prints the first line of FILE matching
# PATTERN; fails when PID exits first or after SECONDS.
wait_for() {
	local f=$1 pid=$2 pat=$3 secs=$4 i line
	for ((i = 0; i < secs * 10; i++)); do
		line=$(grep -m1 -e "$pat" "$f" 2>/dev/null)
		[ -n "$line" ] && { echo "$line"; return 0; }
		alive "$pid" || { log "process $pid exited; last lines of $f:"; tail -5 "$f" >&2; return 1; }
		sleep 0.1
	done
	log "no line matching $pat in $f after ${secs}s"
	return 1
}

# cpu PID: the CPU time (user + system, clock ticks) the process has used
# (fields counted after the command name, which may hold spaces).
cpu() { sed 's/^.*) //' "/proc/$1/stat" 2>/dev/null | awk '{ print $12 + $13 }' || echo 0; }

# use_okso VAR: sets OKSO to the okso binary named by the environment
# variable VAR (an older build, say) or, when it is unset, builds bin/okso
# from the working tree.
use_okso() {
	local given=${!1:-}
	if [ -n "$given" ]; then
		OKSO=$(realpath "$given") && [ -x "$OKSO" ] || { echo "$1=$given: not an executable" >&2; exit 2; }
		log "okso is $OKSO ($1)"
	else
		log "building bin/okso"
		go build -o bin/okso . || exit 1
		OKSO=$PWD/bin/okso
	fi
}

# want_open_files N: raises the soft limit on open files to N if it is lower.
want_open_files() {
	[ "$(ulimit -n)" != unlimited ] && [ "$(ulimit -n)" -lt "$1" ] && ulimit -Sn "$1" 2>/dev/null
	return 0
}

# start_okso N TOOL [FLAGS...]: starts `okso all-in-one` ($OKSO, with FLAGS
# and, when set, the environment in the array okso_env) and a mock fleet
# of N devices in another process (with the flags in the array
# fleet_flags), and waits until the gateway lists N tools matching TOOL.
# Sets okso and fleet (pids), okso_url, tier_url and token, and exports
# OKSO_TOKEN.
start_okso() {
	local n=$1 tool=$2 i listed
	shift 2
	env "${okso_env[@]}" "$OKSO" all-in-one --mock 0 --local-agent=false --data-dir "$work/data" \
		--mcp-addr 127.0.0.1:0 --device-addr 127.0.0.1:0 --conn-rate-per-ip -1 "$@" \
		>"$work/okso.out" 2>"$work/okso.log" &
	okso=$!
	pids+=("$okso")
	wait_for "$work/okso.out" "$okso" '^  agent token  : ' 30 >/dev/null || return 1
	field() { sed -n "s/^  $1 *: //p" "$work/okso.out" | head -1; }
	okso_url=$(field "MCP endpoint")
	tier_url=$(field "device tier")
	token=$(field "agent token")
	log "okso all-in-one pid $okso: $okso_url, devices $tier_url"

	"$OKSO" mock-fleet -n "$n" --connect "$tier_url" --data-dir "$work/data" "${fleet_flags[@]}" \
		>"$work/fleet.out" 2>"$work/fleet.log" &
	fleet=$!
	pids+=("$fleet")
	wait_for "$work/fleet.log" "$fleet" '"msg":"mock devices connected"' 300 >/dev/null || return 1
	log "mock-fleet pid $fleet: $n devices connected"

	# The gateway lists a node once the registry says so: wait for all.
	export OKSO_TOKEN=$token
	for ((i = 0; ; i++)); do
		listed=$("$OKSO" bench --url "$okso_url" --mode list --tool "$tool" --concurrency 1 --sessions 1 \
			--duration 1s --warmup 0 --json 2>/dev/null | jq -r '.tools // 0')
		[ "${listed:-0}" -ge "$n" ] && break
		[ "$i" -ge 60 ] && { log "the gateway lists ${listed:-0} tools matching $tool, want $n"; return 1; }
		sleep 1
	done
	log "the gateway lists $listed tools matching $tool"
}
okso_env=()
fleet_flags=()

# start_nats DATA: builds nats-server (the version in okso's go.mod) into
# $work and starts it on 127.0.0.1 with JetStream and the accounts of
# `okso nats server-config` for the credentials in DATA, as a split
# deployment runs NATS: in a process of its own. Then makes okso's buckets
# as the admin (`okso nats init`). Sets nats (its pid, also in pids) and
# nats_url.
start_nats() {
	local data=$1 l
	log "building nats-server"
	go build -o "$work/nats-server" github.com/nats-io/nats-server/v2 || return 1
	"$OKSO" nats server-config --data-dir "$data" >"$work/nats-accounts.conf" || return 1
	"$OKSO" nats creds --data-dir "$data" --role admin >"$work/admin.nk" || return 1
	chmod 600 "$work/admin.nk"
	cat >"$work/nats.conf" <<-CONF
		listen: 127.0.0.1:-1
		jetstream: {store_dir: "$work/nats-js"}
		include nats-accounts.conf
	CONF
	"$work/nats-server" -c "$work/nats.conf" >"$work/nats.out" 2>"$work/nats.log" &
	nats=$!
	pids+=("$nats")
	l=$(wait_for "$work/nats.log" "$nats" 'Listening for client connections on' 30) || return 1
	nats_url=nats://$(sed 's/.*connections on //' <<<"$l")
	"$OKSO" nats init --nats-url "$nats_url" --nats-nkey "$work/admin.nk" >"$work/nats-init.out" 2>&1 ||
		{ log "okso nats init failed: $(tail -3 "$work/nats-init.out")"; return 1; }
	log "nats-server pid $nats: $nats_url"
}

# start_split DATA [TIER_FLAGS...]: starts `okso device` ($OKSO, with
# TIER_FLAGS) and `okso gateway` on the NATS at $nats_url when set
# (start_nats), else on one the tier embeds; both on 127.0.0.1 with the
# data dir DATA. Sets tier and gw (their pids, also in pids), nats_url,
# device_url and mcp_url. Fails when either does not say it listens
# within 30 s.
start_split() {
	local data=$1 l nats_flag=(--nats-listen 127.0.0.1:0)
	shift
	[ -n "${nats_url:-}" ] && nats_flag=(--nats-url "$nats_url")
	"$OKSO" device "${nats_flag[@]}" --device-addr 127.0.0.1:0 --data-dir "$data" --conn-rate-per-ip -1 \
		"$@" >"$work/device.out" 2>"$work/device.log" &
	tier=$!
	pids+=("$tier")
	l=$(wait_for "$work/device.log" "$tier" '"msg":"listening"' 30) || return 1
	[ -z "${nats_url:-}" ] && nats_url=$(jq -r .nats_url <<<"$l")
	device_url=$(jq -r .device_url <<<"$l")
	"$OKSO" gateway --nats-url "$nats_url" --mcp-addr 127.0.0.1:0 --data-dir "$data" \
		>"$work/gateway.out" 2>"$work/gateway.log" &
	gw=$!
	pids+=("$gw")
	l=$(wait_for "$work/gateway.log" "$gw" '"msg":"listening"' 30) || return 1
	mcp_url=$(jq -r .mcp_url <<<"$l")
}

# build_refs: builds the reference servers into $work: refserver (the
# official go-sdk, in okso's module) and refserver-mcpgo (mark3labs/mcp-go,
# a module of its own so that okso's go.mod does not gain it).
build_refs() {
	go build -o "$work/refserver" ./scripts/refserver || return 1
	go build -C scripts/refserver-mcpgo -o "$work/refserver-mcpgo" . || return 1
}

# start_ref NAME BINARY [ARGS...]: starts a reference server (with the
# environment in the array ref_env) on 127.0.0.1:0 and waits for its
# "... listening URL" line; sets ref_pid and ref_url and appends to pids.
start_ref() {
	local name=$1 line
	shift
	env "${ref_env[@]}" "$@" -addr 127.0.0.1:0 >"$work/$name.out" 2>"$work/$name.log" &
	ref_pid=$!
	pids+=("$ref_pid")
	line=$(wait_for "$work/$name.out" "$ref_pid" ' listening http' 10) || return 1
	ref_url=${line##* listening }
	log "$name pid $ref_pid: $ref_url"
}
ref_env=()

# pprof_tops BINARY PROFILE: the top 15 of a CPU profile, flat then
# cumulative.
pprof_tops() {
	echo "-- flat"
	go tool pprof -top -nodecount=15 "$1" "$2" 2>/dev/null | sed -n '/^ *flat/,$p'
	echo "-- cumulative"
	go tool pprof -top -cum -nodecount=15 "$1" "$2" 2>/dev/null | sed -n '/^ *flat/,$p'
}
