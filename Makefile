# Targets are the commands README.md names.  GNU make.
SHELL := /bin/bash

VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.stamp

# Directories that exist right now; ruff refuses paths that do not.
LINT_PATHS := $(wildcard emq_django tests project bench)

PYTEST_ARGS ?=

.PHONY: help venv browser test faults lint format typecheck demo bench clean distclean

help:
	@echo "make demo       broker + job manager + admin + sample producer (http://127.0.0.1:8000/admin/)"
	@echo "make test       unit, integration and end-to-end tests (fault injection included)"
	@echo "make faults     the fault-injection suite alone, with its reports"
	@echo "make lint       ruff check + ruff format --check"
	@echo "make format     ruff format + ruff check --fix"
	@echo "make typecheck  mypy"
	@echo "make bench      benchmark against Celery and Dramatiq"
	@echo "make clean      caches and build output (distclean: also .venv and db.sqlite3)"

venv: $(STAMP)

# eventmq 0.3.13 is the released peer the interop tests talk to.  Its pinned pyzmq
# does not build on Python 3.11, so it goes in without its dependencies and keeps ours.
$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install --upgrade pip
	$(PIP) install -e '.[dev]'
	$(PIP) install --no-deps eventmq==0.3.13
	$(PIP) install six monotonic croniter future psutil
	touch $@

# The browser test (tests/e2e/test_browser_dashboard.py) drives Debian's headless
# Chromium; installed once, as root (or through sudo), skipped when present.
browser:
	@if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then :; \
	elif [ "$$(id -u)" = 0 ]; then \
	  apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium chromium-driver; \
	else \
	  sudo apt-get update && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y chromium chromium-driver; \
	fi

test: $(STAMP) browser
	EMQ_REQUIRE_BROWSER=1 $(PY) -m pytest tests $(PYTEST_ARGS)

faults: $(STAMP)
	$(PY) -m pytest tests/faults -v -s $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check $(LINT_PATHS)
	$(VENV)/bin/ruff format --check $(LINT_PATHS)

format: $(STAMP)
	$(VENV)/bin/ruff format $(LINT_PATHS)
	$(VENV)/bin/ruff check --fix $(LINT_PATHS)

typecheck: $(STAMP)
	$(VENV)/bin/mypy emq_django

demo: $(STAMP)
	scripts/demo.sh

bench: $(STAMP)
	$(PIP) install -e '.[dev,bench]'
	$(PY) bench/run.py

clean:
	rm -rf build dist *.egg-info .pytest_cache .ruff_cache .mypy_cache
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV) db.sqlite3
