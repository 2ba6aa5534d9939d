# Two commands do all the set-up: `make lab` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --quiet --disable-pip-version-check
STAMP := $(VENV)/.installed
NBVAL := --nbval --nbval-current-env --nbval-cell-timeout=600 --nbval-sanitize-with tests/nbval_sanitize.cfg -p no:randomly

# Which torch build: `cpu` (default; on Linux x86-64 the `+cpu` wheel, about 200 MB, from
# PyTorch's CPU index; elsewhere the standard wheel) or `cuda` (PyPI's build: on Linux the
# CUDA one, about 2.7 GB with its nvidia packages). Change it on a fresh venv:
# `make clean && make lab TORCH=cuda`.
TORCH ?= cpu
TORCH_CPU_INDEX := https://download.pytorch.org/whl/cpu

.PHONY: lab test test-fast test-notebooks test-portable bench gpu-check venv clean

venv: $(STAMP)

# Reinstall only when requirements.txt changed (the stamp is its copy).
$(STAMP): requirements.txt pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@# torch alone first, without its dependencies, so that only torch is looked up on
	@# PyTorch's index (where it cannot be reached, pip warns and takes a local wheel that
	@# satisfies the pin); then everything, torch's dependencies included, from the default index.
ifeq ($(TORCH),cuda)
	$(PIP) torch==2.13.0
	$(PIP) -r <(grep -vE '^torch==' requirements.txt)
else ifeq ($(TORCH),cpu)
	$(PIP) --no-deps --extra-index-url $(TORCH_CPU_INDEX) -r <(grep -E '^torch==' requirements.txt)
	$(PIP) -r requirements.txt
else
	$(error TORCH must be cpu or cuda; got '$(TORCH)')
endif
	$(PY) -c "import torch, sys; sys.exit(0 if torch.__version__.startswith('2.13.0') else \
		'torch ' + torch.__version__ + ' installed, 2.13.0 pinned: make clean, then make again')"
	@# The course's library in development mode (pyproject.toml): `import labutils` works from
	@# notebooks/ and from the ranks, and edits to labutils/ take effect without reinstalling.
	$(PIP) --no-deps --no-build-isolation -e .
	@cp requirements.txt $(STAMP)

# JupyterLab on 127.0.0.1 only; the token is kept (it is printed in the log with the URL).
lab: $(STAMP)
	$(VENV)/bin/jupyter lab --ServerApp.ip=127.0.0.1 --no-browser --ServerApp.root_dir=notebooks \
		$$( [ "$$(id -u)" = 0 ] && echo --allow-root )

# Unit and multi-process tests, then every notebook under nbval. CI (.ci/run) also runs
# test-portable.
test: $(STAMP)
	$(VENV)/bin/lint-imports
	$(PY) -m pytest tests
	$(PY) -m pytest $(NBVAL) notebooks

# No process started (enforced by tests/conftest.py), under a minute.
test-fast: $(STAMP)
	$(VENV)/bin/lint-imports
	$(PY) -m pytest tests -m "not slow and not browser"

test-notebooks: $(STAMP)
	$(PY) -m pytest $(NBVAL) notebooks

# The stored outputs must reproduce on any x86-64 CPU and thread count: nbval with PyTorch's
# scalar kernels, with its AVX2 kernels (whatever this CPU has), and with one thread per rank
# (and in the kernel).
test-portable: $(STAMP)
	ATEN_CPU_CAPABILITY=default $(PY) -m pytest $(NBVAL) notebooks
	ATEN_CPU_CAPABILITY=avx2 $(PY) -m pytest $(NBVAL) notebooks
	OMP_NUM_THREADS=1 $(PY) -m pytest $(NBVAL) notebooks

bench: $(STAMP)
	$(PY) -m labutils.bench all

# A short prepared check for a machine with a GPU (nccl launch, bf16 MFU); exits cleanly without.
gpu-check: $(STAMP)
	$(PY) -m labutils.bench.gpucheck

clean:
	rm -rf $(VENV) .pytest_cache

# Fragments: the browser test (mk/ui.mk) and the static course site (mk/site.mk).
include $(wildcard mk/*.mk)
