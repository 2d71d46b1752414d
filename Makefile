# trace-repro — the two commands: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell sha1sum pyproject.toml | cut -c1-12)

.PHONY: install lint test fuzz demo bench scale soak under-load up down status clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev,local]'
	@rm -f $(VENV)/.installed-* && touch $@

install: $(STAMP)  ## virtualenv with the project and its dev tools

lint: install  ## ruff, mypy (strict) and the import layers (import-linter)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

test: install lint  ## the whole suite; fixtures start the real engines (Kafka, FalkorDB, PostgreSQL, Debezium)
	$(BIN)/python -m pytest

fuzz: install  ## the structure-aware fuzz at length: >= 10^5 valid messages with hostile content through both stages
	HYPOTHESIS_PROFILE=fuzz $(BIN)/python -m pytest tests/fuzz -q -s -p no:cacheprovider -W ignore::hypothesis.errors.HypothesisWarning

demo: install  ## the daemon on real local engines with the sample workload
	$(BIN)/python -m bench.demo

bench: install  ## throughput and latency figures
	$(BIN)/python -m bench.run

scale: install  ## stage 1 across processes, the daemon with --workers and as replicas: scaling per added core (out/scale.json)
	$(BIN)/python -m bench.scale

RUNS ?= 5
SOAK_MINUTES ?= 10
soak: install  ## the daemon for $(SOAK_MINUTES) min at a steady rate with planted collisions: RSS, lag, misses (out/soak.json)
	$(BIN)/python -m bench.soak --minutes $(SOAK_MINUTES)

under-load: install  ## the corpus's live tests $(RUNS) times each with a CPU burner per core (out/under_load.json)
	$(BIN)/python -m bench.under_load --runs $(RUNS)

up: install     ## start the local engines and leave them running (addresses in .engines.env)
	$(BIN)/trace-repro local up --env-file .engines.env

status: install
	$(BIN)/trace-repro local status

down: install
	$(BIN)/trace-repro local down

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache out .engines.env
