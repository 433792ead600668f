PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: venv demo test bench clean

$(BIN)/dq-flower: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install "torch==2.14.1" "torchvision==0.29.1"
	$(BIN)/pip install -e ".[test]"
	touch $@

venv: $(BIN)/dq-flower

demo: $(BIN)/dq-flower
	FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1 $(BIN)/dq-flower compare --preset digits-mlp --out results/demo

test: $(BIN)/dq-flower
	$(BIN)/ruff check dq_flower tests benchmarks simulations examples
	$(BIN)/python -m pytest -m "not slow" -q

bench: $(BIN)/dq-flower
	$(BIN)/python benchmarks/codecs.py
	$(BIN)/python benchmarks/overhead.py

clean:
	rm -rf $(VENV) build *.egg-info
