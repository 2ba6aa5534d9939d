# The course site (mkdocs.yml): mkdocs-material with the labs' committed notebooks as pages
# (mkdocs-jupyter, stored outputs, nothing executed), the Chinese edition under _site/zh/
# (mkdocs-static-i18n), search, a student landing page, the teacher's guide (guide/<lab>.md with
# the reference solutions of labutils/exercises/) and printable handouts, made by the hook
# tools/site/hooks.py in build/site-docs/. Works offline: no web font, no script from the
# internet, formulas as MathML. Strict: a broken link or a formula that cannot be converted
# fails the build. About 30 s on 2 cores. $(STAMP) first: from a fresh clone it makes the venv.
# Included from the Makefile.
.PHONY: site

site: $(STAMP)
	@mkdir -p build/site-docs
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir _site
