# make demo: quick-start study (digits, Keras, Dask) in a fresh virtual environment.
# make test: the whole test suite (make test TEST_WORKERS=0: in one process).
# make lint: ruff (lint and import order) and mypy on hpo/, dashboards/ and launchers/.
# make test-optuna-floor: the store's tests on the lowest Optuna pyproject.toml allows.
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
# The lowest Optuna pyproject.toml allows, and the tests that read and write
# stores through it: the journal's format and files, the stores' conformance
# (journal, SQLite, PostgreSQL), the relay (about 2 minutes, a test process per
# test class).
OPTUNA_FLOOR ?= 4.3.0
FLOOR_DIR    := $(CURDIR)/.optuna-floor
FLOOR_TESTS  ?= tests/test_journal_format.py tests/test_journal.py tests/test_store.py \
                tests/test_records.py tests/test_store_conformance.py tests/test_store_relay.py

.PHONY: demo test lint test-optuna-floor bench docs clean

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

# Three test processes (pytest-xdist), a module each at a time, the slowest
# modules first (tests/conftest.py): most tests wait on the processes they
# start, so two processes left a 2-core machine idle 40% of the time.
TEST_WORKERS ?= 3
test: $(VENV)/.installed
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

lint: $(VENV)/.installed
	$(PY) -m ruff check hpo dashboards launchers
	$(PY) -m mypy

# Optuna alone, beside the environment (its dependencies are the environment's):
# the environment keeps the highest Optuna allowed, this run the lowest.
test-optuna-floor: $(VENV)/.installed
	rm -rf $(FLOOR_DIR)
	$(PY) -m pip install --quiet --no-deps --target $(FLOOR_DIR) optuna==$(OPTUNA_FLOOR)
	PYTHONPATH=$(FLOOR_DIR) $(PY) -c "import optuna; assert optuna.__version__ == '$(OPTUNA_FLOOR)', optuna.__version__"
	PYTHONPATH=$(FLOOR_DIR) $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadscope $(FLOOR_TESTS)

docs: $(VENV)/.installed
	$(PY) docs/gen_cli.py
	$(PY) -m mkdocs build --strict

bench: $(VENV)/.installed
	$(PY) bench/overhead.py

clean:
	rm -rf runs test-artifacts .pytest_cache site .optuna-floor .mypy_cache .ruff_cache
