# Two commands do everything on a fresh machine: `make demo` and `make test`.
# Each target sets up what it needs, idempotently: .venv/, the pinned packages, libnexus (CMake, Release), the models.

PYTHON   ?= python3.11
VENV     := .venv
VPY      := $(VENV)/bin/python
NEXUS    := $(VENV)/bin/nexus
STAMP    := $(VENV)/.installed
BUILD    := build
ASAN     := build-asan
JOBS     ?= 2
DEMO_DIR := .nexus/demo

.PHONY: all setup venv native models test test-native test-sanitize test-python demo results results-quick fuzz clean distclean

all: setup

setup: venv native models

venv: $(STAMP)

# torch first and pinned: it resolves to the CPU wheel on disk; an unpinned torch would pull a CUDA build.
$(STAMP): pyproject.toml
	@test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q --disable-pip-version-check --upgrade pip
	$(VPY) -m pip install -q --disable-pip-version-check torch==2.13.0
	$(VPY) -m pip install -q --disable-pip-version-check -e .
	@touch $@

native: $(STAMP)
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

models: $(STAMP)
	$(VPY) -m nexus_cli.models fetch

test: setup test-native test-sanitize test-python

test-native: native
	cd $(BUILD) && ctest --output-on-failure

# The native tests once more under AddressSanitizer and UndefinedBehaviorSanitizer.
test-sanitize:
	@cmake -S . -B $(ASAN) -DCMAKE_BUILD_TYPE=Debug -DNEXUS_SANITIZE=ON >/dev/null
	@cmake --build $(ASAN) -j $(JOBS)
	cd $(ASAN) && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 ctest --output-on-failure

test-python: setup
	$(VPY) -m pytest -q

demo: setup
	$(NEXUS) index tool_registries --out $(DEMO_DIR)/index
	$(NEXUS) route "open a pull request in acme/api from feature/login into main titled Add login page" \
		--index $(DEMO_DIR)/index --model qwen2.5-0.5b

results: setup
	$(VPY) -m nexus_cli.stages.results_all; rc=$$?; \
	$(VPY) -m nexus_cli.stages.results_summary --readme >/dev/null && echo "results/SUMMARY.md and README.md tables updated"; \
	exit $$rc

results-quick: setup
	$(VPY) -m nexus_cli.stages.results_all --quick

fuzz: setup
	$(MAKE) -C fuzz run

clean:
	rm -rf $(BUILD) $(ASAN) .pytest_cache

distclean: clean
	rm -rf $(VENV) .nexus
