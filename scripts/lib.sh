# shellcheck shell=bash
# Shared by okso's load scripts (bench-compare.sh, scale.sh,
# subscribe-load.sh): a work dir, background processes that are stopped on
# exit, logging and waiting for a log line. Source it after setting
#   NAME  the log prefix (e.g. scale)
#   KEEP  1 keeps the work dir even on success
# It sets work (the work dir), pids (append every background pid) and
# status (set it to 1 on failure: the work dir is then kept).

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
