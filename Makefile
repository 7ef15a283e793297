# ddpkit: every way in. `make help` lists targets and variables.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON    ?= python3
VENV      := .venv
PY        := $(VENV)/bin/python
STAMP     := $(VENV)/.installed

CONFIG    ?= configs/default.toml
NODES     ?=
GPUS      ?=
NPROC     ?=
IMAGE     ?= ddpkit:latest
BASE_IMAGE ?=
PARTITION ?=
NAMESPACE ?=
WAIT      ?=
ARGS      ?=
JOB       ?=

# Launcher arguments built from Make variables (each maps to one JobSpec override).
LAUNCH_ARGS := --config $(CONFIG) \
	$(if $(NODES),--nodes $(NODES)) $(if $(GPUS),--gpus $(GPUS)) \
	$(if $(PARTITION),--set slurm.partition=$(PARTITION)) \
	$(if $(NAMESPACE),--set k8s.namespace=$(NAMESPACE)) \
	$(if $(filter-out latest,$(IMAGE)),--set image=$(IMAGE))

.PHONY: help setup test test-fast lint format train bench \
	docker-build docker-run slurm-up slurm-down slurm-render slurm-submit slurm-status \
	slurm-logs slurm-cancel k8s-render k8s-apply k8s-delete clean

help: ## List targets and variables
	@echo "ddpkit targets:"
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | awk -F'\t' '{printf "  %-14s %s\n", $$1, $$2}'
	@echo
	@echo "Variables: CONFIG=$(CONFIG) NODES GPUS NPROC IMAGE=$(IMAGE) BASE_IMAGE PARTITION NAMESPACE WAIT=1 ARGS='extra train flags' JOB"

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP) ## Create .venv with every dependency (idempotent)

test: $(STAMP) ## Run the whole test suite (CPU; GPU tests skip without CUDA)
	$(PY) -m pytest -q

test-fast: $(STAMP) ## Unit tests only (no multi-process, SLURM or container tests)
	$(PY) -m pytest -q -m "not slow and not slurm and not container"

lint: $(STAMP) ## ruff check + format check, hadolint, shellcheck
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	@if [ -f docker/Dockerfile ]; then $(VENV)/bin/hadolint docker/Dockerfile; fi
	@scripts=$$(git ls-files '*.sh'); if [ -n "$$scripts" ]; then $(VENV)/bin/shellcheck $$scripts; fi

format: $(STAMP) ## Apply ruff format and safe fixes
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

train: $(STAMP) ## Train the default config under torchrun on this machine (NPROC: processes; default all GPUs, or 2 on CPU)
	@nproc=$${NPROC:-$$($(PY) -c 'import torch; print(torch.cuda.device_count() or 2)')}; \
	run_dir=runs/$$(basename $(CONFIG) .toml); \
	set -x; $(VENV)/bin/torchrun --standalone --nproc-per-node $$nproc -m train --config $(CONFIG) --run-dir $$run_dir $(ARGS) && \
	{ $(PY) -m tools.plot $$run_dir || echo "(plots skipped)"; } && \
	echo "outputs: $$run_dir (summary.json, metrics.jsonl, config.json, checkpoints/, *.png)"

bench: $(STAMP) ## Benchmarks: step time vs a plain loop, checkpoint save times
	$(PY) -m bench

docker-build: $(STAMP) ## Build the image (IMAGE, BASE_IMAGE); docker or podman
	$(PY) -m tools.launch render docker $(LAUNCH_ARGS) --build $(if $(BASE_IMAGE),--base-image $(BASE_IMAGE))

docker-run: $(STAMP) ## Run the image here: GPUS=N processes and GPUs, else one per visible GPU
	$(PY) -m tools.launch submit docker $(LAUNCH_ARGS) $(if $(GPUS),,--set docker.gpus=all) $(if $(ARGS),-- $(ARGS))

slurm-up: $(STAMP) ## Start a real local SLURM cluster (NODES, default 2)
	bash slurm/local/up.sh $(or $(NODES),2)

slurm-down: ## Stop the local SLURM cluster
	bash slurm/local/down.sh

slurm-render: $(STAMP) ## Print the sbatch script and write out/slurm/<name>.sbatch
	$(PY) -m tools.launch render slurm $(LAUNCH_ARGS) --write

slurm-submit: $(STAMP) ## Submit through submitit (WAIT=1 follows the job to its end)
	$(PY) -m tools.launch submit slurm $(LAUNCH_ARGS) $(if $(WAIT),--wait)

slurm-status: $(STAMP) ## Status of JOB (default: last job submitted from here)
	$(PY) -m tools.launch status slurm $(JOB)

slurm-logs: $(STAMP) ## Logs of JOB (default: last job)
	$(PY) -m tools.launch logs slurm $(JOB)

slurm-cancel: $(STAMP) ## Cancel JOB (default: last job)
	$(PY) -m tools.launch cancel slurm $(JOB)

k8s-render: $(STAMP) ## Print the PyTorchJob/TrainJob YAML and write out/k8s/<name>.yaml
	@$(PY) -m tools.launch render k8s $(LAUNCH_ARGS) --write $(if $(ARGS),-- $(ARGS))

k8s-apply: $(STAMP) ## kubectl apply the rendered manifest (PVC and job)
	set -o pipefail; $(PY) -m tools.launch render k8s $(LAUNCH_ARGS) $(if $(ARGS),-- $(ARGS)) | kubectl apply -f -

# The checkpoint PVC is left alone (k8s.pvc_size unset renders the job only).
k8s-delete: $(STAMP) ## kubectl delete the rendered job (the checkpoint PVC is kept)
	set -o pipefail; $(PY) -m tools.launch render k8s $(LAUNCH_ARGS) --set k8s.pvc_size= | kubectl delete -f -

clean: ## Remove runs/ and out/
	rm -rf runs out
