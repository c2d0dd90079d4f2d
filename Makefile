# Set-up and the commands a new user runs. `make serve` installs pegainfer and its run-time dependencies
# only; `make test` adds the test extras (transformers, triton, matplotlib, hypothesis, openai, ...).
#
# torch comes first, from PyTorch's CPU wheel index (TORCH_INDEX), so that pip does not pull the CUDA
# build and its nvidia-* wheels (several GB) onto a machine without a GPU. Where that index cannot be
# reached (offline, a proxy), the same pin is installed from pip's configured index instead, with a
# warning: on PyPI that is the CUDA build. README.md "Quick start" gives the sizes.
# On a GPU host: make install TORCH_INDEX=https://download.pytorch.org/whl/cu128 (or TORCH_INDEX= for
# pip's own index); the torch step runs once per venv (`make clean` to redo it).
VENV ?= .venv
PY := $(VENV)/bin/python
PIP_INSTALL := $(PY) -m pip install -q --disable-pip-version-check
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
PYTEST_ARGS ?=

.PHONY: install install-test serve generate test clean

$(VENV)/.torch:
	python3 -m venv $(VENV)
	@if [ -n "$(TORCH_INDEX)" ] && $(PIP_INSTALL) --index-url "$(TORCH_INDEX)" --timeout 15 --retries 0 "$(TORCH_SPEC)"; then :; \
	else \
	  [ -z "$(TORCH_INDEX)" ] || echo "make: warning: $(TORCH_INDEX) failed; installing $(TORCH_SPEC) from pip's configured index (on PyPI: the CUDA build, ~0.5 GB plus several GB of nvidia-* wheels)" >&2; \
	  $(PIP_INSTALL) "$(TORCH_SPEC)"; \
	fi
	@$(PY) -c "import importlib.metadata as m; v = m.version('torch'); print('make: torch', v, '(the CPU build)' if v.endswith('+cpu') else '')"
	touch $@

$(VENV)/.installed: pyproject.toml $(VENV)/.torch
	$(PIP_INSTALL) -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(PIP_INSTALL) -e '.[test]'
	touch $@

install: $(VENV)/.installed

install-test: $(VENV)/.installed-test

serve: install
	$(VENV)/bin/pegainfer serve

generate: install
	$(VENV)/bin/pegainfer generate --prompt "class Parser:" --max-tokens 32 --json

test: install-test
	$(PY) -m pytest -q $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
