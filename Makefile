# The two commands of the README: `make lab` (the main job) and `make test`.
# Both bootstrap themselves (scripts/bootstrap.sh) on a fresh machine.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
# Test files run two at a time, each whole on one worker: most of the suite waits on
# links, timers and process start-up, so on 2 cores 9.4 min became 6.0 min.
TEST_WORKERS ?= 2
PYTEST := $(PY) -m pytest -ra -n $(TEST_WORKERS) --dist loadfile

.PHONY: bootstrap lab test test-quick lint proto bench gpu-check clean-lab

bootstrap:
	@scripts/bootstrap.sh

lab: bootstrap
	$(VENV)/bin/flexcomm lab run $(LAB_ARGS)

test: bootstrap
	$(VENV)/bin/ruff check .
	$(PYTEST) $(PYTEST_ARGS)

# The quick part, for while you work: no test marked slow (lab runs, real gloo
# ranks). CI runs everything (`make test`).
test-quick: bootstrap
	$(PYTEST) -m "not slow" $(PYTEST_ARGS)

lint: bootstrap
	$(VENV)/bin/ruff check .

proto: bootstrap
	$(PY) proto/generate.py

bench: bootstrap
	$(PY) bench/policy.py
	$(PY) bench/compress.py
	$(PY) bench/store.py
	$(PY) bench/hook_overhead.py
	$(PY) bench/lab_workloads.py
	$(PY) bench/agent_load.py
	$(PY) bench/agent_fuzz.py
	$(PY) bench/agent_durability.py
	$(PY) bench/shaper_fidelity.py
	$(PY) bench/looks.py
	$(PY) bench/job_lifecycle.py
	$(PY) bench/quality_measures.py

# The client on CUDA tensors (bench/gpu_check.py), for a machine with an NVIDIA GPU
# and a CUDA build of torch in $(VENV); without a GPU it says so and passes. CI
# does not run it.
gpu-check: bootstrap
	$(PY) bench/gpu_check.py $(GPU_CHECK_ARGS)

clean-lab: bootstrap
	$(VENV)/bin/flexcomm lab clean
