# `make demo` and `make test` set themselves up: the first run makes .venv and installs into it.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test bench clean

$(STAMP): setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test,mosek]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m baechi_tf place-json examples/fork_join.json --placement_method m_etf

test: $(STAMP)
	$(PY) -m pytest -q tests

bench: $(STAMP)
	$(PY) bench/placement_scaling.py

clean:
	rm -rf $(VENV) build *.egg-info
