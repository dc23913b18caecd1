# make demo: quick-start study (digits, Keras, Dask) in a fresh virtual environment.
# make test: the whole test suite.
# make lint: ruff (lint and import order) and mypy on hpo/, dashboards/ and launchers/.
# make docs: the documentation site in site/ (mkdocs build --strict: broken links fail).
# Only Python 3.11+, pip and apt are assumed; everything else installs here.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
export TF_CPP_MIN_LOG_LEVEL ?= 2
export TF_ENABLE_ONEDNN_OPTS ?= 0
# torch's CPU build, installed before the extras so that their range is met by
# it: an unpinned torch from PyPI is a CUDA build of several GB. pip takes
# 2.13.0+cpu from a local wheel folder where one is configured (find-links);
# elsewhere: make TORCH="torch --index-url https://download.pytorch.org/whl/cpu"
TORCH ?= torch==2.13.0

.PHONY: demo test lint bench docs clean

$(VENV)/.installed: pyproject.toml
	@echo "make: creating $(VENV) and installing hpo with TensorFlow, PyTorch, Dask, Optuna and Dash"
	@echo "make: (about 3 minutes and 3 GB on a first install; pip's own lines follow)"
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --progress-bar off $(TORCH) | grep --line-buffered -E '^(Collecting|Successfully)' || true
	$(PY) -m pip install --progress-bar off -e '.[keras,torch,gp,postgres,test,docs,lint]' | grep --line-buffered -E '^(Collecting|Successfully)' || true
	$(PY) -c "import hpo, optuna, distributed, torch, lightning" && echo "make: installed into $(VENV)"
	touch $@

demo: $(VENV)/.installed
	$(PY) hpo_main.py search_spaces/digits_quick.json --runs-dir runs

test: $(VENV)/.installed
	$(PY) -m pytest

lint: $(VENV)/.installed
	$(PY) -m ruff check hpo dashboards launchers
	$(PY) -m mypy

docs: $(VENV)/.installed
	$(PY) docs/gen_cli.py
	$(PY) -m mkdocs build --strict

bench: $(VENV)/.installed
	$(PY) bench/overhead.py

clean:
	rm -rf runs test-artifacts .pytest_cache site .mypy_cache .ruff_cache
