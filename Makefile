# verl_ext: `make demo` runs the embedded GRPO job on CPU; `make test` runs the whole suite; `make bench` runs
# the benchmarks (shared-prefix forward, n-gram rollout); `make defaults` rebuilds the embedded defaults that ship in
# verl_ext/demo/built. All set up a virtual environment in $(VENV) on first use.
# vLLM runs in a second environment, $(VLLM_VENV) (torch 2.11 as vLLM 0.24.0 needs; `make install-vllm`):
# `make test` builds it when missing and runs tests/vllm_engine there; `make demo-vllm` runs demo_cpu_vllm in it.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.verl_ext-installed
VLLM_VENV ?= .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin
VLLM_INSTALLED := $(VLLM_VENV)/.verl_ext-installed
VLLM_WHY_NOT := $(shell scripts/install_vllm_env.sh --why-not)
# The tests' processes share a few cores (two test workers, the GRPO runs beside the vLLM install and the vLLM
# suite): OpenMP threads that wait for work sleep instead of spinning on a core another process needs.
# On 2 cores (2026-12-06): a warm-start step beside one busy process 577 -> 340 ms (CPU 738 -> 335 ms a step);
# the engine and attention tests on two workers 96 -> 72 s. Only how idle threads wait changes, not what they compute.
# `make demo` and `make defaults` leave the default: each runs alone, where a sleeping thread is slow to wake for
# each small operator (the hybrid warm start's step at 60 tokens 311 ms spinning, 471 passive; 10 GRPO steps of the
# demo the same).
SHARED_CORES := OMP_WAIT_POLICY=PASSIVE
RECIPE ?= demo_cpu
# The main suite runs in two parts: tests/integration's real GRPO runs in one process (each run is a Ray cluster of
# its own that keeps both cores busy), then the other tests on pytest-xdist workers, a module at a time each
# (tests/conftest.py). In one process those used one core of two: 485 s there, 322 s on two workers (2026-12-06).
# WORKERS= (empty) runs them in one process. The vLLM suite runs in one process: on two workers it took 313 s
# against 276 s from a fresh clone (each worker imports vLLM to collect, and its GRPO run waits behind that).
XDIST_WORKERS := $(shell n=$$(nproc 2>/dev/null || echo 1); echo $$((n < 8 ? n : 8)))
WORKERS ?= -n $(XDIST_WORKERS) --dist loadscope --no-loadscope-reorder
ARGS ?=
VLLM_ARGS ?=

.PHONY: install install-vllm demo demo-vllm defaults test test-vllm bench bench-e2e clean

install: $(INSTALLED)

