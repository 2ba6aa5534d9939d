# Browser tests: the knob panels in JupyterLab and the static course site, in headless Chromium
# driven by Playwright. Included from the Makefile. Playwright never downloads a browser: it
# drives Debian's chromium at /usr/bin/chromium, installed here once (skipped when it is
# already there), with a Chinese font for the chapter titles (结论与展望 ...), which a minimal
# Linux lacks and then draws as empty boxes. Where they cannot be installed, `make test` fails
# and says how to install them; SKIP_BROWSER=1 (never set by CI) is the explicit way to run
# everything else without them.
CHROMIUM := /usr/bin/chromium
# WenQuanYi Micro Hei: about 1.6 MB to download (5 MB installed); Noto CJK would be 56 MB.
CJK_FONT := fonts-wqy-microhei

.PHONY: chromium ui-test

chromium:
	@need=""; \
	[ -x $(CHROMIUM) ] || need=" chromium"; \
	[ -n "$$(fc-list :lang=zh 2>/dev/null)" ] || need="$$need $(CJK_FONT)"; \
	if [ -z "$$need" ] || [ "$${SKIP_BROWSER:-}" = 1 ]; then :; \
	elif command -v apt-get >/dev/null 2>&1; then \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		echo "Installing$$need for the browser tests (apt-get)"; \
		( $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
			$$SUDO apt-get install -y -qq $$need ) \
		|| { echo "error:$$need could not be installed with apt-get. Install Chromium at" \
			"$(CHROMIUM) and a Chinese font (Debian/Ubuntu: sudo apt-get install chromium" \
			"$(CJK_FONT)), or run SKIP_BROWSER=1 make test to skip the browser tests" \
			"explicitly" >&2; exit 1; }; \
	else \
		echo "error: no apt-get to install$$need (Chromium at" \
			"$(CHROMIUM); a Chinese font that fc-list :lang=zh lists). Install them, or run" \
			"SKIP_BROWSER=1 make test to skip the browser tests explicitly" >&2; exit 1; \
	fi

ui-test: $(STAMP) chromium
	$(PY) -m pytest tests/test_browser.py tests/test_site_browser.py -m browser

# `make test` runs the browser tests with the rest of tests/: Chromium must be there first.
test: chromium
