#!/bin/sh
# mcp_echo.sh: the reference endpoint of okso's action protocol (seed 002,
# DESIGN.md §9.2), and what its tests federate. One JSON object on stdin,
# one on stdout:
#
#   echo '{"action":"list_tools"}' | scripts/mcp_echo.sh
#   echo '{"action":"describe_tool","tool":"echo_external"}' | scripts/mcp_echo.sh
#   echo '{"action":"call_tool","tool":"echo_external","arguments":{"message":"hi"}}' | scripts/mcp_echo.sh
#
# One tool, echo_external: {message: string} -> {"echo": message}, as
# {"type":"result","tool":"echo_external","result":{"echo":"hi"}}. A
# request it cannot serve is answered
# {"type":"error","error":{"name":"mcp_echo","category":"usage","message":...}},
# with exit status 0: the error is its answer, not a failure of its own.
#
# It uses jq when jq is on PATH, and otherwise only POSIX sh and awk, which
# every Debian has (CI images may lack jq).
set -u
LC_ALL=C
export LC_ALL

ECHO_TOOL='{"name":"echo_external","description":"Echoes a message back.","command":"scripts/mcp_echo.sh","origin":"local","safety":"read-only: no side effects, nothing kept","input_schema":{"type":"object","properties":{"message":{"type":"string"}},"required":["message"],"additionalProperties":false},"result_schema":{"type":"object","properties":{"echo":{"type":"string"}},"required":["echo"],"additionalProperties":false}}'
export ECHO_TOOL

# error MESSAGE: the error reply (MESSAGE is ours: plain ASCII, no quotes).
error() {
	printf '{"type":"error","error":{"name":"mcp_echo","category":"usage","message":"%s"}}\n' "$1"
	exit 0
}

req=$(cat) || error "the request could not be read"

if command -v jq >/dev/null 2>&1; then
	# -s: the whole input is parsed before anything is printed, so a second
	# object or trailing garbage is seen, and a parse error prints nothing.
	printf '%s' "$req" | jq -c -s --argjson d "$ECHO_TOOL" '
		def err(m): {type: "error", error: {name: "mcp_echo", category: "usage", message: m}};
		if length != 1 or (.[0] | type) != "object" then err("the request is not one JSON object")
		else .[0] |
			if .action == "list_tools" then {type: "result", tools: [$d]}
			elif .action == "describe_tool" then
				if .tool == "echo_external" then {type: "result", tool: $d} else err("unknown tool") end
			elif .action == "call_tool" then
				if .tool != "echo_external" then err("unknown tool")
				elif (.arguments | type) != "object" then err("arguments must be a JSON object")
				elif (.arguments.message | type) != "string" then err("argument message must be a string")
				else {type: "result", tool: "echo_external", result: {echo: .arguments.message}}
				end
			else err("unknown action")
			end
		end' 2>/dev/null && exit 0
	error "the request is not JSON"
fi

# Without jq: a JSON parser in POSIX awk. It checks that the request is
# one well-formed JSON object, notes the type of every value by its path
# (/arguments/message) and the raw text of every string, and answers. A
# string's raw text, escapes and all, is valid JSON string text, so the
# message is echoed as it came.
printf '%s' "$req" | awk '
function fail(m) { if (!failed) why = m; failed = 1; pos = len + 1 }
function ws() { while (pos <= len && index(" \t\r\n", substr(s, pos, 1)) > 0) pos++ }
function str(   start, c, out) {
	start = ++pos
	while (pos <= len) {
		c = substr(s, pos, 1)
		if (c == "\"") { out = substr(s, start, pos - start); pos++; return out }
		if (c < " ") { fail("a control character in a string"); return "" }
		if (c == "\\") {
			c = substr(s, pos + 1, 1)
			if (c == "u") {
				if (substr(s, pos + 2, 4) !~ /^[0-9A-Fa-f][0-9A-Fa-f][0-9A-Fa-f][0-9A-Fa-f]$/) { fail("a bad escape"); return "" }
				pos += 6
			} else if (index("\"\\/bfnrt", c) > 0) {
				pos += 2
			} else { fail("a bad escape"); return "" }
			continue
		}
		pos++
	}
	fail("an unterminated string")
	return ""
}
function value(path,   c, key) {
	ws()
	if (pos > len) { fail("a missing value"); return }
	c = substr(s, pos, 1)
	if (c == "{") {
		type[path] = "object"; pos++; ws()
		if (substr(s, pos, 1) == "}") { pos++; return }
		for (;;) {
			ws()
			if (substr(s, pos, 1) != "\"") { fail("a bad key"); return }
			key = str(); ws()
			if (substr(s, pos, 1) != ":") { fail("a missing colon"); return }
			pos++
			value(path "/" key)
			if (failed) return
			ws(); c = substr(s, pos, 1); pos++
			if (c == "}") return
			if (c != ",") { fail("a missing comma"); return }
		}
	}
	if (c == "[") {
		type[path] = "array"; pos++; ws()
		if (substr(s, pos, 1) == "]") { pos++; return }
		for (;;) {
			value(path "/[]")
			if (failed) return
			ws(); c = substr(s, pos, 1); pos++
			if (c == "]") return
			if (c != ",") { fail("a missing comma"); return }
		}
	}
	if (c == "\"") { type[path] = "string"; raw[path] = str(); return }
	if (match(substr(s, pos), /^(true|false|null|-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?)/)) {
		type[path] = "scalar"; pos += RLENGTH; return
	}
	fail("a bad value")
}
function err(m) { printf "{\"type\":\"error\",\"error\":{\"name\":\"mcp_echo\",\"category\":\"usage\",\"message\":\"%s\"}}\n", m; exit 0 }
{ s = (NR == 1) ? $0 : s "\n" $0 }
END {
	len = length(s); pos = 1
	value("")
	ws()
	if (!failed && pos <= len) fail("more after the object")
	if (failed) err("the request is not JSON: " why)
	if (type[""] != "object") err("the request is not one JSON object")
	d = ENVIRON["ECHO_TOOL"]
	action = (type["/action"] == "string") ? raw["/action"] : ""
	tool = (type["/tool"] == "string") ? raw["/tool"] : ""
	if (action == "list_tools") { printf "{\"type\":\"result\",\"tools\":[%s]}\n", d; exit 0 }
	if (action == "describe_tool") {
		if (tool != "echo_external") err("unknown tool")
		printf "{\"type\":\"result\",\"tool\":%s}\n", d; exit 0
	}
	if (action == "call_tool") {
		if (tool != "echo_external") err("unknown tool")
		if (type["/arguments"] != "object") err("arguments must be a JSON object")
		if (type["/arguments/message"] != "string") err("argument message must be a string")
		printf "{\"type\":\"result\",\"tool\":\"echo_external\",\"result\":{\"echo\":\"%s\"}}\n", raw["/arguments/message"]
		exit 0
	}
	err("unknown action")
}'
