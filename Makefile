# Fairshare Makefile. `make help` lists the targets.
#
# Everything it needs is built from pinned Go modules into ./bin (hack/bin-tools.sh): the
# real control plane (kube-apiserver, etcd), controller-gen and helm. Cold, the first run
# spends about 16 minutes building them on 2 cores (9 to 10 of them on kube-apiserver);
# afterwards they are cached.

SHELL := /usr/bin/env bash -o pipefail
.SHELLFLAGS := -ec
ROOT := $(shell pwd)
BIN := $(ROOT)/bin
export KUBEBUILDER_ASSETS := $(BIN)
export PATH := $(BIN):$(PATH)
GO ?= go
CONTROLLER_GEN := $(BIN)/controller-gen
HELM := $(BIN)/helm
# Bounded fuzzing per target inside `make test`: an execution count, not a duration, so that a
# loaded CI machine cannot turn the fuzzing deadline into a spurious failure.
FUZZTIME ?= 200000x

.PHONY: all
all: build

##@ General

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"; printf "Usage: make <target>\n"} /^[a-zA-Z_0-9-]+:.*?##/ { printf "  %-18s %s\n", $$1, $$2 } /^##@/ { printf "\n%s\n", substr($$0, 5) }' $(MAKEFILE_LIST)

##@ Development

.PHONY: tools
tools: ## Build the pinned tools and the local control plane into ./bin (cached).
	hack/bin-tools.sh

.PHONY: generate
generate: $(CONTROLLER_GEN) ## Generate deepcopy code for the API types.
	$(CONTROLLER_GEN) object:headerFile=hack/boilerplate.go.txt paths=./api/...

.PHONY: manifests
manifests: $(CONTROLLER_GEN) ## Generate CRDs and RBAC into config/, then sync them into the Helm chart.
	$(CONTROLLER_GEN) crd paths=./api/... output:crd:artifacts:config=config/crd/bases
	$(CONTROLLER_GEN) rbac:roleName=fairshare-manager paths=./controllers/... output:rbac:artifacts:config=config/rbac
	$(CONTROLLER_GEN) rbac:roleName=fairshare-scheduler paths=./internal/kube/... output:rbac:artifacts:config=config/rbac/scheduler
	hack/sync-chart.sh

.PHONY: verify
verify: generate manifests ## Fail when generated files or the chart copies are stale, or code is unformatted.
	@git diff --exit-code -- api config charts || { echo "generated files are stale: run 'make generate manifests' and commit" >&2; exit 1; }
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt needed" >&2; exit 1; }

.PHONY: vet
vet: ## go vet.
	$(GO) vet ./...

.PHONY: build
build: ## Build the three binaries into ./bin.
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN)/ ./cmd/manager ./cmd/scheduler ./cmd/providersim

##@ Test

.PHONY: test
test: tools verify vet test-unit test-fuzz test-envtest test-helm test-exercises test-goodput test-faults test-e2e test-restart test-ha test-quiet test-security test-chaos test-load test-httpbench ## Everything CI runs (installs what it needs).

.PHONY: test-unit
test-unit: ## Unit tests of the pure packages, the gateway and the render functions (race detector on).
	$(GO) test -race -count=1 $$($(GO) list ./... | grep -v -e /controllers -e /test/ -e /internal/kube -e /internal/scheduler -e /internal/manager)

.PHONY: test-fuzz
test-fuzz: ## Run every Go fuzz target for a bounded number of executions (FUZZTIME each).
	hack/fuzz.sh $(FUZZTIME)

.PHONY: test-envtest
test-envtest: tools ## Controller, status writer, start-up RBAC check, CRD validation and kubectl explain tests on a real kube-apiserver + etcd.
	$(GO) test -count=1 ./controllers/... ./internal/kube/... ./internal/scheduler/... ./internal/manager/... ./test/cel/... ./test/explain/...

.PHONY: test-helm
test-helm: tools ## helm lint and template with default and non-default values, alert/dashboard metric names, schema, and helm install onto a local API server (about 1 min).
	$(HELM) lint charts/fairshare
	$(HELM) lint charts/fairshare -f hack/testdata/values-nondefault.yaml
	$(HELM) template fairshare charts/fairshare --namespace fairshare-system >/dev/null
	$(HELM) template fairshare charts/fairshare --namespace fairshare-system -f hack/testdata/values-nondefault.yaml >/dev/null
	$(GO) test -count=1 -timeout 12m ./test/helm/...

.PHONY: test-exercises
test-exercises: ## Seed 002 exercises B and D on the real gateway and simulator, asserted (about 30 s).
	$(GO) test -count=1 -timeout 5m ./test/exercises/...

.PHONY: test-e2e
test-e2e: tools ## The demo scenario on the real control plane with the three binaries, asserted.
	$(GO) test -count=1 -timeout 20m -v ./test/e2e/...

.PHONY: test-goodput
test-goodput: ## Gateway goodput against the simulator in every dialect on loopback: zero upstream 429s after warm-up, 90-105% of the quota (15-45 s).
	$(GO) test -count=1 -parallel 6 -run TestGoodputGateway ./test/goodput/

.PHONY: test-restart
test-restart: tools ## Kill -9 the scheduler mid-import on the real control plane, restart it on the same job store: no job lost or duplicated (about 1 min).
	$(GO) test -count=1 -timeout 10m -v ./test/restart/...

.PHONY: test-ha
test-ha: tools ## Two scheduler replicas on the real control plane: one Lease holder serves and writes status; kill -9 the leader mid-backlog, the standby takes over within the lease bound with no job lost and the status counters never go backwards (about 2 min).
	$(GO) test -count=1 -timeout 10m -v ./test/ha/...

