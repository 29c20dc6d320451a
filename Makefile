# One venv for everything; the two README commands are `make demo` and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test bench clean-venv model-server vllm-server framework-venvs

# The venv. pip -qq: errors only (the build backend's deprecation banners are warnings, shown by -q). The
# last line puts in place the one data file the wheel installs (an editable install skips data files):
# JupyterLab's default to save widget state with notebooks (docs/panels.md).
$(BIN)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -qq --upgrade pip
	$(BIN)/pip install -qq -e '.[test]'
	@mkdir -p $(VENV)/share/jupyter/lab/settings/overrides.d
	@cp jupyter-config/lab/settings/overrides.d/caravanserai.json $(VENV)/share/jupyter/lab/settings/overrides.d/
	touch $@

# The seed's transcript: run, Ctrl-C as soon as it prints step 3, run again (resumes at 4/5), show the waypoint.
demo: $(BIN)/.installed
	@$(BIN)/python tools/demo_transcript.py

# The real local model server (SmolLM2 via `transformers serve`) gets its own venv, built once.
model-server: $(BIN)/.installed
	$(BIN)/python tests/servers/model_server.py setup

# vLLM's CPU build (its own venv, ~3.4 GB, built once): the server that reports cached_tokens.
vllm-server: model-server
	$(BIN)/python tests/servers/vllm_server.py setup

# CrewAI and the Claude Agent SDK pin what the main venv cannot hold: venvs of their own, built once.
framework-venvs: $(BIN)/.installed
	$(BIN)/python tests/servers/framework_venvs.py setup all

# The servers' and frameworks' venvs built side by side (mostly downloads), the gates (lint, types),
# then every test in TEST_WORKERS processes (pytest-xdist), a test file per process at a time: most
# tests wait on kernels, browsers and servers, so two processes finish in about 60% of the time on
# two cores. TEST_WORKERS=0 runs them in this process.
TEST_WORKERS ?= 2
test: $(BIN)/.installed
	@$(MAKE) --no-print-directory -j3 model-server vllm-server framework-venvs
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile

bench: $(BIN)/.installed
	$(BIN)/python benchmarks/bench_foundation.py

clean-venv:
	rm -rf $(VENV)
