# The verbs a newcomer needs. CI runs exactly `make test` (through .ci/run).
#
#   make dev       build, start a real etcd + kube-apiserver and consistd beside them, show it working
#   make dev-stop  stop what `make dev` started
#   make test      lint, then unit and integration tests against the real control plane, then `make dev`'s check
#   make lint      rustfmt, clippy (warnings are errors), buf lint (STANDARD)
#   make gen       regenerate protocol code from proto/consistd/v1/*.proto
#   make bench     benchmarks against the real control plane; figures go in docs/BENCHMARKS.md

SHELL := bash
.SHELLFLAGS := -euo pipefail -c
CARGO ?= cargo

.PHONY: build dev dev-stop test lint gen bench control-plane

build:
	$(CARGO) build --workspace

dev: build
	hack/dev.sh start

dev-stop:
	hack/dev.sh stop

control-plane:
	hack/control-plane.sh build

test: lint control-plane
	hack/with-control-plane.sh $(CARGO) test --workspace --no-fail-fast
	hack/dev.sh check

lint:
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	buf=$$(hack/tools.sh buf) && cd proto && "$$buf" lint

gen:
	CONSISTD_REGENERATE=1 $(CARGO) test -p consistd-proto --test codegen

bench:
	hack/with-control-plane.sh hack/bench.sh
