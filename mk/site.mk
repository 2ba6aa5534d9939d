# The static course site: the course map's labs with their stored outputs (no re-execution) as
# HTML pages, README.md as the index, links between labs rewritten. Formulas become MathML at
# build time (latex2mathml, from requirements.txt), so the pages load nothing from the internet.
# $(STAMP) first: from a fresh clone it makes the venv with nbconvert and latex2mathml.
# Included from the Makefile.
.PHONY: site

site: $(STAMP)
	$(PY) tools/build_site.py --out _site