# verl 0.9.1 runs on Python 3.10-3.12; PyPI's Linux torch is the CUDA build (GBs), so the CPU wheel comes from a wheel
# folder pip already knows (find-links), else from PyTorch's CPU index, before anything can pull the other one.
# Why torch 2.13 here and not verl[vllm]'s 2.11.0: no registry CI reaches serves 2.11.0's CPU wheel, and PyPI's CUDA
# build makes an environment of 7.0 GB against this one's 2.4 GB (2026-12-07). The vLLM environment is that stack
# (torch 2.11.0, transformers 5.9.0), and `make test-vllm` runs the grouped forward, the HF rollout and a GRPO run in it.
TORCH_CPU_INDEX := https://download.pytorch.org/whl/cpu
$(INSTALLED): setup.py constraints.txt
	@$(PYTHON) -c 'import sys; sys.exit(not (3, 10) <= sys.version_info[:2] <= (3, 12))' || { echo "verl_ext needs \
	Python 3.10-3.12 (verl 0.9.1's bound), and $(PYTHON) is $$($(PYTHON) --version 2>&1); run make with \
	PYTHON=python3.11 (or 3.10, 3.12)."; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet --no-index --no-deps torch==2.13.0 2>/dev/null || \
		$(BIN)/pip install --quiet --no-deps --index-url $(TORCH_CPU_INDEX) torch==2.13.0
	$(BIN)/pip install --quiet torch==2.13.0  # its dependencies
	$(BIN)/pip install --quiet -c constraints.txt -e '.[test,bench]'
	touch $@

install-vllm: $(VLLM_INSTALLED)

$(VLLM_INSTALLED): setup.py constraints-vllm.txt scripts/install_vllm_env.sh shims/vllm_cpu/pyproject.toml \
		shims/vllm_cpu/vllm_cpu_shims.py
	scripts/install_vllm_env.sh $(VLLM_VENV)
	touch $@

demo: install
	$(BIN)/python -m verl_ext.main --config-name $(RECIPE) $(ARGS)

# Rebuild the shipped embedded defaults in place (25 minutes and more on 2 cores), each continued build after its base;
# commit verl_ext/demo/built afterwards. Needed after a change to the task, tokenizer, model or warm start
# (verl_ext/demo/build.py's BUILD_VERSION); a run refuses a shipped build its code would not make, naming this.
# A build's stamp records the float path, the warm start's seed and the versions it was made with; a rebuild starts
# from the seed the shipped build was made from (the hybrid's: 7, on an AMD EPYC with AVX2).
SHIPPED_PROFILES := full long hybrid
defaults: install
	for profile in $(SHIPPED_PROFILES); do \
		$(BIN)/python -m verl_ext.demo.build --profile $$profile --rebuild $(ARGS) || exit 1; done

demo-vllm:
ifneq ($(VLLM_WHY_NOT),)
	@echo "verl_ext: actor_rollout_ref.rollout.name=vllm on CPU: $(VLLM_WHY_NOT)."; exit 1
endif
	$(MAKE) --no-print-directory install-vllm
	$(SHARED_CORES) $(VLLM_BIN)/python -m verl_ext.main --config-name demo_cpu_vllm $(ARGS)

# Both suites run whatever the first gives; `make test` fails if either does. The vLLM environment builds in the
# background while the main suite runs (mostly downloads and unpacking), its log in $(VLLM_VENV).log, and the vLLM
# suite then runs there too, beside the main suite's GRPO runs (each run's start-up leaves a core idle for long
# stretches, and so does the vLLM suite: 1.6 and 1.3 of 2 cores busy one after the other, 2026-12-06); its output
# is printed once the main suite is done. Where the environment did not build, test-vllm builds it again in the
# foreground and says why. --durations: CI's log names the slowest tests (the whole run must stay under 25 minutes
# on 2 cores). The suite reads the shipped embedded defaults; it builds only the unit tests' tiny profile. A part that
# ARGS leaves empty (pytest's exit 5, no tests selected) is not a failure.
VLLM_TESTED := $(VLLM_VENV).tested
VLLM_ENV_ONLY := --ignore=tests/vllm_engine --ignore=tests/verls_stack  # the folders test-vllm runs
MAIN_PYTHON := $(SHARED_CORES) $(BIN)/python
test: install
	@rm -f $(VLLM_TESTED) $(VLLM_TESTED).log; \
	if [ -z "$(VLLM_WHY_NOT)$(VERL_EXT_SKIP_VLLM)" ]; then \
		{ $(MAKE) --no-print-directory install-vllm > $(VLLM_VENV).log 2>&1 && \
		  { $(MAKE) --no-print-directory test-vllm > $(VLLM_TESTED).log 2>&1; echo $$? > $(VLLM_TESTED); }; } & fi; \
	main=0; \
	$(MAIN_PYTHON) -m pytest -q -m grpo_runs --durations=8 $(VLLM_ENV_ONLY) $(ARGS) \
		|| { rc=$$?; [ $$rc = 5 ] || main=$$rc; }; \
	$(MAIN_PYTHON) -m pytest -q $(WORKERS) -m "not grpo_runs" --durations=8 $(VLLM_ENV_ONLY) $(ARGS) \
		|| { rc=$$?; [ $$rc = 5 ] || main=$$rc; }; \
	wait; vllm=0; \
	if [ -f $(VLLM_TESTED) ]; then cat $(VLLM_TESTED).log; vllm=$$(cat $(VLLM_TESTED)); \
	else $(MAKE) --no-print-directory test-vllm || vllm=$$?; fi; \
	test $$main = 0 -a $$vllm = 0 || { echo "make test failed: main suite exit $$main, vLLM suite exit $$vllm"; exit 1; }

# The vLLM suite skips, with one line, only where vLLM's CPU build cannot run (verl_ext/platform/vllm_cpu.py: the
# platform and processor flags) or where VERL_EXT_SKIP_VLLM is set (CI never sets it). Elsewhere an environment
# that does not build, or whose extension does not load (the probe, in a child process), fails with the reason.
# That environment is the stack `pip install 'verl[vllm]==0.9.1'` gives GPU users (torch 2.11.0, transformers 5.9.0),
# so the suite also runs there the grouped forward (model level and through verl's FSDP engine, LoRA included) and
# the HF rollout engine, which the main environment runs on torch 2.13 (its GRPO run: test_demo_cpu_vllm).
# tests/verls_stack runs only here: a LoRA GRPO step pair (411 s beside the main suite's GRPO runs, 2026-12-08), which
# this suite has room for before those end (the whole suite 1413 s against their 1736 s).
VERLS_STACK_TESTS := tests/attention/test_grouped_equivalence.py tests/workers/test_grouped_engine.py \
	tests/workers/test_grouped_engine_lora.py tests/rollout/test_engine.py tests/verls_stack
test-vllm:
ifneq ($(VERL_EXT_SKIP_VLLM),)
	@echo "vLLM tests skipped: VERL_EXT_SKIP_VLLM is set"
else ifeq ($(VLLM_WHY_NOT),)
	$(MAKE) --no-print-directory install-vllm
	@broken=$$($(PYTHON) verl_ext/platform/vllm_cpu.py --probe $(VLLM_BIN)/python) || \
		{ echo "the vLLM environment $(VLLM_VENV) is broken: $$broken (rebuild it: rm -rf $(VLLM_VENV); make install-vllm)"; exit 1; }
	$(SHARED_CORES) $(VLLM_BIN)/python -m pytest -q --durations=10 tests/vllm_engine tests/test_numba_cache_locator.py \
		$(VERLS_STACK_TESTS) $(VLLM_ARGS)
else
	@echo "vLLM tests skipped: $(VLLM_WHY_NOT)"
endif

bench: install
	$(BIN)/python benchmarks/prefix_grouper.py
	$(BIN)/python benchmarks/ngram_rollout.py

# grpo_baseline vs demo_cpu, the same steps each: step, rollout phase by where its time goes, actor passes
bench-e2e: install
	$(BIN)/python benchmarks/e2e.py $(ARGS)

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(VLLM_VENV).log $(VLLM_TESTED)* outputs *.egg-info
