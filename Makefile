# Two commands on a fresh machine: `make run` and `make test`. Both set up ./.venv when it is missing.
#
# Which verl: VERL is one pip requirement (PyPI's 0.9.1 by default: plans, cannot train on Megatron Lite);
# PINS are extra requirements that verl needs beside it. A different VERL/PINS/TORCH re-installs the venv's verl.
#   make test VENV=.venv-a6ef VERL='verl @ git+https://github.com/verl-project/verl.git@a6ef5009' \
#             PINS='pyarrow==25.0.1 transformers==5.10.4 uvicorn fastapi cachetools'
VENV  ?= .venv
PY    := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# CPU wheel for this machine and CI; on a GPU cluster the image's own CUDA torch is used instead
TORCH ?= torch==2.13.0
VERL  ?= verl[verl-core]==0.9.1
PINS  ?=
# extra pytest arguments, e.g. PYTEST_ARGS='-m "not slurm"'
PYTEST_ARGS ?=
# test files run on this many processes at once (pytest-xdist; a file's tests stay in one process); 1: one process
JOBS ?= 2
XDIST := $(if $(filter-out 0 1,$(JOBS)),-n $(JOBS) --dist loadfile --no-loadscope-reorder,)
WANT  := $(TORCH) | $(VERL) | $(PINS)

.PHONY: help setup run test lint bench clean

# Runs the project wrote (`python -m vrun VERB --help` for each):
#> runs [DIR...]            list runs and sweep points: model, algo, GPUs, mode, state (stalls, restarts), job, GPU-hours
#> status RUN               one run: plan, state and why, every attempt, stall summary and stacks, resume, logs
#> show RUN                 draw a run's plan.svg (memory per stage, step time, GPU grid) or a sweep's overview.svg
#> logs RUN [--node N] [-f] the job's output from every node, merged or per node; -f follows
#> cancel RUN... [--yes]    scancel a pending or running run (every point of a sweep dir)
#> diff RUN_A RUN_B         overrides, verl config leaf by leaf, mesh, batch, env names, versions
#> export RUN [-o FILE]     a script reproducing the run's verl invocation without this project
#> resubmit RUN [--exclude N] submit a SLURM run dir again (its plan's job; resumes from the last whole checkpoint)

help: ## list the targets and the run commands
	@grep -E '^[a-z]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-6s %s\n", $$1, $$2}'
	@echo "runs the project wrote:"
	@grep -E '^#> ' $(MAKEFILE_LIST) | sed 's/^#> /  python -m vrun /'

setup: ## create the venv (VENV, default .venv) with torch, VERL and the project, unless already there
	@if [ -f "$(STAMP)" ] && [ ! pyproject.toml -nt "$(STAMP)" ] && [ "$$(cat "$(STAMP)")" = '$(WANT)' ]; then exit 0; fi; \
	set -e; \
	test -x "$(PY)" || python3 -m venv "$(VENV)"; \
	"$(PY)" -m pip install -q --upgrade pip; \
	"$(PY)" -m pip install -q "$(TORCH)"; \
	"$(PY)" -m pip install -q "$(VERL)" $(PINS) -e ".[test]"; \
	printf '%s' '$(WANT)' > "$(STAMP)"

run: setup ## plan the main job: GLM-5.1 GRPO on 256 GPUs (prints the plan; starts nothing)
	$(PY) runner.py model=glm5_1 mesh=256gpu algo=grpo mode=plan

# the suite starts ~500 Python processes: their bytecode is cached in the venv (never in the checkout), whatever
# PYTHONDONTWRITEBYTECODE the shell has
test: setup ## every test that needs no GPU (real verl, Hydra, Ray, torchrun; SLURM where reachable)
	PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX="$(abspath $(VENV))/pycache" $(PY) -m pytest -q -rs -p no:cacheprovider $(XDIST) $(PYTEST_ARGS)

lint: setup ## repository conventions for conf/
	$(PY) -m hooks.check_conventions

bench: setup ## plan vs verl's CLI, a 64-point plan sweep, mesh search with the rollout replica, vrun runs on 30 points, Ray bring-up, hang → summary, requeue → resumed step on SLURM
	$(PY) bench/bench.py

clean: ## remove run outputs (keeps the venvs)
	rm -rf outputs multirun .bench .pytest_cache .slurm-test
