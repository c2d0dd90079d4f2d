# Set-up and the commands a new user runs. The CPU build of torch is pinned first so that pip never
# pulls several GB of CUDA wheels on a machine without a GPU; override TORCH_SPEC on a GPU host.
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0
PYTEST_ARGS ?=

.PHONY: install serve generate test clean

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check "$(TORCH_SPEC)"
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test]'
	touch $@

install: $(VENV)/.installed

serve: install
	$(VENV)/bin/pegainfer serve

generate: install
	$(VENV)/bin/pegainfer generate --prompt "The capital of France is" --max-tokens 16 --json

test: install
	$(PY) -m pytest -q $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
