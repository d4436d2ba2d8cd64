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

.PHONY: all setup venv native models test test-native test-sanitize test-python demo results results-quick fuzz clean distclean

all: setup

setup: venv native models

venv: $(STAMP)

# llama.cpp's native build (-march=native) compiles its AMX kernels on CPUs that list AMX, and a VM may list AMX
# without letting a process use its tile registers: every matrix product then dies with SIGILL (seen on a
# Sapphire Rapids VM). So llama-cpp-python is built for the instruction sets this CPU lists, AMX left out.
CPU_HAS   = $(shell grep -qw $(1) /proc/cpuinfo 2>/dev/null && echo yes)
GGML_ISA  := -DGGML_NATIVE=OFF \
	$(if $(call CPU_HAS,avx2),-DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON) \
	$(if $(call CPU_HAS,bmi2),-DGGML_BMI2=ON) \
	$(if $(call CPU_HAS,avx_vnni),-DGGML_AVX_VNNI=ON) \
	$(if $(and $(call CPU_HAS,avx512f),$(call CPU_HAS,avx512bw),$(call CPU_HAS,avx512vl),$(call CPU_HAS,avx512dq),$(call CPU_HAS,avx512cd)),-DGGML_AVX512=ON \
	  $(if $(call CPU_HAS,avx512vbmi),-DGGML_AVX512_VBMI=ON) \
	  $(if $(call CPU_HAS,avx512_vnni),-DGGML_AVX512_VNNI=ON) \
	  $(if $(call CPU_HAS,avx512_bf16),-DGGML_AVX512_BF16=ON)) \
	-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF

# torch first and pinned: it resolves to the CPU wheel on disk; an unpinned torch would pull a CUDA build.
# llama-cpp-python next, built from source with GGML_ISA (--no-cache-dir: a wheel cached from another build of the
# same version would be reused whatever its flags).
$(STAMP): pyproject.toml Makefile
	@test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q --disable-pip-version-check --upgrade pip
	$(VPY) -m pip install -q --disable-pip-version-check torch==2.13.0
	CMAKE_ARGS="$(strip $(GGML_ISA))" $(VPY) -m pip install -q --disable-pip-version-check --no-cache-dir \
		--force-reinstall --no-deps llama-cpp-python==0.3.36
	$(VPY) -m pip install -q --disable-pip-version-check -e .
	@touch $@

native: $(STAMP)
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

models: $(STAMP)
	$(NEXUS) models fetch

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
	$(NEXUS) index tool_registries
	$(NEXUS) route "open a pull request in acme/api from feature/login into main titled Add login page"

results: setup
	$(NEXUS) results all; rc=$$?; \
	$(NEXUS) results summary --readme >/dev/null && echo "results/SUMMARY.md and README.md tables updated"; \
	exit $$rc

results-quick: setup
	$(NEXUS) results all --quick

fuzz: setup
	$(MAKE) -C fuzz run

clean:
	rm -rf $(BUILD) $(ASAN) .pytest_cache

distclean: clean
	rm -rf $(VENV) .nexus
