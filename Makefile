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

# GNMT v2 placed by BaechiSession on four devices, at a size that takes about two minutes on a
# 2-core machine without GPUs (examples/gnmt_v2.py without flags is the seed's size).
demo: $(STAMP)
	$(PY) examples/gnmt_v2.py --batch_size=128 --vocab_size=16000 --max_seq_length=32 \
		--rnn_units=256 --num_layers=4 --steps=30

test: $(STAMP)
	$(PY) -m pytest -q tests

bench: $(STAMP)
	$(PY) bench/placement_scaling.py

clean:
	rm -rf $(VENV) build *.egg-info
