# The README's commands. Each creates (or reuses) .venv and installs what it needs.
PYTHON ?= python3
VENV ?= .venv
# torch is installed first and on its own: on a CPU-only machine an open `torch>=2.4` would pull the
# newest CUDA build (~3 GB). Override on a GPU machine, e.g. `make train TORCH_SPEC="torch==2.11.0"`.
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin

.PHONY: install train lint check test bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install "$(TORCH_SPEC)"
	$(BIN)/pip install -e ".[test,bench]"
	touch $@

install: $(VENV)/.installed

train: install
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 $(BIN)/accelerate launch --config_file accelerate_configs/cpu.yaml src/train.py $(ARGS)

# Style first (CI runs this target): ruff, pinned in the test extra, with pyproject.toml's rules; then mypy
# over the whole package: the loop, predict and sample call tasks only through the contract (tasks/contract.py).
lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy src/anytrain

# The suite in two speeds (docs/guide.md, Tests). `make check`, the fast one: ruff, then mypy beside every in-process
# test, i.e. all but those marked `launch` (they start processes; tests/launch_rule.py fails one that is not marked),
# on CHECK_WORKERS pytest-xdist workers, a file to a worker, each test on one torch thread (tests/conftest.py).
# `make test`: lint, the same tests, then the launching tests on LAUNCH_WORKERS workers, a file to a worker, their
# processes on every core (a launch spends much of its time starting processes and importing: 8:43-9:42 on two workers,
# 16:17 one at a time); what CI runs (.ci/run). pytest's exit status 5 (nothing selected, e.g. PYTEST_ARGS names a
# file without launches) is no failure.
CHECK_WORKERS ?= 2
OFFLINE := HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
IN_PROCESS := $(OFFLINE) $(BIN)/python -m pytest -m "not launch" -n $(CHECK_WORKERS) --dist loadfile --no-loadscope-reorder
LAUNCH_WORKERS ?= 2
LAUNCHES := $(OFFLINE) $(BIN)/python -m pytest -m launch -n $(LAUNCH_WORKERS) --dist loadfile --no-loadscope-reorder
# In `make check` mypy runs beside the tests, its report after theirs: without its cache (a clean clone) it reads
# torch's sources for ~25 s, which beside the tests costs about half that.
check: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	{ $(BIN)/mypy src/anytrain > $(VENV)/mypy.log 2>&1; echo $$? > $(VENV)/mypy.status; } & \
	$(IN_PROCESS) $(PYTEST_ARGS); tests=$$?; wait; cat $(VENV)/mypy.log; \
	[ "$$(cat $(VENV)/mypy.status)" = 0 ] && { [ $$tests -eq 0 ] || [ $$tests -eq 5 ]; }

test: lint
	$(IN_PROCESS) --durations=15 $(PYTEST_ARGS) || [ $$? -eq 5 ]
	$(LAUNCHES) --durations=15 $(PYTEST_ARGS) || [ $$? -eq 5 ]

# Benchmark (docs/benchmarks.md): interleaved runs, figures in bench_out/ (JSON, PNG, log), and the
# generated block of docs/benchmarks.md plus docs/benchmarks.png rewritten. BENCH_ARGS="--rounds 1" for a quick look.
bench: install
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 $(BIN)/python benchmarks/bench.py --out bench_out --docs docs $(BENCH_ARGS)

# Lightning, the HF Trainer and TRL for the peers section of `make bench` (left out when not installed).
.PHONY: install-peers
install-peers: install
	$(BIN)/pip install -e ".[peers]"

clean:
	rm -rf $(VENV) runs .pytest_cache

# Single device vs naive vs pipelined model parallelism over a sweep of micro-batch counts:
# table + JSON + PNG in bench_out/model_parallel (see docs/model_parallel.md).
.PHONY: bench-mp
bench-mp: install
	$(BIN)/python benchmarks/model_parallel_bench.py --out bench_out/model_parallel $(ARGS)
