# ddpkit: every way in. `make help` lists targets and variables.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON    ?= python3
# The kit's checkout, wherever make runs from: `make -f ~/ddpkit/Makefile train` in a project
# runs the project's job (the workspace is the current directory) with the kit's venv.
KIT       := $(patsubst %/,%,$(dir $(abspath $(lastword $(MAKEFILE_LIST)))))
VENV      := $(KIT)/.venv
PY        := $(VENV)/bin/python
STAMP     := $(VENV)/.installed

CONFIG    ?=
NODES     ?=
GPUS      ?=
NPROC     ?=
IMAGE     ?=
BASE_IMAGE ?=
PARTITION ?=
NAMESPACE ?=
WAIT      ?=
ARGS      ?=
JOB       ?=
# The variables reach the launcher through the environment (`ddpkit ... --make` reads
# them as data), never pasted into recipe shell text: PARTITION='gpu;touch x' stays a value.
# IMAGE unset keeps the job file's image.
export CONFIG NODES GPUS NPROC IMAGE BASE_IMAGE PARTITION NAMESPACE WAIT ARGS JOB
# The same `ddpkit` command users install; the Makefile adds only the Make variables.
DDPKIT := $(VENV)/bin/ddpkit
LAUNCH := $(DDPKIT)

.PHONY: help setup test test-fast coverage lint format train bench \
	docker-build docker-run k8s-up k8s-down s3-up s3-down slurm-up slurm-down slurm-render slurm-submit slurm-status \
	slurm-logs slurm-cancel k8s-render k8s-apply k8s-delete clean

help: ## List targets and variables
	@echo "ddpkit targets:"
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | awk -F'\t' '{printf "  %-14s %s\n", $$1, $$2}'
	@echo
	@echo "Variables: CONFIG (default ./ddpkit.toml, else the built-in job) NODES GPUS NPROC IMAGE BASE_IMAGE PARTITION NAMESPACE WAIT=1 ARGS='extra flags for the entry point' JOB"

$(STAMP): $(KIT)/pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '$(KIT)[dev]'
	touch $(STAMP)

setup: $(STAMP) ## Create .venv with every dependency (idempotent)

# The checkout's modules byte-compiled once, as pip compiles an installed package's. Where
# PYTHONDONTWRITEBYTECODE is set (this machine's environment sets it) no process writes a
# .pyc, so each Python process the suite or a benchmark starts compiled the kit's modules it
# imports again: 0.01-0.07 CPU-s a process, 0.05-0.1 a launch (bench/README.md; the suite's
# total CPU did not measurably change, docs/development.md). Up to date, this takes 0.04 s.
PYC = $(PY) -m compileall -q $(addprefix $(KIT)/,bench ddpkit docker examples k8s slurm tests tools train)

test: $(STAMP) ## Run the whole test suite in three lanes side by side (tests/lanes.py; GPU tests skip without CUDA)
	$(PYC)
	cd $(KIT) && $(PY) -m tests.lanes

test-fast: $(STAMP) ## The unit tier only (tests/unit: in-process tests, well under a minute)
	cd $(KIT) && $(PY) -m pytest -q tests/unit

coverage: $(STAMP) ## The suite under coverage.py, subprocesses included; each line tagged with its tests (tests/coverage_run.py)
	cd $(KIT) && $(PY) -m tests.coverage_run

lint: $(STAMP) ## ruff check + format check, hadolint, shellcheck
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	@if [ -f docker/Dockerfile ]; then $(VENV)/bin/hadolint docker/Dockerfile; fi
	@scripts=$$(git ls-files '*.sh'); if [ -n "$$scripts" ]; then $(VENV)/bin/shellcheck $$scripts; fi

format: $(STAMP) ## Apply ruff format and safe fixes
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

