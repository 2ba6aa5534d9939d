# Browser test of the knob panels: JupyterLab in headless Chromium driven by Playwright.
# Included from the Makefile. Playwright never downloads a browser: it drives Debian's
# chromium at /usr/bin/chromium, installed here once (skipped when it is already there).
CHROMIUM := /usr/bin/chromium

.PHONY: chromium ui-test

chromium:
	@if [ -x $(CHROMIUM) ]; then :; \
	elif command -v apt-get >/dev/null 2>&1; then \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		echo "Installing Debian's chromium for the browser test (apt-get)"; \
		( $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
			$$SUDO apt-get install -y -qq chromium ) \
		|| echo "chromium could not be installed: the browser test will be skipped"; \
	else \
		echo "no apt-get here: install chromium at $(CHROMIUM) or the browser test is skipped"; \
	fi

ui-test: $(STAMP) chromium
	$(PY) -m pytest tests/test_browser.py -m browser

# `make test` runs the browser test with the rest of tests/: Chromium must be there first.
test: chromium