.PHONY: test-faults
test-faults: ## Upstream faults from the simulator (5xx, reset, hang, malformed, cut stream, no usage, bare 429) through the real gateway: client answer, refund, slots, retries (a few seconds).
	$(GO) test -race -count=1 ./test/faults/...

.PHONY: test-security
test-security: tools ## The scheduler's ServiceAccount verbs (SubjectAccessReview), pod security of the rendered Deployments, tenant isolation and a provider/tenant key leak scan of every response, log, status, event and metric (about 1.5 min).
	$(GO) test -count=1 -timeout 10m -v ./test/security/...

.PHONY: test-chaos
test-chaos: tools ## kill -9 of the scheduler with streams in flight and of the operator; the scheduler cut off the API server for 60 s (about 5 min).
	$(GO) test -count=1 -timeout 20m -v ./test/chaos/...

.PHONY: test-load
test-load: ## Load: 10k tenants, open loop 200 req/s for 30 s (heap flat, p50/p99 recorded); 1M queued jobs within the documented size (about 4 min).
	$(GO) test -count=1 -timeout 20m -v ./test/load/...

.PHONY: test-httpbench
test-httpbench: ## The HTTP benchmark harness (test/httpbench) on loopback: its statistics, process figures and a quick run of every experiment.
	$(GO) test -count=1 -timeout 5m ./test/httpbench/...

.PHONY: test-quiet
test-quiet: tools ## API writes of a converged pool with 3 tenants, the operator and a scheduler during one quiet minute: leases only (about 2 min).
	$(GO) test -count=1 -timeout 5m -v ./test/quiet/...

##@ Demo and benchmarks

.PHONY: exercises
exercises: ## Seed 002 exercises B and D, printing the measured tables (docs/exercises.md).
	$(GO) test -count=1 -v -run Exercise ./test/exercises/

.PHONY: demo
demo: tools ## Start a local control plane, the operator, a scheduler and the simulator, and run the workload.
	$(GO) run ./test/demo

.PHONY: bench
bench: tools ## Every benchmark, raw output in docs/benchmarks.raw.txt (benchstat format), then the summary table in docs/benchmarks.md against the targets (about 35 min on 2 vCPUs, the HTTP step about 6).
	@echo "==> [1/5] micro-benchmarks (count 3, about 13 min) ..."
	$(GO) test -run '^$$' -bench . -benchmem -count 3 $$($(GO) list ./internal/... | grep -v /internal/kube) | tee docs/benchmarks.raw.txt
	@echo "==> [2/5] status writer, 10k TenantQuotas on the local API server (about 4 min) ..."
	$(GO) test -run '^$$' -bench StatusWriter -benchtime 20x -count 1 -timeout 20m ./internal/kube/ | tee -a docs/benchmarks.raw.txt
	@echo "==> [3/5] throttle goodput against the provider simulator (about 11 min) ..."
	$(GO) test -run '^$$' -bench Goodput -benchtime 1x -count 1 -timeout 30m ./test/goodput/ | tee -a docs/benchmarks.raw.txt
	@echo "==> [4/5] HTTP data plane against httputil.ReverseProxy ..."
	$(GO) run ./test/httpbench/cmd/httpbench -out docs/benchmarks.raw.txt
	@echo "==> [5/5] summary against the targets into docs/benchmarks.md ..."
	$(GO) run ./hack/benchsummary -raw docs/benchmarks.raw.txt -doc docs/benchmarks.md

# Packages with Go benchmarks, profiled one per `go test` invocation by bench-profile (the HTTP
# benchmarks have their own step).
BENCH_PKGS = $(shell grep -rl --include='*_test.go' '^func Benchmark' internal test | grep -v '^test/httpbench/' | xargs -n1 dirname | sort -u)

.PHONY: bench-profile
bench-profile: tools ## CPU and allocation profiles (pprof) of every benchmark package and of the HTTP benchmarks into bench-profiles/ (count 1).
	@mkdir -p bench-profiles && rm -f bench-profiles/httpbench.txt
	@set -e; n=$(words $(BENCH_PKGS) x); i=0; \
	for d in $(BENCH_PKGS); do \
	  i=$$((i+1)); name=$$(echo $$d | tr / _); bt=1s; to=20m; \
	  case $$d in internal/kube) bt=20x;; test/goodput) bt=1x; to=30m;; esac; \
	  echo "==> [$$i/$$n] $$d (count 1, benchtime $$bt) ..."; \
	  $(GO) test -run '^$$' -bench . -benchmem -count 1 -benchtime $$bt -timeout $$to \
	    -cpuprofile $(ROOT)/bench-profiles/$$name.cpu.pprof -memprofile $(ROOT)/bench-profiles/$$name.mem.pprof \
	    -o $(ROOT)/bench-profiles/$$name.test ./$$d | tee bench-profiles/$$name.txt; \
	done; \
	echo "==> [$$n/$$n] HTTP data plane ..."
	$(GO) run ./test/httpbench/cmd/httpbench -out bench-profiles/httpbench.txt -profile-dir bench-profiles
	@echo; echo "Profiles in bench-profiles/: <package>.cpu.pprof, <package>.mem.pprof, the test binary <package>.test and the output <package>.txt of each package; the HTTP peers' profiles and httpbench.txt. Open one with:"
	@echo "  go tool pprof -top bench-profiles/internal_limiter.cpu.pprof"
	@echo "  go tool pprof -top -sample_index=alloc_space bench-profiles/internal_limiter.mem.pprof"
	@echo "  go tool pprof -http=127.0.0.1:8080 bench-profiles/internal_fairqueue.test bench-profiles/internal_fairqueue.cpu.pprof"

$(CONTROLLER_GEN):
	hack/bin-tools.sh controller-gen

$(HELM):
	hack/bin-tools.sh helm
