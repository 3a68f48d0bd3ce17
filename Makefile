# okso developer interface. `make test` is what CI runs.
GO        ?= go
BIN       ?= bin/okso
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -s -w -X github.com/okso-io/okso/roles.Version=$(VERSION)
FUZZTIME  ?= 30s

.PHONY: all build test test-short test-interop interop-deps lint fmt run fuzz fuzz-ci clean docker bench

all: build

## build: a static okso binary in bin/
build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN) .

## test: vet, then every test with the race detector (interop-deps first: package interop runs real MCP clients)
test: interop-deps
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout 15m ./...

## test-interop: only okso against the MCP clients it did not write (TS SDK, MCP Inspector, conformance suite)
test-interop: interop-deps
	$(GO) test -race -count=1 -timeout 10m -v ./interop

## interop-deps: the pinned Node packages of interop/ (npm ci, only when its package-lock.json changed)
interop-deps:
	./scripts/interop-deps.sh

## test-short: the unit tests only (skips the ones that build the binary)
test-short:
	$(GO) test -short -count=1 ./...

## lint: gofmt, go vet and staticcheck (a pinned version, fetched from the module proxy on first use; CI runs it)
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2
lint:
	@test -z "$$(gofmt -l .)" || (echo "gofmt would change:"; gofmt -l .; exit 1)
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...

fmt:
	gofmt -w .

## run: all-in-one with 3 mock devices
run: build
	$(BIN) all-in-one

## bench: the Go micro-benchmarks of the hot path (envelope, name, schemas, NATS hop, the gateway fast path, a tools/list page)
bench:
	$(GO) test -run '^$$' -bench . -benchmem ./bus ./device/... ./schemas ./mcp

## fuzz: every fuzz target for FUZZTIME each (make fuzz FUZZTIME=5m)
fuzz:
	./scripts/fuzz.sh $(FUZZTIME)

## fuzz-ci: every fuzz target, briefly: a count of executions, not a time (go1.26's fuzz coordinator can
## fail a target with "context deadline exceeded" at the end of a -fuzztime duration, golang/go#75804)
fuzz-ci:
	./scripts/fuzz.sh 20000x

## docker: the container image (needs a Docker engine; see deploy/README.md)
docker:
	docker build --build-arg VERSION=$(VERSION) -t okso:$(VERSION) .

clean:
	rm -rf bin

## scale: N simulated devices (default 10000) on device tiers (as many as the open-files limit needs), a gateway and a nats-server of its own: connect time, RSS per connection and per node, idle CPU of every process, list + call every node (make scale N=1000, N=50000)
.PHONY: scale
scale:
	./scripts/scale.sh $(N)

## idle-allinone: the CPU and RSS that N idle mock devices (default 10000) cost okso all-in-one, with and without what it takes with none (make idle-allinone N=3000)
.PHONY: idle-allinone
idle-allinone:
	./scripts/idle-allinone.sh $(N)

## gateway-memory: the gateway's RSS and live heap per node with N mock devices (default 5000), and where the heap grew (make gateway-memory N=5000)
.PHONY: gateway-memory
gateway-memory:
	./scripts/gateway-memory.sh $(N)

## fleet-bench: fleet.call of system.echo over N mock devices (default 10000) next to the same calls made one by one by okso bench, and the p50 of fleet.nodes (a page of 1,000) and okso.find_tools (make fleet-bench N=1000)
.PHONY: fleet-bench
fleet-bench:
	./scripts/fleet-bench.sh $(N)

## bench-compare: okso (all-in-one + a 3,000-device mock fleet) against bare mcp-go and go-sdk echo servers, alternating, with okso bench: raw HTTP at 64 connections, answers checked (issue 34: >= 0.75x mcp-go), and 64 and 1 in flight over MCP sessions (BENCH_DURATION=10s BENCH_ROUNDS=3 BENCH_SHAPES BENCH_PROFILE=file; GOGC goes to every server)
.PHONY: bench-compare
bench-compare:
	./scripts/bench-compare.sh

## federation-bench: bare mcp-go and go-sdk echo servers over Streamable HTTP called directly, through okso (all-in-one --remotes) and through TBXark/mcp-proxy when PEER_PROXY (../mcp-proxy) holds its source or binary, alternating: raw HTTP at 64 connections, answers checked (issue 34: okso >= 1.5x the peer), 64 and 1 in flight (BENCH_DURATION=10s BENCH_ROUNDS=3 BENCH_SHAPES BENCH_UPSTREAMS BENCH_PROFILE=file)
.PHONY: federation-bench
federation-bench:
	./scripts/federation-bench.sh

## relay-bench: the caller-tool relay across two gateway replicas on one NATS (a Go SDK listener on one answering at once, a Go SDK caller on the other): calls/s at 64 in flight, p50/p99 at 1, goroutines and heap before and after RELAY_CALLS (100000) relayed calls, CPU per relayed call and profile tops of both gateways and the load (BENCH_DURATION=10s RELAY_ANSWER=1|2 RELAY_GC_PERCENT=1600)
.PHONY: relay-bench
relay-bench:
	./scripts/relay-bench.sh

## subscribe-load: CPU of okso all-in-one holding N metric streams (default 1000, one per mock device in another process) at INTERVAL_MS (1000) for DURATION (30s), driven by okso bench --mode subscribe; PASS under half a core
.PHONY: subscribe-load
subscribe-load:
	SUBSCRIBE_N=$(N) SUBSCRIBE_DURATION=$(DURATION) SUBSCRIBE_INTERVAL_MS=$(INTERVAL_MS) ./scripts/subscribe-load.sh

## latency-path: where a call's time goes at one call in flight: Go traces of all-in-one and a 1,000-device mock fleet, merged on their common clock and split into the segments of the path (scripts/pathtrace)
.PHONY: latency-path
latency-path:
	./scripts/latency-path.sh

## telemetry-cost: what metrics and tracing (off) cost a call: BenchmarkFastPath and BenchmarkCallPath at REF (333afd1^, before either) and the working tree in turn, ROUNDS (6) rounds, compared by benchstat (ns/op, allocs/op)
.PHONY: telemetry-cost
telemetry-cost:
	./scripts/telemetry-cost.sh $(or $(REF),333afd1^) $(or $(ROUNDS),6)

## latency-compare: make latency-path for REF (a git revision) and the working tree in turn, ROUNDS (3) rounds, medians side by side (make latency-compare REF=HEAD~3)
.PHONY: latency-compare
latency-compare:
	./scripts/latency-compare.sh $(REF) $(or $(ROUNDS),3)

## bounds-bench: the worst schema each bound on foreign schemas admits, against {} and against the largest value it checks (schemas/bounds.go)
.PHONY: bounds-bench
bounds-bench:
	$(GO) test -run '^$$' -bench 'BoundsWorst|CompileBomb' -benchtime 10x -count 3 ./schemas
