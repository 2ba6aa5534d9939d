# The static course site: notebooks with their stored outputs (no re-execution) as HTML pages,
# README.md as the index, links between labs rewritten. Included from the Makefile.
.PHONY: site

site: $(STAMP)
	$(PY) tools/build_site.py --out _site
