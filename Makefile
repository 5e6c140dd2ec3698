# Two commands on a fresh machine: `make demo` and `make test`.
# Both build their own virtualenv (.venv) first; nothing else is needed.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The trainer extra allows torch>=2.6; this pins the CPU build used by the demo and CI.
TORCH_SPEC ?= torch==2.13.0
DEMO_HOME ?= $(CURDIR)/.demo
PYTEST_ARGS ?=

.PHONY: venv test test-fast demo clean

venv: $(VENV)/.installed

$(VENV)/.installed: setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e ".[trainer,test]"
	touch $@

test: venv
	$(PY) -m pytest tests -q --timeout=900 $(PYTEST_ARGS)

# Everything except the tests that start a real Airflow scheduler.
test-fast: venv
	$(PY) -m pytest tests -q --timeout=900 -m "not scheduler" $(PYTEST_ARGS)

demo: venv
	DEMO_HOME="$(DEMO_HOME)" PY="$(PY)" bash scripts/demo.sh

clean:
	rm -rf $(VENV) $(DEMO_HOME) .pytest_cache
