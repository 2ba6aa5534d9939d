# Browser test of the knob panels: JupyterLab in headless Chromium driven by Playwright.
# Included from the Makefile. Playwright never downloads a browser: it drives Debian's
# chromium at /usr/bin/chromium, installed here once (skipped when it is already there).
# Where it cannot be installed, `make test` fails and says how to install it; SKIP_BROWSER=1
# (never set by CI) is the explicit way to run everything else without it.
CHROMIUM := /usr/bin/chromium

.PHONY: chromium ui-test

chromium:
	@if [ -x $(CHROMIUM) ] || [ "$${SKIP_BROWSER:-}" = 1 ]; then :; \
	elif command -v apt-get >/dev/null 2>&1; then \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		echo "Installing Debian's chromium for the browser test (apt-get)"; \
		( $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
			$$SUDO apt-get install -y -qq chromium ) \
		|| { echo "error: chromium could not be installed with apt-get. Install it at" \
			"$(CHROMIUM) (Debian/Ubuntu: sudo apt-get install chromium), or run" \
			"SKIP_BROWSER=1 make test to skip the browser test explicitly" >&2; exit 1; }; \
	else \
		echo "error: no chromium at $(CHROMIUM) and no apt-get to install it. Install" \
			"Chromium there, or run SKIP_BROWSER=1 make test to skip the browser test" \
			"explicitly" >&2; exit 1; \
	fi

ui-test: $(STAMP) chromium
	$(PY) -m pytest tests/test_browser.py -m browser

# `make test` runs the browser test with the rest of tests/: Chromium must be there first.
test: chromium
