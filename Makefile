PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# mkdocs prints a banner about MkDocs 2.0 on every build unless told not to
export NO_MKDOCS_2_WARNING := 1

.PHONY: venv demo test docs bench dist clean

$(BIN)/dq-flower: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install "torch==2.14.1" "torchvision==0.29.1"
	$(BIN)/pip install -e ".[server,test,docs]"
	touch $@

venv: $(BIN)/dq-flower

# the docs extra, into an existing .venv made before the extra existed (or without it)
$(BIN)/mkdocs: | $(BIN)/dq-flower
	$(BIN)/pip install -e ".[docs]"

demo: $(BIN)/dq-flower
	FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1 $(BIN)/dq-flower compare --preset digits-mlp --out results/demo

# ruff, mypy (configured in pyproject.toml), the suite (tests/test_docs.py runs every
# documented example and the strict docs build), then the site itself
test: $(BIN)/dq-flower $(BIN)/mkdocs
	$(BIN)/ruff check dq_flower tests benchmarks simulations examples docs
	$(BIN)/mypy dq_flower
	$(BIN)/python -m pytest -m "not slow" -q --durations=15
	$(BIN)/mkdocs build --strict --quiet --site-dir site

# the documentation site, offline and strict, into site/
docs: $(BIN)/dq-flower $(BIN)/mkdocs
	$(BIN)/mkdocs build --strict --site-dir site

bench: $(BIN)/dq-flower
	$(BIN)/python benchmarks/codecs.py
	$(BIN)/python benchmarks/overhead.py

# the sdist and the wheel, into dist/: `python -m build` in an isolated build environment
# (setuptools from the package index), from a small tools environment of its own, not .venv
# (14 to 22 s here); tests/test_install.py installs the wheel into a fresh environment
DIST_TOOLS := build/dist-tools
dist:
	rm -rf dist
	test -x $(DIST_TOOLS)/bin/python || $(PY) -m venv $(DIST_TOOLS)
	$(DIST_TOOLS)/bin/python -m pip install --quiet --disable-pip-version-check "build>=1.2"
	$(DIST_TOOLS)/bin/python -m build --outdir dist .

clean:
	rm -rf $(VENV) build dist *.egg-info site

# Mutation testing, not part of CI (install mutmut first: $(BIN)/pip install mutmut).
# mutmut mutates the modules that carry DQ's state and numbers (setup.cfg [mutmut]) in a
# scratch copy of the repository and runs, for each mutant, the selected fast tests that
# cover the mutated function (-x, not slow); then prints the kill rate per module and the
# surviving mutants. MUTANTS='dq_flower.dq.server.store*' limits a run to one module.
MUTATE_DIR ?= /tmp/dq-flower-mutate
MUTANTS ?=
.PHONY: mutate
mutate: $(BIN)/dq-flower
	@$(BIN)/python -c "import mutmut" 2>/dev/null || \
		{ echo "make mutate needs mutmut: $(BIN)/pip install mutmut"; exit 1; }
	rm -rf $(MUTATE_DIR) && mkdir -p $(MUTATE_DIR)
	cp -r dq_flower tests simulations pyproject.toml setup.cfg $(MUTATE_DIR)/
	find $(MUTATE_DIR) -name __pycache__ -prune -exec rm -rf {} +
	cd $(MUTATE_DIR) && FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1 OMP_NUM_THREADS=1 \
		$(abspath $(BIN))/mutmut run $(MUTANTS) > mutmut-run.log 2>&1 || \
		{ tail -n 40 mutmut-run.log; exit 1; }
	cd $(MUTATE_DIR) && $(abspath $(BIN))/python tests/mutation_report.py --diffs
