# `make demo` and `make test` set themselves up: the first run makes .venv and installs into it.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# TensorFlow's build, as an extra of baechi_tf: `gpu` (tensorflow[and-cuda]) when nvidia-smi lists a
# GPU, else `cpu` (tensorflow-cpu); tools/tf_extra.sh chooses, in the recipe's shell.
# `make TF_EXTRA=cpu` (or gpu) chooses by hand; `make tf-extra` prints the choice.
TF_EXTRA ?= $$(sh tools/tf_extra.sh)

.PHONY: demo test test-core docs bench bench-optimality clean tf-extra

$(STAMP): Makefile setup.py pyproject.toml tools/tf_extra.sh baechi_tf/placer/native/scheduler.cpp baechi_tf/placer/native/executor.hpp \
		baechi_tf/placer/native/gaps.hpp \
		baechi_tf/placer/native/pieces.hpp baechi_tf/placer/native/sct_policy.hpp \
		baechi_tf/placer/native/windows.hpp
	extra=$(TF_EXTRA); case "$$extra" in cpu|gpu) ;; \
		*) echo "make: TF_EXTRA='$$extra': give cpu or gpu" >&2; exit 2;; esac; \
	$(PYTHON) -m venv $(VENV) && \
	echo "installing baechi_tf[$$extra,test,mosek] into $(VENV)" && \
	$(PY) -m pip install --quiet --disable-pip-version-check -e ".[$$extra,test,mosek]"
	# Keras applications in a tf.compat.v1 graph, for tests/test_grappler.py; --no-deps keeps
	# the TensorFlow build chosen above (tf-keras asks for `tensorflow`).
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps tf-keras==2.21.0
	touch $(STAMP)

# GNMT v2 placed by BaechiSession on four devices, at a size that takes about a minute on a
# 2-core machine without GPUs (examples/gnmt_v2.py without flags is the seed's size).
demo: $(STAMP)
	$(PY) examples/gnmt_v2.py --batch_size=128 --vocab_size=16000 --max_seq_length=32 \
		--rnn_units=256 --num_layers=4 --steps=30

# The whole suite, spread over the machine's cores by pytest-xdist (at most 4 workers: each one
# loads TensorFlow). A test file runs whole on one worker, so that its module fixtures are made
# once. `make test TEST_WORKERS=0` runs it in this one process.
TEST_WORKERS ?= auto
test: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --maxprocesses 4 --dist loadfile tests

# The tests that need no TensorFlow and take under a second each (graph, cluster, placers, m-SCT,
# simulator, JSON), with TensorFlow's import refused: tests/conftest.py defines --core.
test-core: $(STAMP)
	$(PY) -m pytest -q --core tests

# The documentation site, into site/ (tests/test_docs.py builds it too, with --strict).
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

bench: $(STAMP)
	$(PY) bench/placement_scaling.py

# OR-Tools pins an older protobuf than TensorFlow's: CP-SAT gets an environment of its own.
CP_VENV := .venv-cp
$(CP_VENV)/.installed:
	$(PYTHON) -m venv $(CP_VENV)
	$(CP_VENV)/bin/pip install --quiet --disable-pip-version-check ortools==9.11.4210 numpy scipy
	touch $@

bench-optimality: $(CP_VENV)/.installed
	$(CP_VENV)/bin/python bench/optimality.py

tf-extra:
	@echo $(TF_EXTRA)

clean:
	rm -rf $(VENV) $(CP_VENV) build site *.egg-info
