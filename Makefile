# Two commands on a fresh machine: `make demo` and `make test`.
# Both build their own virtualenv (.venv) first; nothing else is needed.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The trainer extra allows torch>=2.11,<2.15 (setup.cfg); make test runs on the newest release it allows
# (tests/unit/test_torch_range.py checks the two pins against that range). On x86_64 this is a CUDA build
# that runs on the CPU here.
TORCH_SPEC ?= torch==2.14.1
DEMO_HOME ?= $(CURDIR)/.demo
PYTEST_ARGS ?=
# Two test processes; an idle one takes tests queued for the other (--dist worksteal), so the run does not end
# with one of them working through its queue alone. See docs/testing.md.
TEST_WORKERS ?= 2

# The lowest torch the trainer extra allows (setup.cfg), tested by `make test-torch-min`.
TORCH_MIN ?= torch==2.11.0
VENV_MIN ?= .venv-torch-min

.PHONY: venv chromium lint test test-faults test-repeat test-fast test-torch-min bench-smoke demo clean faults

venv: $(VENV)/.installed

$(VENV)/.installed: setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# one resolve with the pin: installed separately, a dependency's range lets pip move torch
	$(PY) -m pip install --quiet -e ".[trainer,test]" "$(TORCH_SPEC)"
	touch $@

# The browser test (tests/ui) drives Debian's chromium through Playwright (whose own browser
# download is not used). Installed here when missing, if apt-get is there and we are root;
# otherwise, or if the install fails, that test skips and says what to install.
chromium:
	@if command -v chromium >/dev/null 2>&1 || [ -x /usr/bin/chromium ]; then :; \
	elif command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
		echo "installing chromium (apt-get) for the browser test"; \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get install -y -qq chromium >/dev/null 2>&1 \
		|| { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq chromium >/dev/null 2>&1; } \
		|| echo "could not install chromium: the browser test (tests/ui) will be skipped"; \
	else \
		echo "no chromium, and no apt-get as root to install it: the browser test (tests/ui) will be skipped"; \
	fi

# The pinned ruff (setup.cfg's test extra) over the whole tree: syntax errors, pyflakes and line length
# (pyproject.toml [tool.ruff.lint]), and the formatting. .ci/run runs it first; `ruff format .` fixes the latter.
lint: venv
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

# Every test but the long fault trials (marker fault_trial), which belong with the benchmarks: `make test-faults`.
test: venv chromium
	$(PY) -m pytest tests -q --timeout=900 -n $(TEST_WORKERS) --dist worksteal --durations=25 -m "not fault_trial" $(PYTEST_ARGS)

# The long fault trials: a hung rank, kill -9 during a save, a full disk, spot prices that jump, a second
# writer, a 34 s preemption save. .ci/run runs them after `make test`; `benchmarks/faults.py` repeats such faults.
test-faults: venv
	$(PY) -m pytest tests -q --timeout=900 -n $(TEST_WORKERS) --dist worksteal --durations=10 -m fault_trial $(PYTEST_ARGS)

# Every fault of benchmarks/faults.py at seeded random steps, TRIALS per fault (issue #41: TRIALS=10); not in CI.
# The clock faults need libfaketime (apt-get install faketime).
faults: venv
	$(PY) benchmarks/faults.py $(if $(TRIALS),--trials $(TRIALS))

# Every benchmark in its --quick mode (small sizes, one trial, the same code as the full run), each
# printing its table: a check that they still run against the current code, not a measurement. About
# 3 minutes on 2 cores; .ci/run runs it after the tests. gpu_check.sh says so and passes without a
# GPU. benchmarks/spot_traces.py is not a script: the spot scripts read their traces
# (../shared/data/spot) with it.
BENCH_SCRIPTS := checkpoint.py data_throughput.py faults.py load.py mfu.py recovery.py spot_choice.py spot_cost.py ui_jobs.py \
	spot_hindsight.py trainer_overhead.py gpu_check.sh

bench-smoke: venv
	@failed=; for s in $(BENCH_SCRIPTS); do \
		echo "== benchmarks/$$s --quick"; start=$$(date +%s); \
		case $$s in *.sh) PYTHON=$(PY) bash benchmarks/$$s --quick;; *) $(PY) benchmarks/$$s --quick;; esac \
			|| failed="$$failed $$s"; \
		echo "== benchmarks/$$s --quick: $$(( $$(date +%s) - start )) s"; \
	done; \
	if [ -n "$$failed" ]; then echo "bench-smoke FAILED:$$failed"; exit 1; fi; \
	echo "bench-smoke: every benchmark ran"

# The fast half of the suite (every test not marked slow: tests/conftest.py says which are) REPEAT times in a
# row, each run with its own work stealing: a test that fails by chance, or only after another one in the same
# worker, shows here. Every run is made; it fails if any did, naming them. See docs/testing.md.
REPEAT ?= 3

test-repeat: venv
	@failed=; for i in $$(seq 1 $(REPEAT)); do \
		echo "== test-repeat: run $$i of $(REPEAT)"; \
		$(PY) -m pytest tests -q --timeout=900 -n $(TEST_WORKERS) --dist worksteal -m "not slow" $(PYTEST_ARGS) \
			|| failed="$$failed $$i"; \
	done; \
	if [ -n "$$failed" ]; then echo "test-repeat FAILED in run(s):$$failed of $(REPEAT)"; exit 1; fi; \
	echo "test-repeat: $(REPEAT) clean runs of the fast half"

# Everything except the tests that start a real Airflow scheduler, and the fault trials.
test-fast: venv
	$(PY) -m pytest tests -q --timeout=900 -m "not scheduler and not fault_trial" $(PYTEST_ARGS)

# The trainer and checkpoint tests on the lowest supported torch (a CUDA build from PyPI on
# x86_64: several GB; it runs on the CPU). `make test` stays on TORCH_SPEC.
test-torch-min:
	test -x $(VENV_MIN)/bin/python || $(PYTHON) -m venv $(VENV_MIN)
	$(VENV_MIN)/bin/python -m pip install --quiet --upgrade pip
	# one resolve with the pin: installed separately, a dependency's range lets pip move torch
	$(VENV_MIN)/bin/python -m pip install --quiet -e ".[trainer,test]" "$(TORCH_MIN)"
	$(VENV_MIN)/bin/python -c "import torch; print('torch', torch.__version__)"
	CUDA_VISIBLE_DEVICES= $(VENV_MIN)/bin/python -m pytest tests/trainer -q --timeout=900 -p no:cacheprovider $(PYTEST_ARGS)

demo: venv
	DEMO_HOME="$(DEMO_HOME)" PY="$(PY)" bash scripts/demo.sh

clean:
	rm -rf $(VENV) $(VENV_MIN) $(DEMO_HOME) .pytest_cache
