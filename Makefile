# Thin wrapper over CMake. The build system is CMake (CMakeLists.txt,
# CMakePresets.json); this file only strings the usual steps together.
#
#   make demo           build, save a checkpoint with dcp, inspect it with
#                       dcptool, load it with PyTorch
#   make check          build + all tests, ASan+UBSan build + all tests,
#                       install test (what CI runs, through .ci/run)
#   make bench          save/load throughput vs fio and PyTorch DCP on the
#                       GPT-2 + AdamW state (1.5 GB; several minutes):
#                       bench/RESULTS.md, bench/results.json, bench/io_bench.png
#   make build | test | asan | install-test | install | clean | format-check
#
# Variables: PREFIX (/usr/local), DESTDIR, BUILD_TYPE (RelWithDebInfo),
# ASAN_CC (clang-14), CTEST_J (2), CTEST_ARGS (e.g. CTEST_ARGS='-L unit').

PREFIX     ?= /usr/local
DESTDIR    ?=
BUILD_TYPE ?= RelWithDebInfo
ASAN_CC    ?= clang-14
CTEST_J    ?= 2
CTEST_ARGS ?=
NPROC      := $(shell nproc 2>/dev/null || echo 2)
PYTHON     := $(CURDIR)/.venv/bin/python
CMAKE      ?= cmake
CTEST      ?= ctest
DEMO_DIR   ?= build/demo-ckpt

MAKEFLAGS += --no-print-directory

CONFIGURE_COMMON = -DDCP_PYTHON=$(PYTHON) -DCMAKE_INSTALL_PREFIX=$(PREFIX)

.PHONY: all deps build configure demo check test asan asan-build install \
        install-test uninstall clean format format-check help bench

all: build

help:
	@sed -n '4,15p' Makefile

deps:
	bash scripts/deps.sh

configure: deps
	$(CMAKE) -S . -B build -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(CONFIGURE_COMMON)

build: configure
	$(CMAKE) --build build -j$(NPROC)

demo: build
	@test -x build/dcp_demo || { \
	  echo "make demo: build/dcp_demo was not built (examples/dcp_demo.c)" >&2; \
	  exit 1; }
	rm -rf $(DEMO_DIR)
	build/dcp_demo $(DEMO_DIR)
	build/dcptool info $(DEMO_DIR)
	build/dcptool ls $(DEMO_DIR)
	$(PYTHON) scripts/demo_torch_load.py $(DEMO_DIR)

# Every phase runs even if an earlier one failed, so one run reports all
# failures; the target fails if any phase did. (One phase per recipe line, so
# that `make -n check` only prints the install test instead of running it.)
CHECK_FAILED = build/check-failed

check: build
	@rm -f $(CHECK_FAILED)
	@echo "==> [1/3] tests in build/ ($(BUILD_TYPE))"
	@$(MAKE) test || echo tests >> $(CHECK_FAILED)
	@echo "==> [2/3] tests in build-asan/ (ASan+UBSan, $(ASAN_CC))"
	@$(MAKE) asan || echo asan >> $(CHECK_FAILED)
	@echo "==> [3/3] install test (tests/install/run.sh build)"
	bash tests/install/run.sh build || echo install >> $(CHECK_FAILED)
	@if [ -f $(CHECK_FAILED) ]; then \
	  echo "make check: FAILED:" $$(cat $(CHECK_FAILED)) >&2; exit 1; fi
	@echo "make check: tests, asan tests and install test all passed"

# BENCH_ARGS: e.g. '--runs 7', or '--scale small --no-torch' for a smoke run
# (then also '--out DIR' to keep bench/ as it is).
BENCH_ARGS ?=

bench: build
	$(PYTHON) bench/run_bench.py --build build $(BENCH_ARGS)

test:
	$(CTEST) --test-dir build --output-on-failure --no-tests=error -j$(CTEST_J) $(CTEST_ARGS)

asan-build: deps
	$(CMAKE) -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug \
	  -DCMAKE_C_COMPILER=$(ASAN_CC) -DDCP_SANITIZE=address,undefined \
	  $(CONFIGURE_COMMON)
	$(CMAKE) --build build-asan -j$(NPROC)

asan: asan-build
	$(CTEST) --test-dir build-asan --output-on-failure --no-tests=error -j$(CTEST_J) $(CTEST_ARGS)

install-test: build
	bash tests/install/run.sh build

install: build
	DESTDIR="$(DESTDIR)" $(CMAKE) --install build

uninstall:
	@test -f build/install_manifest.txt || { \
	  echo "make uninstall: no build/install_manifest.txt" >&2; exit 1; }
	xargs -r -d '\n' -a build/install_manifest.txt -I{} rm -f "$(DESTDIR){}"

clean:
	rm -rf build build-asan build-tsan build-release build-fuzz

# clang-format 14 is what .clang-format was checked with (c-style.md 13).
# Tracked files plus new ones git does not ignore.
FORMAT_FILES = $(shell git ls-files -co --exclude-standard -- '*.c' '*.h' 2>/dev/null)

format-check:
	@test -n "$(FORMAT_FILES)" || { echo "format-check: no files (not a git checkout?)" >&2; exit 1; }
	@bash scripts/deps.sh --format >/dev/null
	clang-format-14 --dry-run --Werror $(FORMAT_FILES)

format:
	@test -n "$(FORMAT_FILES)" || { echo "format: no files (not a git checkout?)" >&2; exit 1; }
	@bash scripts/deps.sh --format >/dev/null
	clang-format-14 -i $(FORMAT_FILES)
