# Shared make logic of every deployment. A deployment's Makefile sets
#   DEPLOYMENT   folder name under llms/ (the binary is $(DEPLOYMENT)_inference)
#   STORE_MODELS checkpoints to fetch into the model store for the default MODEL
#   FETCH_CMD    (optional) how to bring them; default: scripts/fetch_model.py
#   MODEL        (optional) default --model choice; default: instruct
# and includes this file. Targets that use the CPU take one exclusive lock so
# concurrent runs do not distort each other's timings.
SHELL := /bin/bash
REPO_ROOT := $(abspath $(dir $(lastword $(MAKEFILE_LIST)))/../..)
BUILD_DIR ?= $(REPO_ROOT)/build
PY := $(REPO_ROOT)/.venv/bin/python
BIN := $(BUILD_DIR)/$(DEPLOYMENT)_inference
VERIFY_RUNNER := $(REPO_ROOT)/llms/verify/verify_runner.py
RUNNER_ADAPTER := $(DEPLOYMENT).verify_adapter
LOCK := /tmp/edgellm-cpu.lock
LOCKED := flock -x -w 1800 $(LOCK)

FETCH_CMD ?= $(PY) $(REPO_ROOT)/scripts/fetch_model.py $(STORE_MODELS)
N_TOKENS ?= 100
PROMPT ?=
MODEL ?= instruct
THREADS ?= $(shell nproc)
HOST ?= 127.0.0.1
PORT ?= 8080
export PROMPT
export PYTHONPATH := $(BUILD_DIR)/python:$(REPO_ROOT)/llms:$(REPO_ROOT)
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

PROMPT_ARG = $${PROMPT:+--prompt "$$PROMPT"}
RUN_ARGS = --model $(MODEL) --threads $(THREADS) $(PROMPT_ARG)

.PHONY: help compile fetch run profile chat serve verify verify-full diagnosis clean

help:
	@echo "$(DEPLOYMENT) targets:"
	@echo "  compile      build the engine and $(notdir $(BIN))"
	@echo "  run          generate N_TOKENS=$(N_TOKENS) tokens for PROMPT; prints TTFT and TPS"
	@echo "  profile      per-phase and per-kernel time breakdown"
	@echo "  chat         interactive REPL (Ctrl-D to quit)"
	@echo "  serve        OpenAI-compatible server on HOST=$(HOST) PORT=$(PORT) (Ctrl-C stops)"
	@echo "  verify       top-5 token gate vs HF transformers bf16 (2 prompts x 32 tokens)"
	@echo "  verify-full  the gate over all prompts, teacher-forced lens gating too"
	@echo "  diagnosis    per-layer cosine vs HF (informational)"
	@echo "  clean        remove the binary"
	@echo "variables: MODEL=$(MODEL) (a choice or a checkpoint dir), PROMPT, N_TOKENS, THREADS=$(THREADS)"

compile:
	@$(MAKE) --no-print-directory -C $(REPO_ROOT) build

# A MODEL that is a path is the user's own checkpoint: nothing to fetch.
fetch:
	@$(MAKE) --no-print-directory -C $(REPO_ROOT) bootstrap
	@$(if $(findstring /,$(MODEL)),true,$(FETCH_CMD))

run: compile fetch
	@$(LOCKED) $(BIN) $(RUN_ARGS) --n-tokens $(N_TOKENS)

profile: compile fetch
	@$(LOCKED) $(BIN) $(RUN_ARGS) --n-tokens 20 --profile

chat: compile fetch
	@$(BIN) $(RUN_ARGS) --chat

# The server takes a checkpoint directory or its name in the model store.
serve: compile fetch
	@$(BUILD_DIR)/edgellm_server --model $(if $(findstring /,$(MODEL)),$(MODEL),$(firstword $(STORE_MODELS))) \
	  --host $(HOST) --port $(PORT) --threads $(THREADS)

verify: compile fetch
	@$(LOCKED) $(PY) $(VERIFY_RUNNER) --runner=$(RUNNER_ADAPTER) --prompts topk_token --model $(MODEL) --max-prompts 2

verify-full: compile fetch
	@$(LOCKED) $(PY) $(VERIFY_RUNNER) --runner=$(RUNNER_ADAPTER) --prompts topk_token --model $(MODEL) --all-steps

diagnosis: compile fetch
	@$(LOCKED) $(PY) $(VERIFY_RUNNER) --runner=$(RUNNER_ADAPTER) --prompts single --model $(MODEL)

clean:
	rm -f $(BIN)
