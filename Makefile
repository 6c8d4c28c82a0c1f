# edgellm top level. Quick start on a fresh machine: `make run`, then `make test`.
SHELL := /bin/bash
PY := .venv/bin/python
BUILD_DIR := build
DEFAULT_DEPLOYMENT := llms/smollm2_135m
# Models the test suite needs (fetched and converted once into the model store).
TEST_MODELS := smollm2-135m-instruct gemma3-270m

SAN_DIR := build-sanitize
FUZZ_DIR := build-fuzz
FUZZ_SECONDS ?= 10
BENCH_REPS ?= 3
comma := ,
PREFIX ?= /usr/local
# Ray (docs/scale_out.md): RAY_ADDRESS empty = a local single-node cluster, dashboard off.
RAY_ADDRESS ?=
SWEEP ?= smollm2_135m:instruct:instruct smollm2_135m:instruct:heldout_instruct \
  gemma3_270m:base:base gemma3_270m:base:heldout_base
SWEEP_ARGS ?= --max-prompts 2
LOCK := /tmp/edgellm-cpu.lock
LOCKED := { flock -n $(LOCK) true || echo "[make] waiting for the CPU lock $(LOCK): another timed run holds it" >&2; } && flock -x -w 1800 $(LOCK)
# ccache for all three builds; the base dir makes a fresh clone elsewhere hit the same entries.
export CCACHE_BASEDIR := $(CURDIR)
export CCACHE_NOHASHDIR := true
CMAKE_LAUNCHER = $(if $(shell command -v ccache),-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
RAY_ENV := PYTHONPATH=$(CURDIR)/build/python:$(CURDIR)/llms:$(CURDIR) HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

.PHONY: help bootstrap build install fetch run serve serve-ray verify-sweep test test-cpp test-py test-sanitize build-sanitize \
  build-fuzz fuzz bench bench-peers bench-sizes peers bench-serve quality format lint clean

help:
	@echo "make run        set up, build, fetch SmolLM2-135M-Instruct and run it (PROMPT, N_TOKENS, MODEL, THREADS,"
	@echo "                TEMPERATURE, TOP_K, TOP_P, SEED, ARGS=--json; make -C llms/<model> help)"
	@echo "make install    put the edgellm command into PREFIX/bin (PREFIX=$(PREFIX)); edgellm --help"
	@echo "make serve      OpenAI-compatible server for the default deployment (HOST, PORT, MODEL)"
	@echo "make serve-ray  the same API on Ray Serve: REPLICAS=2 THREADS=<per replica> (RAY_ADDRESS, docs/scale_out.md)"
	@echo "make verify-sweep  the gate of every SWEEP job as Ray tasks, one table (RAY_ADDRESS, SWEEP_ARGS)"
	@echo "make test       C++ unit tests (ctest), then pytest (end to end, gate, mutants, bad input)"
	@echo "make test-sanitize  C++ tests + a short smollm2 run built with ASan+UBSan ($(SAN_DIR))"
	@echo "make fuzz       every libFuzzer target in engine/fuzz for FUZZ_SECONDS each (default $(FUZZ_SECONDS))"
	@echo "make bench      side-by-side benchmark against peers (docs/benchmarks.md)"
	@echo "make bench-peers  ours vs llama.cpp (built natively in .venv-peers) and HF bf16, each model's GGUF"
	@echo "make bench-sizes  ours vs llama.cpp on real-shape random-weight GGUFs, 1.5B to 30B-A3B (RUNGS=shape:type,...)"
	@echo "make bench-serve  server throughput, 8 streams vs 1 (docs/benchmarks.md, serving section)"
	@echo "make quality    KLD of each fast configuration vs the exact path (docs/quality.md)"
	@echo "make format     clang-format the C++ and ruff-format the Python"
	@echo "make lint       ruff check"
	@echo "deployments:    make -C llms/<model> help"

bootstrap:
	@bash scripts/bootstrap.sh

build: bootstrap
	@if [ ! -f $(BUILD_DIR)/build.ninja ]; then \
	  cmake -S . -B $(BUILD_DIR) -G Ninja $(CMAKE_LAUNCHER) -DPython_EXECUTABLE=$(CURDIR)/.venv/bin/python >/dev/null; fi
	@cmake --build $(BUILD_DIR) -- --quiet

# The `edgellm` command (and the C++ library, headers and CMake package) into PREFIX.
install: build
	cmake --install $(BUILD_DIR) --prefix $(PREFIX)

fetch: bootstrap
	@for m in $(TEST_MODELS); do $(PY) scripts/fetch_model.py $$m || exit 1; done

run:
	@$(MAKE) --no-print-directory -C $(DEFAULT_DEPLOYMENT) run

serve:
	@$(MAKE) --no-print-directory -C $(DEFAULT_DEPLOYMENT) serve

# The OpenAI API on Ray Serve (llms/serve_ray): REPLICAS model replicas of THREADS engine threads
# each (default: cores / REPLICAS); MIN_REPLICAS + MAX_REPLICAS turn autoscaling on.
REPLICAS ?= 1
HOST ?= 127.0.0.1
PORT ?= 8080
# MODEL as `make serve` reads it: a choice of the default deployment's descriptor, or a path.
SERVE_MODEL = $(shell python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); m = sys.argv[2] or d["default_model"]; print(d["models"].get(m, m))' $(DEFAULT_DEPLOYMENT)/deployment.json '$(MODEL)')
serve-ray: build fetch
	@cd llms && env $(RAY_ENV) ../$(PY) -m serve_ray --model '$(SERVE_MODEL)' --replicas $(REPLICAS) \
	  --host $(HOST) --port $(PORT) $(if $(THREADS),--threads $(THREADS)) \
	  $(if $(CACHE_MB),--cache-mb $(CACHE_MB)) \
	  $(if $(RAY_ADDRESS),--address $(RAY_ADDRESS)) \
	  $(if $(MAX_REPLICAS),--min-replicas $(or $(MIN_REPLICAS),1) --max-replicas $(MAX_REPLICAS)) $(ARGS)

# A sweep of verify jobs (DEPLOYMENT:MODEL:PROMPT_SET) as Ray tasks: llms/verify/sweep.py.
verify-sweep: build fetch
	@$(LOCKED) env $(RAY_ENV) $(PY) llms/verify/verify_runner.py --ray $(RAY_ADDRESS) \
	  $(foreach j,$(SWEEP),--job $(j)) $(SWEEP_ARGS)

test: build fetch test-cpp test-py

test-cpp:
	cd $(BUILD_DIR) && ctest --output-on-failure -j2

# pytest-xdist workers: the suite idles half its time (servers, Ray, process start-up), so one
# per core, at most 4 (each holds a model or two in memory). TEST_WORKERS=0 runs it in-process.
TEST_WORKERS ?= $(shell n=$$(nproc); echo $$(( n < 4 ? n : 4 )))
test-py:
	$(PY) -m pytest -q --durations=25 -n $(TEST_WORKERS) --no-loadscope-reorder

build-sanitize: bootstrap
	@if [ ! -f $(SAN_DIR)/build.ninja ]; then \
	  cmake -S . -B $(SAN_DIR) -G Ninja $(CMAKE_LAUNCHER) -DCMAKE_BUILD_TYPE=Debug -DEDGELLM_SANITIZE=ON \
	    -DPython_EXECUTABLE=$(CURDIR)/.venv/bin/python >/dev/null; fi
	@cmake --build $(SAN_DIR) --target edgellm_tests edgellm_cli -- --quiet

# ASan/UBSan abort on the first report; LeakSanitizer runs too.
test-sanitize: build-sanitize fetch
	cd $(SAN_DIR) && ctest --output-on-failure -j2
	$(SAN_DIR)/edgellm run -n 8 -c 256 -p "Name a color."

build-fuzz: bootstrap
	@if [ ! -f $(FUZZ_DIR)/build.ninja ]; then \
	  cmake -S . -B $(FUZZ_DIR) -G Ninja $(CMAKE_LAUNCHER) -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=Debug \
	    -DEDGELLM_SANITIZE=ON -DEDGELLM_FUZZ=ON \
	    -DPython_EXECUTABLE=$(CURDIR)/.venv/bin/python >/dev/null; fi
	@cmake --build $(FUZZ_DIR) --target fuzz_targets -- --quiet

# Each target runs FUZZ_SECONDS from its checked-in seeds (engine/fuzz/corpus/<name>), one per core;
# what it discovers goes to $(FUZZ_DIR)/work/<name>, its log beside it, and an
# input that crashes to $(FUZZ_DIR)/crashes/.
fuzz: build-fuzz
	@bash scripts/fuzz.sh $(FUZZ_DIR) $(FUZZ_SECONDS)

# SmolLM2 and Gemma 3 at 32..4096 tokens, then the Llama-3.2-1B fixture (made on first use,
# 2.5 GB) at 32..2048 with its weights also quantized at setup (q8_0), each beside HF bf16.
BENCH_1B := --model models/llama32-1b-fixture --lengths 32,128,512,2048 --decode-after 32,512 --weights q8_0
bench: build fetch
	$(PY) bench/run_bench.py --reps $(BENCH_REPS)
	@$(MAKE) --no-print-directory -C llms/llama32_1b fixture
	flock -x /tmp/edgellm-cpu.lock $(PY) bench/run_bench.py $(BENCH_1B) --reps $(BENCH_REPS) --no-hf-float32

# llama.cpp as a peer, built natively (its own venv: the project's .venv stays free of it), on
# each model's own GGUF file, beside ours (bf16 and GGUF) and HF bf16 in the same run.
PEERS_VENV := .venv-peers
LLAMA_CPP_PYTHON := llama-cpp-python==0.3.36
peers:
	@if ! $(PEERS_VENV)/bin/python -c 'import llama_cpp' 2>/dev/null; then \
	  echo "[peers] building $(LLAMA_CPP_PYTHON) natively into $(PEERS_VENV) (several minutes)"; \
	  python3 -m venv $(PEERS_VENV) && CMAKE_ARGS="-DGGML_NATIVE=ON" $(PEERS_VENV)/bin/pip install -q \
	    $(LLAMA_CPP_PYTHON) $$(grep -E '^(tokenizers|numpy)==' requirements.txt); fi

bench-peers: build fetch peers
	@for m in smollm2-135m-instruct gemma3-270m; do \
	  flock -x /tmp/edgellm-cpu.lock $(PY) bench/run_bench.py --model models/$$m --gguf gguf=models/$$m/gguf/model.gguf \
	    --reps $(BENCH_REPS) --no-hf-float32 || exit 1; done

# The size ladder: random-weight GGUFs of real shapes (written on first use, models/shapes/,
# 1-17 GB each) run by us and llama.cpp in one run; RUNGS=shape:type,... picks some.
bench-sizes: build fetch peers
	flock -x /tmp/edgellm-cpu.lock $(PY) bench/size_ladder.py --reps $(BENCH_REPS) \
	  $(foreach r,$(subst $(comma), ,$(RUNGS)),--rung $(r))

# KLD of each fast configuration vs the exact path, every deployment with a fetched model
# (docs/quality.md holds the last run's tables).
quality: build fetch
	@for d in smollm2_135m gemma3_270m; do \
	  $(MAKE) --no-print-directory -C llms/$$d quality || exit 1; done

bench-serve: build fetch
	$(PY) bench/serve_bench.py --out docs/benchmarks.md

format:
	clang-format -i $$(git ls-files '*.cpp' '*.h')
	$(PY) -m ruff format .

lint:
	$(PY) -m ruff check .

clean:
	rm -rf $(BUILD_DIR) $(SAN_DIR) $(FUZZ_DIR)
