PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test lint bench clean

$(BIN)/dq-flower: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install "torch==2.14.1" "torchvision==0.29.1"
	$(BIN)/pip install -e ".[test]"
	touch $@

venv: $(BIN)/dq-flower

demo: $(BIN)/dq-flower
	$(BIN)/python benchmarks/codecs.py

test: $(BIN)/dq-flower
	$(BIN)/ruff check dq_flower tests benchmarks simulations
	$(BIN)/python -m pytest -m "not slow" -q

bench: $(BIN)/dq-flower
	$(BIN)/python benchmarks/codecs.py

clean:
	rm -rf $(VENV) build *.egg-info
