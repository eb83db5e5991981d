# The verbs a newcomer needs. CI runs exactly `make test` (through .ci/run).
#
#   make dev       build, start a real etcd + kube-apiserver and consistd beside them, show it working
#   make dev-stop  stop what `make dev` started
#   make test      lint, `make test-unit`, then `make test-integration`'s suites, `make dev`'s check and `make e2e`:
#                  the whole suite, the README's command and CI's
#   make test-unit unit tests of every crate (and doc tests) and hack/'s Python tests: no control plane needed
#   make test-integration
#                  integration tests against the real control plane, every SDK's tests, example
#                  and conformance suite (hack/test-sdks.sh), stock gRPC clients in five languages with their default
#                  options (hack/stock-clients.sh), `promtool check metrics` on two daemons' /metrics
#                  (hack/check-metrics.sh), manifests/monitoring's PodMonitor and dashboard (hack/monitoring-check.sh),
#                  the Helm chart (hack/chart-check.sh), `make dev`'s check, then `make e2e`
#   make lint      rustfmt, clippy (warnings are errors), hack/'s Python tests, no module import cycle within a
#                  crate and no two types with one name (hack/check-structure.py),
#                  buf lint (STANDARD), generated SDK code up to date
#   make gen       regenerate protocol code from proto/consistd/v1/*.proto for every SDK
#   make bench     benchmarks against the real control plane; figures go in docs/BENCHMARKS.md
#   make soak      an hour of churn against one daemon (CONSISTD_SOAK_SECONDS): memory and descriptors flat, nothing lost;
#                  then 6-minute black holes to and from the apiserver and a peer (daemon/tests/blackhole.rs)
#   make chart-check  charts/consistd: helm lint, its values schema, server-side dry runs, no drift from
#                  manifests/injector (hack/chart-check.sh)
#   make e2e       two real nodes (containerd and kubelet each in a network namespace, a scheduler and a
#                  controller-manager; hack/node.sh) run pods against the control plane (hack/test-node.sh), then
#                  the injector from its image adds consistd to a labelled Deployment over both, which goes
#                  through a node lost and a partition (hack/e2e-consistd.sh); the host is checked restored (root)
#   make dashboard manifests/monitoring's Grafana dashboard drawn from a real Prometheus scraping two daemons
#                  under traffic, into docs/monitoring/dashboard.png (hack/dashboard.sh); fails on a panel with no data
#   make image     reproducible OCI image tarballs in target/images, no Docker engine (hack/image.sh): consistd,
#                  the Go and Python examples, pause and busybox for a local node; `make image-check` builds
#                  each twice and compares digests

SHELL := bash
.SHELLFLAGS := -euo pipefail -c
CARGO ?= cargo

.PHONY: build dev dev-stop test test-unit test-integration lint gen bench soak control-plane e2e image image-check chart-check dashboard

build:
	$(CARGO) build --workspace

dev: build
	hack/dev.sh start

dev-stop:
	hack/dev.sh stop

control-plane:
	hack/control-plane.sh build

SDKS := python go typescript java

# The suites that need the real control plane, under one control plane: the Rust test binaries side by side in
# lanes (hack/integration.py), the SDKs' suite one more job of those lanes, then the other suites one after another.
# Beside them too, the watches of a shard once more against an apiserver without sharded watches (KEP-5866's gate
# off) of its own (hack/no-shard-gate.sh): the daemon then applies the shard itself.
INTEGRATION := hack/stage.sh integration env CARGO=$(CARGO) hack/integration.py --beside 'sdks=hack/stage.sh sdks hack/test-sdks.sh' --beside 'no-shard-gate=hack/stage.sh no-shard-gate hack/no-shard-gate.sh' && hack/stage.sh stock-clients hack/with-daemons.sh hack/stock-clients.sh && hack/stage.sh metrics hack/with-daemons.sh hack/check-metrics.sh && hack/stage.sh monitoring hack/monitoring-check.sh && hack/stage.sh chart hack/chart-check.sh

# Every crate's unit tests and doc tests: nothing running needed.
UNIT := $(CARGO) test --workspace --no-fail-fast --lib --bins && $(CARGO) test --workspace --no-fail-fast --doc

test-unit:
	$(UNIT)
	python3 -m unittest discover -s hack -p 'test_*.py'

test-integration: control-plane
	hack/with-control-plane.sh $(SHELL) $(.SHELLFLAGS) "$(INTEGRATION)"

# hack/prebuild.sh builds the Go tools, node binaries and images of the later stages at idle priority beside
# the Rust tests, which leave a core mostly idle; on a failure the trap stops it.
# Each stage's time is printed as it ends and listed at the end (hack/stage.sh; docs/BENCHMARKS.md's build table).
test:
	hack/stage.sh reset
	hack/stage.sh lint $(MAKE) --no-print-directory lint
	hack/stage.sh control-plane hack/control-plane.sh build
	hack/stage.sh unit $(SHELL) $(.SHELLFLAGS) "$(UNIT)"
	hack/prebuild.sh start
	trap 'hack/prebuild.sh stop' EXIT; \
	  hack/with-control-plane.sh $(SHELL) $(.SHELLFLAGS) "$(INTEGRATION)"; \
	  hack/stage.sh dev-check hack/dev.sh check; \
	  hack/stage.sh prebuild-wait hack/prebuild.sh wait
	$(MAKE) --no-print-directory e2e
	hack/stage.sh report

lint:
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	python3 -m unittest discover -s hack -p 'test_*.py'
	python3 hack/check-structure.py
	buf=$$(hack/tools.sh buf) && cd proto && "$$buf" lint
	for sdk in $(SDKS); do hack/sdk/$$sdk.sh check; done

gen:
	CONSISTD_REGENERATE=1 $(CARGO) test -p consistd-proto --test codegen
	for sdk in $(SDKS); do hack/sdk/$$sdk.sh gen; done

bench:
	hack/with-control-plane.sh hack/bench.sh

soak:
	hack/with-control-plane.sh $(CARGO) test -p consistd --test soak --test blackhole -- --ignored --nocapture

chart-check: control-plane
	hack/with-control-plane.sh hack/chart-check.sh

# hack/image.sh writes target/images/{consistd,pause,busybox}.tar, which the node imports. The node needs a
# control plane started for it (CONSISTD_CP_NODE=1): one of its own, never the one `make dev` left running.
e2e: export CONSISTD_CP_DIR := $(CURDIR)/target/e2e/control-plane
e2e: control-plane
	hack/stage.sh e2e-images hack/image.sh consistd example-python pause busybox
	hack/stage.sh e2e-node-prepare hack/node.sh prepare
	CONSISTD_CP_NODE=1 hack/with-control-plane.sh $(SHELL) $(.SHELLFLAGS) 'hack/stage.sh e2e-node hack/test-node.sh && hack/stage.sh e2e-consistd hack/e2e-consistd.sh'

image:
	hack/image.sh

dashboard: control-plane
	hack/with-control-plane.sh hack/dashboard.sh

image-check:
	hack/image.sh --check