train: $(STAMP) ## Train CONFIG on this machine through the node launcher (NPROC or GPUS: processes; default all GPUs, or 2 on CPU)
	@NPROC=$${NPROC:-$${GPUS:-$$($(PY) -c 'import torch; print(torch.cuda.device_count() or 2)')}} \
	  $(DDPKIT) run --make

bench: $(STAMP) ## Benchmarks: step time vs a plain loop, checkpoint save times
	$(PYC)
	$(PY) -m bench

docker-build: $(STAMP) ## Build the image (IMAGE, BASE_IMAGE); docker or podman
	$(LAUNCH) render docker --make --build $(if $(BASE_IMAGE),--base-image "$$BASE_IMAGE")

docker-run: $(STAMP) ## Run the image here: GPUS=N processes and GPUs, else one per visible GPU (or per CPU without GPUs)
	@if [ -n "$$GPUS" ]; then extra=(); \
	elif nvidia-smi -L >/dev/null 2>&1; then extra=(--set docker.gpus=all); \
	else echo "ddpkit: no GPU visible here; the container runs on the CPU (gloo)" >&2; extra=(--set accelerator=cpu); fi; \
	$(LAUNCH) submit docker --make "$${extra[@]}"

# The cluster targets run shell scripts: no venv first (k8s/local/up.sh takes .venv's python
# when there is one, else python3, and says in one line when the node agent lacks a package).
k8s-up: ## Start a real local Kubernetes control plane + Kubeflow controllers (built once into ~/.cache/ddpkit-k8s; NODES: node agents)
	DDPKIT_K8S_NODES=$${NODES:-0} bash $(KIT)/k8s/local/up.sh

k8s-down: ## Stop the local Kubernetes control plane
	bash $(KIT)/k8s/local/down.sh

s3-up: $(STAMP) ## Start a real local S3-compatible server (versitygw, built once into ~/.cache/ddpkit-s3); then: source /tmp/ddpkit-s3/env
	DDPKIT_S3_PYTHON=$(PY) bash $(KIT)/tools/s3local/up.sh

s3-down: ## Stop the local S3-compatible server (its objects are kept)
	bash $(KIT)/tools/s3local/down.sh

slurm-up: ## Start a real local SLURM cluster (NODES, default 2)
	bash $(KIT)/slurm/local/up.sh "$${NODES:-2}"

slurm-down: ## Stop the local SLURM cluster
	bash $(KIT)/slurm/local/down.sh

slurm-render: $(STAMP) ## Print the sbatch script and write .ddpkit/rendered/slurm/<name>.sbatch
	$(LAUNCH) render slurm --make --write

slurm-submit: $(STAMP) ## Submit through submitit (WAIT=1 follows the job to its end)
	$(LAUNCH) submit slurm --make

slurm-status: $(STAMP) ## Status of JOB (default: last job submitted from here)
	$(LAUNCH) status slurm --make

slurm-logs: $(STAMP) ## Logs of JOB, every node prefixed (default: last job; WAIT=1 follows)
	$(LAUNCH) logs slurm --make $(if $(WAIT),--follow)

slurm-cancel: $(STAMP) ## Cancel JOB (default: last job)
	$(LAUNCH) cancel slurm --make

k8s-render: $(STAMP) ## Print the PyTorchJob/TrainJob YAML and write .ddpkit/rendered/k8s/<name>.yaml
	@$(LAUNCH) render k8s --make --write

k8s-apply: $(STAMP) ## kubectl apply the rendered manifest (PVC and job)
	set -o pipefail; $(LAUNCH) render k8s --make | kubectl apply -f -

# The checkpoint PVC is left alone (k8s.pvc_size unset renders the job only).
k8s-delete: $(STAMP) ## kubectl delete the rendered job (the checkpoint PVC is kept)
	set -o pipefail; $(LAUNCH) render k8s --make --set k8s.pvc_size= | kubectl delete -f -

clean: ## Remove runs/ and .ddpkit/ (run dirs and job records of this workspace)
	rm -rf runs .ddpkit
