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

# A second, small environment at the oldest transformers the book supports (requirements-oldest.txt): .venv's
# packages, torch 2.13.0 included, seen through a .pth file, with transformers, tokenizers and huggingface_hub of
# its own, and the book installed as the Colab cell installs it (pip --no-deps, not editable). It runs the unit tests
# that call transformers' own API (loading every shipped model and tokenizer, generate, assisted generation,
# continuous batching, training) and one chapter, the shortest that loads a shipped model and its tokenizer
# (appendix A, which loads all of them, takes twice as long, and make test runs it under nbval anyway).
OLDEST         := .venv-oldest
OLDEST_STAMP   := $(OLDEST)/.installed
OLDEST_TESTS   := $(addprefix tests/test_,models.py shipped_models.py llama.py decode.py peers.py speculative.py \
                    train.py)
OLDEST_CHAPTER := chapters/06_beyond_one_token_at_a_time.ipynb

.PHONY: help setup book test test-unit test-oldest test-notebooks build-book test-browser lab clean

help:
	@echo "make book   set up .venv, execute every chapter, build the HTML book into _build/html"
	@echo "make test   set up .venv, then unit tests, the oldest-transformers check, nbval on every chapter, the -W"
	@echo "            book build and the browser check"
	@echo "make lab    open JupyterLab on the chapters"

$(STAMP): requirements.txt pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q --no-compile -r requirements.txt
	@# pip byte-compiles on one core; compileall uses every core (about 40 s sooner on two). A file written for a newer
	@# Python (torch ships one) fails to compile here, as it would under pip, which skips it too: hence the `|| true`.
	$(BIN)/python -m compileall -q -j 0 \
	    "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" > /dev/null || true
	$(BIN)/python -m pip install -q --no-deps -e .
	@touch $@

setup: $(STAMP)

$(OLDEST_STAMP): $(STAMP) requirements-oldest.txt pyproject.toml $(wildcard book/*.py book/*.json)
	rm -rf $(OLDEST)
	$(BIN)/python -m venv --without-pip $(OLDEST)
	site=$$($(OLDEST)/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])"); \
	$(BIN)/python -m pip install -q --no-deps --target "$$site" -r requirements-oldest.txt && \
	$(BIN)/python -m pip install -q --no-deps --no-build-isolation --target "$$site" . && \
	$(BIN)/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" > "$$site/_book_base_env.pth"
	rm -rf build
	@touch $@

# The static build: sliders become precomputed flipbooks (BOOK_STATIC=1 tells book.widgets).
build-book: setup
	@mkdir -p _build
	BOOK_STATIC=1 $(BIN)/jupyter-book build . $(BUILD_FLAGS) 2>&1 | tee _build/build.log
	@echo
	@echo "Built: open file://$(abspath _build/html/index.html)"

book: build-book

test-unit: setup
	$(BIN)/python -m pytest -q tests --ignore=tests/test_browser.py --durations=10

test-oldest: setup $(OLDEST_STAMP)
	cd $(OLDEST) && bin/python -c "import book, transformers, torch; print('$(OLDEST): transformers', \
	    transformers.__version__, '- torch', torch.__version__, '- book from', book.__file__)"
	$(OLDEST)/bin/python -m pytest -q -p no:cacheprovider $(OLDEST_TESTS)
	BOOK_STATIC=1 BOOK_CEILINGS=off $(OLDEST)/bin/python -m pytest -q --nbval-lax \
	    --nbval-cell-timeout=$(CELL_TIMEOUT) -p no:cacheprovider $(OLDEST_CHAPTER)

# nbval runs the chapters as the static build would (BOOK_STATIC=1), and book.nbcache files each chapter that passed
# into the build's execution cache, so build-book renders those outputs instead of executing every chapter twice.
test-notebooks: setup
	@mkdir -p _build
	BOOK_STATIC=1 BOOK_NB_CACHE=$(NB_CACHE) $(BIN)/python -m pytest -q --nbval-lax \
	    --nbval-cell-timeout=$(CELL_TIMEOUT) -p no:cacheprovider -p book.nbcache --durations=15 chapters

test-browser: setup
	$(BIN)/python -m pytest -q tests/test_browser.py

# The unit tests and the oldest-transformers check publish no number (the oldest check's chapter keeps its ceilings
# in memory: BOOK_CEILINGS=off), so they run side by side, one PyTorch thread each (two threads each on two cores
# made both several times slower); then the chapters run one at a time with the machine to themselves, since their
# outputs become the built book (the first measures the build's ceilings).
test: setup
	OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 $(MAKE) --no-print-directory -j2 --output-sync=target test-unit test-oldest
	$(MAKE) --no-print-directory test-notebooks build-book test-browser
	@echo "make test: all checks passed"

lab: setup
	$(BIN)/jupyter lab chapters

clean:
	rm -rf _build _static/frames $(OLDEST) build
