# Clawmesh. `make up` runs the stack, `make test` runs every test; both
# install what they need (pinned Go tools into bin/tools) by themselves.

GO        ?= go
BIN       := $(CURDIR)/bin
TOOLS     := $(BIN)/tools

# Pinned code generation: buf drives protoc-gen-go and protoc-gen-go-grpc at
# these versions; `make check-proto` fails when the committed code is stale.
BUF_VERSION                := v1.50.0
PROTOC_GEN_GO_VERSION      := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.6.2
# grpcurl 1.9.2 and 1.9.3 dial -unix addresses over TCP (their issues
# 496/546); 1.9.1 is the newest release whose -unix works.
GRPCURL_VERSION            := v1.9.1

.PHONY: all build up test test-short bench proto check-proto lint-proto tools grpcurl fmt vet plugins clean compose-test

all: build

# build compiles every binary the stack table (internal/stack) lists into
# bin/: the clawmesh CLI and one binary per process.
build:
	@mkdir -p $(BIN)
	@pkgs=$$($(GO) run ./internal/stack/list) || exit 1; \
	echo "building into $(BIN):" $$(for p in $$pkgs; do basename $$p; done); \
	$(GO) build -o $(BIN)/ $$pkgs

# up builds everything and runs the whole stack in the foreground on
# ~/.zeroclaw/data (or ZEROCLAW_CONFIG_DIR / ZEROCLAW_DATA_DIR). Extra
# launcher flags go in ARGS, e.g. make up ARGS="--scale plugin-sandbox=2".
up: build
	$(BIN)/clawmesh up $(ARGS)

# test is what CI runs: the generated code check, the proto lint,
# formatting, vet, and every test with the race detector (the suite starts
# its own PostgreSQL and NATS).
#
# go test starts the packages' runs in the order they are named (in the
# Go of go.mod, cmd/go holds each run until the one named before it has
# started), two at a time on CI's two cores. Named by ./... alone, services/pluginsandbox (about
# 290 s) and services/session (150 s) came 86th and 91st, after e2e
# (375 s) and every short package, and ran last; named first, the
# longest packages overlap each other and the short ones fill in behind
# them. ./... still names every package, once.
SLOW_TESTS := ./e2e ./services/pluginsandbox ./services/session ./gateway \
	./services/pluginsandbox/wasmhost ./gateway/jsonrpc
test: check-proto lint-proto vet fmt-check
	$(GO) test -race -count=1 -timeout 20m $(SLOW_TESTS) ./...

test-short:
	$(GO) test -count=1 -short ./...

# bench runs every benchmark and ends with one table: each figure, its
# baseline from the same run (echo server, bare NATS, discard socket, bare
# gRPC server, PostgreSQL alone, unmetered wasm), the ratio and the target
# (scripts/bench.sh, scripts/benchtable, docs/performance.md). About 7
# minutes on two cores, the build aside.
bench: build
	GO=$(GO) bash scripts/bench.sh

# vet builds with -race so that the packages it compiles are the ones the
# race tests reuse instead of compiling them again (a cold `make test` on
# two cores: 75 s less, vet 114 -> 149 s and the tests 530 -> 420 s).
vet:
	$(GO) vet -race ./...

fmt:
	gofmt -w $$(git ls-files '*.go' | grep -v '\.pb\.go$$')

fmt-check:
	@out=$$(gofmt -l $$(find . -name '*.go' -not -path './bin/*' -not -name '*.pb.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

tools: $(TOOLS)/.buf-$(BUF_VERSION) $(TOOLS)/.protoc-gen-go-$(PROTOC_GEN_GO_VERSION) $(TOOLS)/.protoc-gen-go-grpc-$(PROTOC_GEN_GO_GRPC_VERSION)

$(TOOLS)/.buf-$(BUF_VERSION):
	@mkdir -p $(TOOLS)
	GOBIN=$(TOOLS) GOFLAGS=-mod=mod $(GO) install github.com/bufbuild/buf/cmd/buf@$(BUF_VERSION)
	@touch $@

$(TOOLS)/.protoc-gen-go-$(PROTOC_GEN_GO_VERSION):
	@mkdir -p $(TOOLS)
	GOBIN=$(TOOLS) GOFLAGS=-mod=mod $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
	@touch $@

$(TOOLS)/.protoc-gen-go-grpc-$(PROTOC_GEN_GO_GRPC_VERSION):
	@mkdir -p $(TOOLS)
	GOBIN=$(TOOLS) GOFLAGS=-mod=mod $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)
	@touch $@

grpcurl:
	@mkdir -p $(TOOLS)
	GOBIN=$(TOOLS) GOFLAGS=-mod=mod $(GO) install github.com/fullstorydev/grpcurl/cmd/grpcurl@$(GRPCURL_VERSION)

proto: tools
	cd proto && $(TOOLS)/buf generate

# check-proto regenerates into a scratch folder and compares it with the
# committed code, so a stale .pb.go fails the build.
check-proto: tools
	@scratch=$$(mktemp -d); trap 'rm -rf $$scratch' EXIT; \
	cd proto && $(TOOLS)/buf generate -o $$scratch && \
	for f in $$(cd $$scratch && find . -name '*.go'); do \
		cmp -s $$scratch/$$f $$f || { echo "stale generated code: proto/$$f (run make proto)"; exit 1; }; \
	done; \
	for f in $$(find . -name '*.pb.go'); do \
		[ -f $$scratch/$$f ] || { echo "generated file without a proto: proto/$$f"; exit 1; }; \
	done; echo "generated code is up to date"

# lint-proto runs buf lint (the STANDARD rules) on the contracts.
lint-proto: tools
	cd proto && $(TOOLS)/buf lint

# plugins builds every example plugin into bin/plugins/<name>/ (plugin.wasm
# and manifest.toml), the layout of an installed plugin: copy a folder into
# <data_dir>/plugins/ (or plugins.plugins_dir) to install it.
plugins:
	@for d in plugins/examples/*/; do \
		name=$$(basename $$d); out=$(BIN)/plugins/$$name; \
		mkdir -p $$out || exit 1; \
		echo "plugin $$name -> $$out"; \
		GOOS=wasip1 GOARCH=wasm $(GO) build -buildmode=c-shared -o $$out/plugin.wasm ./$$d || exit 1; \
		cp $$d/manifest.toml $$out/manifest.toml || exit 1; \
	done

# compose-test is the docker-compose.yml smoke test (not part of test): it
# starts dockerd if none runs, stands the base images in from Debian's
# packages when the registry cannot be reached, brings the stack up, runs
# a turn with a tool call from the host through the socket, scales the
# sandbox to 3, stops one replica mid-traffic, and tears everything down.
compose-test:
	bash scripts/compose-test.sh

clean:
	rm -rf $(BIN)
