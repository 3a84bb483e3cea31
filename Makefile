# verl_ext: `make demo` runs the embedded GRPO job on CPU; `make test` runs the whole suite; `make bench` runs
# the benchmarks (shared-prefix forward, n-gram rollout). All set up a virtual environment in $(VENV) on first use.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.verl_ext-installed
RECIPE ?= demo_cpu
ARGS ?=

.PHONY: install demo test bench clean

install: $(INSTALLED)

$(INSTALLED): setup.py constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# The CPU torch wheel first: verl's resolution must not pull a CUDA build.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -c constraints.txt -e '.[test,bench]'
	touch $@

demo: install
	$(BIN)/python -m verl_ext.main --config-name $(RECIPE) $(ARGS)

test: install
	$(BIN)/python -m pytest -q $(ARGS)

bench: install
	$(BIN)/python benchmarks/prefix_grouper.py
	$(BIN)/python benchmarks/ngram_rollout.py

clean:
	rm -rf $(VENV) outputs *.egg-info
