# Targets are the commands README.md and docs/ name.  GNU make.
SHELL := /bin/bash

VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.stamp

# Directories that exist right now; ruff refuses paths that do not.
LINT_PATHS := $(wildcard emq_django tests project bench docs)

PYTEST_ARGS ?=

# Django 6.0 (django.tasks) needs Python >= 3.12: make test runs the Django Tasks API
# tests there too, in a second venv, when such an interpreter is found.
VENV6  := .venv-dj6
PY6    := $(VENV6)/bin/python
STAMP6 := $(VENV6)/.stamp
# the Django Tasks API tests, and the docs page that imports django.tasks (its test
# in test_docs_examples.py is marked djangotasks too)
DJ6_TESTS = tests/*/test_django_tasks*.py tests/*/test_on_commit*.py tests/unit/test_docs_examples.py
DJ6_PYTHON ?= $(shell for p in python3.13 python3.12 $(HOME)/.pyenv/versions/3.1[2-9]*/bin/python3; do \
	"$$p" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null && { command -v "$$p"; break; }; done)

.PHONY: help venv browser test test-dj6 test-pythons which-python faults lint format typecheck docs demo bench clean distclean

help:
	@echo "make demo       broker + job manager + scheduler + admin + sample producer"
	@echo "                (http://127.0.0.1:8000/admin/); logs in var/log/demo/"
	@echo "make test       unit, integration and end-to-end tests (fault injection included),"
	@echo "                then the Django Tasks API tests on Django 6.0 when Python >= 3.12 exists,"
	@echo "                and the unit and integration tests on each other Python of 3.11-3.13 found"
	@echo "make faults     the fault-injection suite alone, with its reports"
	@echo "make lint       ruff check + ruff format --check"
	@echo "make format     ruff format + ruff check --fix"
	@echo "make typecheck  mypy"
	@echo "make docs       the docs site (MkDocs), warnings as errors, into site/"
	@echo "make bench      benchmark against Celery, Dramatiq, Huey, RQ and a raw ZeroMQ forwarder"
	@echo "make clean      caches and build output (distclean: also .venv and db.sqlite3)"

venv: $(STAMP)

# Quiet: a few lines of progress; pip shows its errors only (-qq).
# --no-warn-conflicts: once the interop peer (below) is in this venv, pip would
# otherwise print a resolver ERROR about its pyzmq pin on every later install.
PIP_QUIET := PIP_DISABLE_PIP_VERSION_CHECK=1 $(PIP) install -qq --no-warn-conflicts

$(STAMP): pyproject.toml
	@echo "make: setting up $(VENV) (first run: a few minutes)..."
	@test -x $(PY) || python3 -m venv $(VENV)
	@$(PIP_QUIET) --upgrade pip
	@echo "make: installing emq-django with its dev tools and PySpark..."
	@$(PIP_QUIET) -e '.[dev,analytics]' 'Django>=5.2,<5.3'  # 5.2 LTS here; .venv-dj6 tests 6.0
	@touch $@
	@echo "make: $(VENV) is ready"

# eventmq 0.3.13 is the released peer the interop tests talk to; only the tests need
# it, so `make demo` never installs it.  Its pinned pyzmq does not build on Python
# 3.11, so it goes in last, without its dependencies (which also spares us pip's
# resolver ERROR about that pin), and keeps ours.
INTEROP := $(VENV)/.stamp-interop
$(INTEROP): $(STAMP)
	@echo "make: installing the EventMQ interop peer (eventmq 0.3.13) for the tests..."
	@$(PIP_QUIET) six monotonic croniter future psutil
	@$(PIP_QUIET) --no-deps eventmq==0.3.13
	@touch $@

# The browser test (tests/e2e/test_browser_dashboard.py) drives Debian's headless
# Chromium; installed once, as root (or through sudo), skipped when present.
browser:
	@if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then :; \
	elif [ "$$(id -u)" = 0 ]; then \
	  apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium chromium-driver; \
	else \
	  sudo apt-get update && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y chromium chromium-driver; \
	fi

test: $(INTEROP) browser
	EMQ_REQUIRE_BROWSER=1 $(PY) -m pytest tests $(PYTEST_ARGS)
	@$(MAKE) --no-print-directory test-dj6
	@$(MAKE) --no-print-directory test-pythons

