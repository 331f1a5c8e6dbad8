# TaskQ task layer: CI calls these same targets. `make help` lists them.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
UV := $(PY) -m uv
export UV_PYTHON_DOWNLOADS := never
PACKAGES := $(wildcard packages/taskq-*)

.DEFAULT_GOAL := help

.PHONY: help
help: ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

.PHONY: setup
setup: $(VENV)/.installed ## create .venv and install the workspace from the committed lock

# Bytecode at install, as pip does: where PYTHONDONTWRITEBYTECODE is set, every worker
# process the tests and the benchmark start would otherwise compile its imports again.
$(VENV)/.installed: requirements.lock.txt $(addsuffix /pyproject.toml,$(PACKAGES))
	@$(PY) -m uv --version >/dev/null 2>&1 || $(PY) -m pip install --quiet uv
	@test -x $(BIN)/python || $(UV) venv --quiet --python $(PY) $(VENV)
	$(UV) pip sync --quiet --compile-bytecode --python $(BIN)/python --require-hashes requirements.lock.txt
	$(UV) pip install --quiet --python $(BIN)/python --no-deps $(addprefix -e ,$(PACKAGES))
	@touch $@

.PHONY: demo
demo: setup ## run the demo: a worker processing real jobs (embedded Postgres when no DSN is given)
	$(BIN)/taskq demo

.PHONY: lock
lock: ## re-resolve dependencies and rewrite the host-free lock
	$(UV) lock
	$(UV) export --frozen --format requirements-txt --all-packages --all-extras --all-groups \
		--no-emit-workspace --no-header -o requirements.lock.txt --quiet

.PHONY: lint
lint: setup ## ruff (lint + format check) and import-linter contracts
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

.PHONY: typecheck
typecheck: setup ## mypy --strict over every package's src, the tests and the benchmarks
	$(BIN)/mypy packages/*/src tests bench

.PHONY: pytest
pytest: setup ## the test suite (parallel, with coverage)
	$(BIN)/python -m pytest -n 2 --dist loadgroup --cov --cov-report=term:skip-covered

.PHONY: test
test: lint typecheck pytest ## everything CI runs: lint, types, tests

.PHONY: bench
bench: setup ## run the benchmarks against the local Postgres (prints JSON lines)
	$(BIN)/python -m bench.di_resolution
	$(BIN)/python -m bench.latency
