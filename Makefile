# README's two commands, `make demo` and `make test`, each set themselves up on a fresh machine.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
PIP_INSTALL := $(PIP) install -q --disable-pip-version-check -c constraints.txt
# The shipped plugins: each plugins/<name>/ with a pyproject.toml, but the template (plugins/_template), as in
# scripts/distributions.py. Files that cannot compute this list are kept by `make plugins` (scripts/plugin_list.py).
PLUGINS := $(sort $(patsubst plugins/%/pyproject.toml,%,$(filter-out plugins/_%,$(wildcard plugins/*/pyproject.toml))))
EDITABLES := -e . $(foreach p,$(PLUGINS),-e plugins/$(p))
STAMP := $(VENV)/.installed

# tox's parallelism in `make tox`: `auto` is one env per core
TOX_PARALLEL ?= auto

.PHONY: install test lint typecheck unit rest demo bench bench-gguf tox clean docs soak plugins external external-due

$(STAMP): pyproject.toml $(wildcard plugins/*/pyproject.toml) requirements-test.txt constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP_INSTALL) --upgrade pip
	$(PIP_INSTALL) torch==2.13.0
	$(PIP_INSTALL) $(EDITABLES) -r requirements-test.txt
	touch $(STAMP)

install: $(STAMP)  ## venv with the core, every plugin (editable) and the test tools

lint: install  ## ruff, and every file's plugin list against plugins/*/pyproject.toml
	$(VENV)/bin/ruff check core plugins tests benchmarks scripts docs/examples
	$(PY) scripts/plugin_list.py --check

plugins: install  ## write the plugin list into the files that cannot compute it (after adding a plugin)
	$(PY) scripts/plugin_list.py

# The plugin template and the docs' example plugin are not shipped (not in PLUGINS) but are checked like one.
typecheck: install
	$(VENV)/bin/mypy core/loader $(foreach p,$(PLUGINS),plugins/$(p)/src/loader_plugin_$(p)) \
		plugins/_template/src/loader_plugin_template docs/examples/loader-plugin-scaled-llama/src/loader_plugin_scaled_llama

unit: install  ## the whole suite in .venv, every plugin editable (for developers; CI runs `make test`)
	OMP_NUM_THREADS=1 $(VENV)/bin/pytest -q

rest: install  ## the tests no tox env runs, here in .venv; fails if a test would run in two places
	OMP_NUM_THREADS=1 $(PY) scripts/test_places.py

# What CI runs (.ci/run): ruff, mypy and the docs once, the tests no tox env runs (which first checks that every
# test runs in exactly one place: scripts/test_places.py), then each distribution's tests in its tox env.
test: lint typecheck docs rest tox

soak: install  ## the tests marked soak (30 s of loads racing a truncating process; the cache races, 20 rounds)
	LOADER_SOAK=1 OMP_NUM_THREADS=1 $(VENV)/bin/pytest -q -m soak

docs: install  ## generated pages current, every hook / API name / CLI flag documented, then the site (seconds)
	$(PY) scripts/gen_docs.py --check
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet
	$(PY) scripts/gen_docs.py --check-site site

demo: install  ## load the real SmolLM2-135M-Instruct GGUF, report, and ask it a question
	$(PY) scripts/demo.py

bench: install  ## load benchmarks against the peers; results go to benchmarks/RESULTS.md (+ PNG plot)
	$(PIP_INSTALL) -r benchmarks/requirements.txt
	$(PY) benchmarks/run_all.py

bench-gguf: install  ## GGUF packed vs dequantized vs llama.cpp (builds llama-cpp-python in benchmarks/out/ first)
	$(PY) benchmarks/bench_gguf_packed.py --big

tox: install  ## one isolated env per package, each installed from the wheels tox builds once per run
	OMP_NUM_THREADS=1 $(VENV)/bin/tox run-parallel -p $(TOX_PARALLEL) --parallel-no-spinner

external: install  ## the tox envs labelled external (GPTQModel, AutoAWQ, ...), each pass in .ci/external-checked
	$(PY) scripts/external_envs.py run --all

external-due: install  ## those whose inputs changed since .ci/external-checked records a pass, or a week on (CI)
	$(PY) scripts/external_envs.py run

clean:
	rm -rf $(VENV) .tox .pytest_cache .mypy_cache .ruff_cache site
