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

.PHONY: lab reset doctor test test-fast test-notebooks test-portable bench gpu-check venv clean zh release zh-check

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
# The edition is chosen only by an explicit setting: `make lab EDITION=zh` opens the Chinese
# edition (notebooks/zh/) with JupyterLab's interface in Chinese; EDITION=en, the default, the
# English. The locale never selects it: on a machine whose LANG is zh_CN.UTF-8, plain `make lab`
# stays English. The literal `LANG=zh`, which is no locale, is kept as the older spelling of
# EDITION=zh; Jupyter then gets LANG=C.UTF-8 (a real locale of the user's is passed on as it is).
# The interface language comes from a settings folder for this launch only
# (JUPYTERLAB_SETTINGS_DIR, under .venv/ so that what JupyterLab saves there stays out of the
# repository), holding the translation setting {"locale": "zh_CN"} copied from
# translations/zh/jupyterlab-settings/; the language pack is in requirements.txt. The English
# edition reads the user's own settings.
#
# Students work in copies: JupyterLab opens my-labs/ (my-labs/zh/ for the Chinese edition), a
# git-ignored folder where each lab is copied, outputs cleared, the first time (tools/
# student_copies.py; a copy that exists is never overwritten), so running a lab, saving it or
# editing an exercise never touches the executed reference in notebooks/. `make reset` restores
# every copy, `make reset LAB=04a_ddp_from_scratch` one of them (EDITION=zh: the Chinese copies).
# JupyterLab's news pop-up and update check are off (tools/jupyterlab/overrides.json, copied into
# the venv's settings): nothing covers the first notebook on a projector, nothing goes online.
EDITION ?= $(if $(filter zh,$(LANG)),zh,en)
ifneq ($(filter lab reset,$(MAKECMDGOALS)),)
ifeq ($(filter en zh,$(EDITION)),)
$(error EDITION must be en or zh; got '$(EDITION)': make lab EDITION=zh opens the Chinese edition)
endif
endif
ifeq ($(EDITION),zh)
LAB_DIR := my-labs/zh
LAB_ENV := $(if $(filter zh,$(LANG)),LANG=C.UTF-8) JUPYTERLAB_SETTINGS_DIR=$(CURDIR)/$(VENV)/jupyterlab-settings-zh
else
LAB_DIR := my-labs
LAB_ENV := $(if $(filter zh,$(LANG)),LANG=C.UTF-8)
endif
ZH_SETTINGS := translations/zh/jupyterlab-settings/@jupyterlab/translation-extension
LAB_OVERRIDES := $(VENV)/share/jupyter/lab/settings/overrides.json

lab: $(STAMP)
ifeq ($(EDITION),zh)
	@mkdir -p $(VENV)/jupyterlab-settings-zh/@jupyterlab/translation-extension
	@cp $(ZH_SETTINGS)/plugin.jupyterlab-settings \
		$(VENV)/jupyterlab-settings-zh/@jupyterlab/translation-extension/
endif
	@mkdir -p $(dir $(LAB_OVERRIDES)) && cp tools/jupyterlab/overrides.json $(LAB_OVERRIDES)
	@$(PY) tools/student_copies.py sync --edition $(EDITION)
	$(LAB_ENV) $(VENV)/bin/jupyter lab --ServerApp.ip=127.0.0.1 --no-browser \
		--ServerApp.root_dir=$(LAB_DIR) $$( [ "$$(id -u)" = 0 ] && echo --allow-root )

reset: $(STAMP)
	$(PY) tools/student_copies.py reset --edition $(EDITION) $(LAB)

# The Chinese edition: notebooks/zh/ built from the English labs and translations/zh/<lab>.po
# (gettext catalogs; tools/zh_catalog.py): the catalogs synced with the English (changed cells
# fuzzy), the notebooks rebuilt, and only the labs whose code changed executed again (the others
# keep their stored outputs). Run it after changing a lab or a translation.
zh: $(STAMP)
	$(PY) tools/zh_catalog.py execute

# The translations' state: errors fail; fuzzy and untranslated cells only warn, with their count
# and English diffs (the Chinese edition shows them under 「译文待更新」).
zh-check: $(STAMP)
	$(PY) tools/zh_catalog.py check
	$(PY) tools/zh_messages.py check

# Before tagging or publishing the site: no fuzzy or untranslated cell, the message catalogs
# complete (msgfmt --check-format included), no English sentence in the Chinese edition's stored
# outputs outside the allow-list of code, names and units (tools/zh_english.py; `-v` lists
# them), the Chinese edition's fast tests.
release: $(STAMP)
	$(PY) tools/zh_catalog.py check --release
	$(PY) tools/zh_messages.py check
	$(PY) tools/zh_english.py
	$(PY) -m pytest tests/test_translation.py tests/test_i18n.py -m "not slow and not browser"

# Unit and multi-process tests, then every notebook under nbval, the Chinese edition
# (notebooks/zh/) included: named explicitly, though pytest would also find it recursively.
# CI (.ci/run, CI=true) runs test-portable next, whose first pass runs the Chinese edition under
# PyTorch's scalar kernels, the stricter check: there `make test` leaves the Chinese notebooks to
# it (their code is token for token the English code, run here), which keeps CI within its time.
TEST_ZH := $(if $(CI),,notebooks/zh/*.ipynb)
test: $(STAMP) zh-check
	$(VENV)/bin/lint-imports
	$(PY) -m pytest tests
	$(PY) -m pytest $(NBVAL) notebooks/*.ipynb $(TEST_ZH)

# No process started (enforced by tests/conftest.py), under a minute.
test-fast: $(STAMP)
	$(VENV)/bin/lint-imports
	$(PY) -m pytest tests -m "not slow and not browser"

test-notebooks: $(STAMP)
	$(PY) -m pytest $(NBVAL) notebooks/*.ipynb notebooks/zh/*.ipynb

# The stored outputs must reproduce on any x86-64 CPU and thread count: nbval with PyTorch's
# scalar kernels, with its AVX2 kernels (whatever this CPU has), and with one thread per rank
# (and in the kernel). The Chinese notebooks run only in the first pass: their code is token for
# token the English code (tools/zh_catalog.py checks it; only comments and printed strings
# differ), which the other two passes already run, so that once is the portability check of
# their own outputs, within CI's time.
test-portable: $(STAMP)
	ATEN_CPU_CAPABILITY=default $(PY) -m pytest $(NBVAL) notebooks/*.ipynb notebooks/zh/*.ipynb
	ATEN_CPU_CAPABILITY=avx2 $(PY) -m pytest $(NBVAL) --ignore=notebooks/zh notebooks
	OMP_NUM_THREADS=1 $(PY) -m pytest $(NBVAL) --ignore=notebooks/zh notebooks

bench: $(STAMP)
	$(PY) -m labutils.bench all

# Is this machine ready for a class? Python, torch, cores, memory, disk, JupyterLab, a Chinese
# font, the UI test's browser and a real 2-rank launch, each with what to fix (under 30 s).
doctor: $(STAMP)
	$(PY) -m labutils.bench.doctor

# A short prepared check for a machine with a GPU (nccl launch, bf16 MFU); exits cleanly without.
gpu-check: $(STAMP)
	$(PY) -m labutils.bench.gpucheck

clean:
	rm -rf $(VENV) .pytest_cache

# Fragments: the browser test (mk/ui.mk) and the static course site (mk/site.mk).
include $(wildcard mk/*.mk)