# The Django Tasks API tests on Django 6.0, or a message saying why they were skipped.
test-dj6:
	@if [ -z "$(DJ6_PYTHON)" ]; then \
	  echo "make test: no Python >= 3.12 found, so the Django 6.0 run of the Django Tasks API tests was skipped"; \
	else \
	  $(MAKE) --no-print-directory $(STAMP6) && \
	  $(PY6) -m pytest -m djangotasks $(DJ6_TESTS) $(PYTEST_ARGS); \
	fi

$(STAMP6): pyproject.toml
	test -x $(PY6) || $(DJ6_PYTHON) -m venv $(VENV6)
	$(PY6) -m pip install --upgrade pip
	$(PY6) -m pip install -e '.[dev]' 'Django>=6.0,<6.1'
	touch $@

# Python 3.11, 3.12 and 3.13 (pyproject.toml): the full suite runs on .venv's Python
# (above); the unit and integration tests run on each other one found, as python3.X
# or under pyenv, in .venv-py3.X, or a message says it was skipped.
PYTHONS := 3.11 3.12 3.13
find_python = for p in python$(1) $(HOME)/.pyenv/versions/$(1).*/bin/python$(1); do \
	"$$p" -c 'import sys; sys.exit("%d.%d" % sys.version_info[:2] != sys.argv[1])' "$(1)" 2>/dev/null \
	&& { command -v "$$p"; break; }; done

# The interpreter test-pythons would take for Python $(V) (empty when none): make which-python V=3.12
which-python:
	@v=$(V); $(call find_python,$$v)

test-pythons: $(STAMP)
	@main=$$($(PY) -c 'import sys; print("%d.%d" % sys.version_info[:2])'); \
	for v in $(PYTHONS); do \
	  [ "$$v" = "$$main" ] && continue; \
	  py=$$($(call find_python,$$v)); \
	  if [ -z "$$py" ]; then \
	    echo "make test: no Python $$v found, so its unit and integration run was skipped"; continue; \
	  fi; \
	  $(MAKE) --no-print-directory PYV=$$v PYV_PYTHON=$$py .venv-py$$v/.stamp || exit 1; \
	  echo "make test: unit and integration tests on Python $$v ($$py)"; \
	  .venv-py$$v/bin/python -m pytest tests/unit tests/integration $(PYTEST_ARGS) || exit 1; \
	done

# Without the analytics extra when it does not install there: its tests then skip,
# saying so (pytest.importorskip("pyspark")).
.venv-py%/.stamp: pyproject.toml
	@echo "make: setting up .venv-py$* with $(PYV_PYTHON) (first run: a few minutes)..."
	@test -x .venv-py$*/bin/python || $(PYV_PYTHON) -m venv .venv-py$*
	@PIP_DISABLE_PIP_VERSION_CHECK=1 .venv-py$*/bin/python -m pip install -qq --upgrade pip
	@PIP_DISABLE_PIP_VERSION_CHECK=1 .venv-py$*/bin/python -m pip install -qq -e '.[dev,analytics]' 'Django>=5.2,<5.3' \
	  || { echo "make: the analytics extra does not install on Python $*: its tests will skip"; \
	       PIP_DISABLE_PIP_VERSION_CHECK=1 .venv-py$*/bin/python -m pip install -qq -e '.[dev]' 'Django>=5.2,<5.3'; }
	@touch $@

faults: $(INTEROP)
	$(PY) -m pytest tests/faults -v -s $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check $(LINT_PATHS)
	$(VENV)/bin/ruff format --check $(LINT_PATHS)

format: $(STAMP)
	$(VENV)/bin/ruff format $(LINT_PATHS)
	$(VENV)/bin/ruff check --fix $(LINT_PATHS)

typecheck: $(STAMP)
	$(VENV)/bin/mypy emq_django

# The docs site; make test builds it too (tests/unit/test_docs.py), and runs the
# docs' code examples (tests/unit/test_docs_examples.py).
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

# One supervisor process (scripts/demo.py): its children die with it, whatever kills it.
demo: $(STAMP)
	@$(PY) scripts/demo.py

bench: $(STAMP)
	$(PIP) install -e '.[dev,analytics,bench]'
	$(PY) bench/run.py

clean:
	rm -rf build dist site *.egg-info .pytest_cache .ruff_cache .mypy_cache
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV) $(VENV6) .venv-py3.* db.sqlite3
