# Two commands on a fresh machine: `make run` and `make test`. Both set up ./.venv when it is missing.
VENV  ?= .venv
PY    := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# CPU wheel for this machine and CI; on a GPU cluster the image's own CUDA torch is used instead
TORCH ?= torch==2.13.0
VERL  ?= verl[verl-core]==0.9.1

.PHONY: help run test lint bench clean

help: ## list the targets
	@grep -E '^[a-z]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-6s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q "$(VERL)" -e ".[test]"
	touch $(STAMP)

run: $(STAMP) ## plan the main job: GLM-5.1 GRPO on 256 GPUs (prints the plan; starts nothing)
	$(PY) runner.py model=glm5_1 mesh=256gpu algo=grpo mode=plan

test: $(STAMP) ## run every test that needs no GPU (real verl, Hydra, Ray, torchrun; SLURM where reachable)
	$(PY) -m pytest -q -rs -p no:cacheprovider

lint: $(STAMP) ## repository conventions for conf/
	$(PY) -m hooks.check_conventions

bench: $(STAMP) ## plan vs verl's CLI, a 64-point plan sweep, mesh search with the rollout replica, Ray bring-up on SLURM
	$(PY) bench/bench.py

clean: ## remove run outputs (keeps .venv)
	rm -rf outputs multirun .bench .pytest_cache .slurm-test
