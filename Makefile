# docket — every target installs what it needs first (venv, pinned packages, Kafka jars).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.docket-setup
PYTEST_ARGS ?=

.PHONY: setup test test-unit lint bench soak demo clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt broker/pom.xml audit/pom.xml
	@command -v java >/dev/null || { echo "make setup: java (JDK 17+) is required for the local Kafka and Spark" >&2; exit 1; }
	@command -v mvn >/dev/null || { echo "make setup: mvn (Maven) is required to fetch the Kafka and Spark connector jars" >&2; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -c constraints.txt -e '.[audit,dashboard,dev]'
	$(BIN)/docket-broker fetch
	$(BIN)/docket-audit fetch
	touch $@

test: setup
	$(BIN)/pytest $(PYTEST_ARGS)

test-unit: setup
	$(BIN)/pytest tests/unit $(PYTEST_ARGS)

lint: setup
	$(BIN)/ruff check agent broker audit dashboards tests

bench: setup
	@for f in tests/bench/bench_*.py; do $(BIN)/python $$f || exit 1; done

soak: setup
	$(BIN)/pytest -m soak tests/faults $(PYTEST_ARGS)

# The demo grows with the project: today it starts the local Kafka and the audit topic.
demo: setup
	$(BIN)/docket-broker up --brokers 1
	$(BIN)/docket-broker topic ensure docket.audit --audit
	$(BIN)/docket-broker topic ensure app.events
	@echo "The local Kafka is up (docket-broker status; docket-broker down to stop it)."
	@echo "Still to come in the demo: the event generator, the agent, the audit jobs, the reconciler and the dashboard."


clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
