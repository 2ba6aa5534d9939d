# Two commands do all the set-up: `make lab` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
NBVAL := --nbval --nbval-current-env --nbval-cell-timeout=600 --nbval-sanitize-with tests/nbval_sanitize.cfg -p no:randomly

.PHONY: lab test test-fast test-notebooks bench gpu-check venv clean

venv: $(STAMP)

# Reinstall only when requirements.txt changed (the stamp is its copy).
$(STAMP): requirements.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	@# Make `import labutils` work from notebooks/ and from the ranks, without a build step.
	@echo "$(CURDIR)" > "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/labutils-dev.pth"
	@cp requirements.txt $(STAMP)

# JupyterLab on 127.0.0.1 only; the token is kept (it is printed in the log with the URL).
lab: $(STAMP)
	$(VENV)/bin/jupyter lab --ServerApp.ip=127.0.0.1 --no-browser --ServerApp.root_dir=notebooks \
		$$( [ "$$(id -u)" = 0 ] && echo --allow-root )

# Everything CI checks: unit and multi-process tests, then every notebook under nbval.
test: $(STAMP)
	$(PY) -m pytest tests
	$(PY) -m pytest $(NBVAL) notebooks

test-fast: $(STAMP)
	$(PY) -m pytest tests -m "not slow and not browser"

test-notebooks: $(STAMP)
	$(PY) -m pytest $(NBVAL) notebooks

bench: $(STAMP)
	$(PY) -m labutils.bench all

# A short prepared check for a machine with a GPU (nccl launch, bf16 MFU); exits cleanly without.
gpu-check: $(STAMP)
	$(PY) -m labutils.gpucheck

clean:
	rm -rf $(VENV) .pytest_cache

# Fragments: the browser test (mk/ui.mk) and the static course site (mk/site.mk).
include $(wildcard mk/*.mk)
