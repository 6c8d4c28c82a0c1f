# edgellm top level. Quick start on a fresh machine: `make run`, then `make test`.
SHELL := /bin/bash
PY := .venv/bin/python
BUILD_DIR := build
DEFAULT_DEPLOYMENT := llms/smollm2_135m
# Models the test suite needs (fetched and converted once into the model store).
TEST_MODELS := smollm2-135m-instruct gemma3-270m

.PHONY: help bootstrap build fetch run serve test test-cpp test-py bench bench-serve format lint clean

help:
	@echo "make run        set up, build, fetch SmolLM2-135M-Instruct and run it (N_TOKENS, PROMPT, MODEL, THREADS)"
	@echo "make serve      OpenAI-compatible server for the default deployment (HOST, PORT, MODEL)"
	@echo "make test       C++ unit tests (ctest), then pytest (end to end, gate, mutants, bad input)"
	@echo "make bench      side-by-side benchmark against peers (docs/benchmarks.md)"
	@echo "make bench-serve  server throughput, 8 streams vs 1 (docs/benchmarks.md, serving section)"
	@echo "make format     clang-format the C++ and ruff-format the Python"
	@echo "make lint       ruff check"
	@echo "deployments:    make -C llms/<model> help"

bootstrap:
	@bash scripts/bootstrap.sh

build: bootstrap
	@if [ ! -f $(BUILD_DIR)/build.ninja ]; then \
	  cmake -S . -B $(BUILD_DIR) -G Ninja -DPython_EXECUTABLE=$(CURDIR)/.venv/bin/python >/dev/null; fi
	@cmake --build $(BUILD_DIR) -- --quiet

fetch: bootstrap
	@for m in $(TEST_MODELS); do $(PY) scripts/fetch_model.py $$m || exit 1; done

run:
	@$(MAKE) --no-print-directory -C $(DEFAULT_DEPLOYMENT) run

serve:
	@$(MAKE) --no-print-directory -C $(DEFAULT_DEPLOYMENT) serve

test: build fetch test-cpp test-py

test-cpp:
	cd $(BUILD_DIR) && ctest --output-on-failure -j2

test-py:
	$(PY) -m pytest -q

bench: build fetch
	$(PY) bench/run_bench.py

bench-serve: build fetch
	$(PY) bench/serve_bench.py --out docs/benchmarks.md

format:
	clang-format -i $$(git ls-files '*.cpp' '*.h')
	$(PY) -m ruff format .

lint:
	$(PY) -m ruff check .

clean:
	rm -rf $(BUILD_DIR)
