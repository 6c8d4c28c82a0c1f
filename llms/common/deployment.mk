# Shared make logic of every deployment. A deployment's Makefile includes this
# file and may set
#   FETCH_CMD    how to bring its checkpoint (default: scripts/fetch_model.py <dir>)
# Everything else comes from the folder's deployment.json (the file the C++
# programs and the verify adapters read too): the default MODEL and which
# checkpoints `make fetch` can bring. Targets that use the CPU take one
# exclusive lock so concurrent runs do not distort each other's timings.
SHELL := /bin/bash
REPO_ROOT := $(abspath $(dir $(lastword $(MAKEFILE_LIST)))/../..)
DEPLOYMENT := $(notdir $(abspath $(dir $(firstword $(MAKEFILE_LIST)))))
DESCRIPTOR := $(REPO_ROOT)/llms/$(DEPLOYMENT)/deployment.json
BUILD_DIR ?= $(REPO_ROOT)/build
PY := $(REPO_ROOT)/.venv/bin/python
# The one `edgellm` command; this deployment is its preset (--deployment).
BIN := $(BUILD_DIR)/edgellm
PRESET := --deployment $(DEPLOYMENT)
VERIFY_RUNNER := $(REPO_ROOT)/llms/verify/verify_runner.py
RUNNER_ADAPTER := $(DEPLOYMENT).verify_adapter
LOCK := /tmp/edgellm-cpu.lock
# Says so when another timed run holds the lock, then waits for it.
LOCKED := { flock -n $(LOCK) true || echo "[make] waiting for the CPU lock $(LOCK): another timed run holds it" >&2; } && flock -x -w 1800 $(LOCK)

# descriptor_get(python expression over the descriptor d and the MODEL m)
descriptor_get = $(shell python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); m = sys.argv[2]; print($(1))' $(DESCRIPTOR) '$(MODEL)')
ifeq ($(origin MODEL),undefined)
MODEL := $(call descriptor_get,d["default_model"])
endif
# The store directory `make fetch` brings for MODEL (none for a path or an unfetchable choice);
# a "<dir>/model.gguf" entry brings <dir>, which holds the GGUF beside its converted checkpoint.
FETCH_DIR := $(call descriptor_get,(lambda v: v if v in d.get("fetch", d["models"].values()) else "")(d["models"].get(m, "").split("/")[0]))
FETCH_CMD ?= $(PY) $(REPO_ROOT)/scripts/fetch_model.py $(FETCH_DIR)
N_TOKENS ?= 100
THREADS ?= $(shell nproc)
IGNORE_EOS ?= 1
VERIFY_ARGS ?=
HOST ?= 127.0.0.1
PORT ?= 8080
export PYTHONPATH := $(BUILD_DIR)/python:$(REPO_ROOT)/llms:$(REPO_ROOT)
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

# PROMPT reaches the program literally ($5, $HOME, quotes and all) through the
# environment; set but empty is an error there, unset means the default prompt.
ifneq ($(origin PROMPT),undefined)
export EDGELLM_PROMPT := $(value PROMPT)
PROMPT_ARG := --prompt "$$EDGELLM_PROMPT"
endif
SAMPLING_ARGS := $(if $(TEMPERATURE),--temperature '$(TEMPERATURE)') $(if $(TOP_K),--top-k '$(TOP_K)') \
  $(if $(TOP_P),--top-p '$(TOP_P)') $(if $(SEED),--seed '$(SEED)')
# WEIGHTS=q8_0|q4_0 quantizes the checkpoint's matrices at setup (run, profile, chat, verify).
WEIGHTS_ARG = $(if $(WEIGHTS),--weights '$(WEIGHTS)')
# The fast arithmetic is the default; EXACT=1 runs the gate's exact fp32 tier (--exact).
EXACT_ARG = $(if $(filter 1,$(EXACT)),--exact)
MODEL_ARGS = $(PRESET) --model '$(MODEL)' --threads $(THREADS) $(WEIGHTS_ARG) $(EXACT_ARG)
RUN_ARGS = $(MODEL_ARGS) $(PROMPT_ARG) $(SAMPLING_ARGS) $(ARGS)
TIMING_ARGS = --n-tokens $(N_TOKENS) $(if $(filter 1,$(IGNORE_EOS)),--ignore-eos)

.PHONY: help compile fetch run profile chat serve verify verify-full diagnosis stage2-budget quality clean

