# The two commands of the README: `make demo` (the main job) and `make test`.
# Each creates .venv from the committed lock (constraints.txt) when it is missing or stale.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
export AIRFLOW__CORE__LOAD_EXAMPLES ?= False

.PHONY: demo test bench clean

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[test]'
	touch $@

demo: $(VENV)/.installed
	$(VENV)/bin/dlrover-rm demo --out dlrover-demo

test: $(VENV)/.installed
	$(PY) -m pytest -q

bench: $(VENV)/.installed
	$(PY) benchmarks/fit_plan.py
	$(PY) benchmarks/accuracy.py

clean:
	rm -rf $(VENV) dlrover-demo .pytest_cache .hypothesis
