# Two commands on a fresh machine:  `make book`  builds the HTML book,  `make test`  runs every check.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# Every tool below runs from the virtual environment, kernels included.
export PATH := $(abspath $(BIN)):$(PATH)
export VIRTUAL_ENV := $(abspath $(VENV))
export HF_HUB_OFFLINE ?= 1
export PYTHONUNBUFFERED := 1
# One set of measured ceilings per build, shared by every chapter (and by nbval in `make test`); `make clean` drops it.
export BOOK_CEILINGS ?= $(abspath _build)/ceilings.json

# The book build's execution cache (_config.yml, execute.cache).
NB_CACHE := $(abspath _build)/.jupyter_cache

# Seconds one notebook cell may run under nbval (the book build's own limit is in _config.yml).
CELL_TIMEOUT ?= 900
BUILD_FLAGS  := -W -n --keep-going

.PHONY: help setup book test test-unit test-notebooks build-book test-browser lab clean

help:
	@echo "make book   set up .venv, execute every chapter, build the HTML book into _build/html"
	@echo "make test   set up .venv, then unit tests, nbval on every chapter, the -W book build and the browser check"
	@echo "make lab    open JupyterLab on the chapters"

$(STAMP): requirements.txt pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements.txt
	$(BIN)/python -m pip install -q --no-deps -e .
	@touch $@

setup: $(STAMP)

# The static build: sliders become precomputed flipbooks (BOOK_STATIC=1 tells book.widgets).
build-book: setup
	@mkdir -p _build
	BOOK_STATIC=1 $(BIN)/jupyter-book build . $(BUILD_FLAGS) 2>&1 | tee _build/build.log
	@echo
	@echo "Built: open file://$(abspath _build/html/index.html)"

book: build-book

test-unit: setup
	$(BIN)/python -m pytest -q tests --ignore=tests/test_browser.py

# nbval runs the chapters as the static build would (BOOK_STATIC=1), and book.nbcache files each chapter that passed
# into the build's execution cache, so build-book renders those outputs instead of executing every chapter twice.
test-notebooks: setup
	@mkdir -p _build
	BOOK_STATIC=1 BOOK_NB_CACHE=$(NB_CACHE) $(BIN)/python -m pytest -q --nbval-lax \
	    --nbval-cell-timeout=$(CELL_TIMEOUT) -p no:cacheprovider -p book.nbcache chapters

test-browser: setup
	$(BIN)/python -m pytest -q tests/test_browser.py

test: test-unit test-notebooks build-book test-browser
	@echo "make test: all checks passed"

lab: setup
	$(BIN)/jupyter lab chapters

clean:
	rm -rf _build _static/frames
