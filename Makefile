# README's two commands, `make demo` and `make test`, each set themselves up on a fresh machine.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
PIP_INSTALL := $(PIP) install -q --disable-pip-version-check -c constraints.txt
PLUGINS := safetensors llama mistral qwen gguf bnb marlin runai transformers
EDITABLES := -e . $(foreach p,$(PLUGINS),-e plugins/$(p))
STAMP := $(VENV)/.installed

.PHONY: install test lint typecheck unit demo bench bench-gguf tox clean docs soak

$(STAMP): pyproject.toml $(wildcard plugins/*/pyproject.toml) requirements-test.txt constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP_INSTALL) --upgrade pip
	$(PIP_INSTALL) torch==2.13.0
	$(PIP_INSTALL) $(EDITABLES) -r requirements-test.txt
	touch $(STAMP)

install: $(STAMP)  ## venv with the core, every plugin (editable) and the test tools

lint: install
	$(VENV)/bin/ruff check core plugins tests benchmarks scripts docs/examples

# The plugin template and the docs' example plugin are not shipped (not in PLUGINS) but are checked like one.
typecheck: install
	$(VENV)/bin/mypy core/loader $(foreach p,$(PLUGINS),plugins/$(p)/src/loader_plugin_$(p)) \
		plugins/_template/src/loader_plugin_template docs/examples/loader-plugin-scaled-llama/src/loader_plugin_scaled_llama

unit: install
	OMP_NUM_THREADS=1 $(VENV)/bin/pytest -q

test: lint typecheck docs unit  ## what CI runs

soak: install  ## 30 s of loads racing a process that truncates the checkpoint: no process may die of SIGBUS
	LOADER_SOAK=1 OMP_NUM_THREADS=1 $(VENV)/bin/pytest -q -m soak tests/reliability/test_truncation_race.py

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
	$(VENV)/bin/tox -p auto

clean:
	rm -rf $(VENV) .tox .pytest_cache .mypy_cache .ruff_cache site