help:
	@echo "$(DEPLOYMENT) targets:"
	@echo "  compile      build the engine and the edgellm command"
	@echo "  run          answer PROMPT; prints TTFT and TPS over N_TOKENS=$(N_TOKENS) tokens"
	@echo "  profile      the same run with the per-phase and per-kernel time breakdown"
	@echo "  chat         interactive chat with line editing (/help inside; Ctrl-D quits)"
	@echo "  serve        OpenAI-compatible server on HOST=$(HOST) PORT=$(PORT) (Ctrl-C stops)"
	@echo "  verify       gate vs HF transformers bf16 and fp32, every lens (2 prompts x 32 tokens)"
	@echo "  verify-full  the same gate over all prompts (VERIFY_ARGS=--spec-gate: the seed's gate)"
	@echo "  diagnosis    per-layer cosine vs HF bf16 and fp32 for PROMPT, with a plot (informational)"
	@echo "  quality      KLD table of each fast path vs the exact path on the stage-2 corpus"
	@echo "  stage2-budget  measure HF's bf16 floor on the corpus once into llms/verify/stage2_budget.json"
	@echo "  clean        (nothing: the deployment is a preset of the edgellm command)"
	@echo "variables: MODEL=$(MODEL) (a choice of deployment.json or a checkpoint dir), PROMPT,"
	@echo "  N_TOKENS, THREADS=$(THREADS), TEMPERATURE, TOP_K, TOP_P, SEED,"
	@echo "  IGNORE_EOS=$(IGNORE_EOS) (1: time all N_TOKENS even past EOS), ARGS (more flags, e.g. --json),"
	@echo "  WEIGHTS=q8_0|q4_0 (quantize the checkpoint at setup; verify reports the requantized tier),"
	@echo "  EXACT=1 (the exact fp32 tier instead of the fast default; verify checks both stages)"

compile:
	@$(MAKE) --no-print-directory -C $(REPO_ROOT) build

# A MODEL that is a path is the user's own checkpoint: nothing to fetch.
fetch:
	@$(MAKE) --no-print-directory -C $(REPO_ROOT) bootstrap
	@$(if $(FETCH_DIR),$(FETCH_CMD),true)

run: compile fetch
	@$(LOCKED) $(BIN) run $(RUN_ARGS) $(TIMING_ARGS)

profile: compile fetch
	@$(LOCKED) $(BIN) run $(RUN_ARGS) $(TIMING_ARGS) --profile

chat: compile fetch
	@$(BIN) chat $(MODEL_ARGS) $(SAMPLING_ARGS) $(ARGS)

# MODEL: a choice of deployment.json, a checkpoint path or an entry of the model store.
serve: compile fetch
	@$(BIN) serve $(PRESET) --model '$(MODEL)' --host $(HOST) --port $(PORT) --threads $(THREADS) \
	  $(EXACT_ARG) $(if $(CACHE_MB),--cache-mb $(CACHE_MB))

verify: compile fetch
	@$(LOCKED) $(BIN) verify $(PRESET) --model '$(MODEL)' $(WEIGHTS_ARG) -- $(VERIFY_ARGS)

verify-full: compile fetch
	@$(LOCKED) $(BIN) verify $(PRESET) --model '$(MODEL)' --full $(WEIGHTS_ARG) -- $(VERIFY_ARGS)

diagnosis: compile fetch
	@$(LOCKED) $(PY) $(VERIFY_RUNNER) --runner=$(RUNNER_ADAPTER) --prompts single --model '$(MODEL)' $(PROMPT_ARG)

# Stage 2's budget: HF fp32 vs HF bf16 on the corpus, measured once and committed.
stage2-budget: compile fetch
	@$(LOCKED) $(PY) $(VERIFY_RUNNER) --runner=$(RUNNER_ADAPTER) --model '$(MODEL)' --gate-phase floor \
	  --work-dir $$(mktemp -d) --write-budget

# KLD of each fast configuration against the exact path (llms/verify/quality.py).
quality: compile fetch
	@$(LOCKED) $(PY) $(REPO_ROOT)/llms/verify/quality.py --runner=$(RUNNER_ADAPTER) $(QUALITY_ARGS)

clean:
	@echo "$(DEPLOYMENT) builds nothing of its own: make -C $(REPO_ROOT) clean removes the build"
