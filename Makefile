PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# mkdocs prints a banner about MkDocs 2.0 on every build unless told not to
export NO_MKDOCS_2_WARNING := 1

.PHONY: venv demo test docs bench clean

$(BIN)/dq-flower: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install "torch==2.14.1" "torchvision==0.29.1"
	$(BIN)/pip install -e ".[test,docs]"
	touch $@

venv: $(BIN)/dq-flower

# the docs extra, into an existing .venv made before the extra existed (or without it)
$(BIN)/mkdocs: | $(BIN)/dq-flower
	$(BIN)/pip install -e ".[docs]"

demo: $(BIN)/dq-flower
	FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1 $(BIN)/dq-flower compare --preset digits-mlp --out results/demo

# ruff, the suite (tests/test_docs.py runs every documented example and the strict docs
# build), then the site itself
test: $(BIN)/dq-flower $(BIN)/mkdocs
	$(BIN)/ruff check dq_flower tests benchmarks simulations examples docs
	$(BIN)/python -m pytest -m "not slow" -q
	$(BIN)/mkdocs build --strict --quiet --site-dir site

# the documentation site, offline and strict, into site/
docs: $(BIN)/dq-flower $(BIN)/mkdocs
	$(BIN)/mkdocs build --strict --site-dir site

bench: $(BIN)/dq-flower
	$(BIN)/python benchmarks/codecs.py
	$(BIN)/python benchmarks/overhead.py

clean:
	rm -rf $(VENV) build *.egg-info site
