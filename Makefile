# The two commands of the README: `make demo` (the main job) and `make test`.
# Each creates .venv from the committed lock (constraints.txt) when it is missing or stale, with the
# runtime extra (torch: the demo's jobs run on the local launcher), the test, simulator, benchmark and docs extras,
# and TorchRec for examples/torchrec_dlrm (its extra, then torchrec itself without the CUDA fbgemm-gpu
# its metadata asks for: see pyproject.toml).
# `make demo` runs the daily retrain DAG with `airflow dags test` on the embedded defaults:
# AIRFLOW_HOME=./airflow-home (SQLite metadata DB and history store), the local launcher. It exports
# each run's model under DEMO_EXPORT and runs the day after the newest export there (today, UTC, the
# first time): a second `make demo` is the next day's retrain, which continues from the first's model
# and reports today's against it on the same held-out rows.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
export AIRFLOW__CORE__LOAD_EXAMPLES ?= False

.PHONY: demo test test-fast bench docs docs-build clean dlrover-venv

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[runtime,test,sim,torchrec,bench,docs]'
	$(PY) -m pip install --quiet --no-deps -c constraints.txt torchrec
	touch $@

DEMO_HOME ?= $(CURDIR)/airflow-home
DEMO_ENV := AIRFLOW_HOME=$(DEMO_HOME) AIRFLOW__CORE__DAGS_FOLDER=$(CURDIR)/dags
DEMO_EXPORT ?= $(DEMO_HOME)/models
DEMO_CONF ?= {"export": "$(DEMO_EXPORT)"}
DEMO_DATE = $$($(PY) -c 'import datetime as d, sys; from airflow_dlrover.daily import previous_export; \
	e = previous_export(sys.argv[1]); \
	print(d.date.fromisoformat(e[-10:]) + d.timedelta(days=1) if e else d.datetime.now(d.timezone.utc).date())' \
	'$(DEMO_EXPORT)')

demo: $(VENV)/.installed
	mkdir -p $(DEMO_HOME)
	$(DEMO_ENV) $(VENV)/bin/airflow db migrate > /dev/null
	$(DEMO_ENV) $(VENV)/bin/airflow dags test dlrm_daily_retrain $(DEMO_DATE) -c '$(DEMO_CONF)' \
		> $(DEMO_HOME)/dags-test.log 2>&1 \
		|| { tail -50 $(DEMO_HOME)/dags-test.log; echo "the DAG run failed: see $(DEMO_HOME)/dags-test.log"; exit 1; }
	$(DEMO_ENV) $(VENV)/bin/dlrover-rm report dlrm_daily_retrain
	@echo "task logs: $(DEMO_HOME)/dags-test.log; browse it all: $(DEMO_ENV) $(VENV)/bin/airflow standalone"

# The suite's tiers (tests/conftest.py). `make test`, what CI runs: the documentation site's strict
# build first (seconds), then the pure tier on both cores (its tests start no process), then the
# tiers that run processes, on both cores too, a module to a worker (tests/conftest.py, scope_of),
# the slowest 25 printed. `make test-fast`: the pure tier, without PostgreSQL, the check before a commit.
TIERS_WITH_PROCESSES := --tier jobs --tier dag --tier scheduler --tier browser

test: $(VENV)/.installed .venv-dlrover/bin/python
	$(MAKE) --no-print-directory docs-build
	$(PY) -m pytest -q --tier unit -n 2 --durations=25
	$(PY) -m pytest -q $(TIERS_WITH_PROCESSES) -n 2 --dist loadscope --durations=25

test-fast: $(VENV)/.installed
	$(PY) -m pytest -q --tier unit -m "not postgres" -n 2 --durations=10

bench: $(VENV)/.installed
	$(PY) benchmarks/fit_plan.py
	$(PY) benchmarks/accuracy.py

# The documentation site (mkdocs.yml, docs/; the `docs` extra). `make docs` serves it with live reload at
# http://127.0.0.1:8000; `make docs-build` builds it into site/, strict: a broken link or anchor, a page
# missing from the nav or any other warning fails it. The API reference is read from the source by static
# analysis: neither command imports Airflow. NO_MKDOCS_2_WARNING quiets Material's notice about MkDocs 2.
MKDOCS := NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs

docs: $(VENV)/.installed
	$(MKDOCS) serve

docs-build: $(VENV)/.installed
	$(MKDOCS) build --strict --site-dir site

# DLRover 0.6.1 in its own venv (locked by constraints-dlrover.txt), for `python benchmarks/simulate.py
# --policies ...,dlrover`; `make test` builds it so that the real-DLRover tests run.
dlrover-venv: .venv-dlrover/bin/python
.venv-dlrover/bin/python: constraints-dlrover.txt
	$(PYTHON) -m venv .venv-dlrover
	.venv-dlrover/bin/python -m pip install --quiet -c constraints-dlrover.txt dlrover==0.6.1 grpcio protobuf
	touch $@

clean:
	rm -rf $(VENV) .venv-dlrover dlrover-demo airflow-home site .pytest_cache .hypothesis
