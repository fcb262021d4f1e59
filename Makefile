# Thin wrapper over CMake. The build system is CMake (CMakeLists.txt,
# CMakePresets.json); this file only strings the usual steps together.
#
#   make demo           build; PyTorch first: the getting-started tutorial
#                       with `import dcp_torch as dcp` (FSDP, 2 ranks saving,
#                       3 loading) and the drop-in writer/reader; then save
#                       a checkpoint with dcp, inspect it with
#                       dcptool, load it with PyTorch; a C trainer
#                       (examples/train_mlp.c) resumed bit-identically on 2
#                       and on 3 MPI ranks; then a GPT-2-small state saved on
#                       4 MPI ranks, loaded on 3 (DEMO_KEEP=1 keeps its
#                       1.5 GB in build/demo-gpt2)
#   make check          build + all tests, ASan+UBSan build + all tests,
#                       TSan build + the async tests, install test, libFuzzer
#                       time box (what CI runs, through .ci/run)
#   make bench          save/load throughput vs fio and PyTorch DCP on the
#                       GPT-2 + AdamW state (1.5 GB; several minutes):
#                       bench/RESULTS.md, bench/results.json, bench/io_bench.png;
#                       then make bench-s3
#   make bench-s3       save/load through s3:// vs boto3's transfer manager
#                       and PyTorch DCP's fsspec S3 path, on radosgw
#                       (loopback; S3_SERVER=moto for moto): the s3_* keys
#                       of bench/results.json
#   make bench-cluster  the cluster_* figures on a cluster on one machine
#                       (scripts/cluster/, needs root; about 2 minutes)
#   make fuzz           libFuzzer targets (build-fuzz/, clang-14, ASan+UBSan),
#                       FUZZ_TIME seconds each (tests/fuzz/run_fuzz.sh)
#   make reliability    every reliability suite in its full version, with
#                       the figures of docs/RELIABILITY.md
#   make build | test | asan | tsan | install-test | install | clean |
#        format-check
#
# Variables: PREFIX (/usr/local), DESTDIR, BUILD_TYPE (RelWithDebInfo),
# ASAN_CC (clang-14), TSAN_CC (clang-14), CTEST_J (2), CTEST_ARGS (e.g.
# CTEST_ARGS='-L unit'), FUZZ_CC (clang-14), FUZZ_TIME (30 s per target;
# make reliability: 120).

PREFIX     ?= /usr/local
DESTDIR    ?=
BUILD_TYPE ?= RelWithDebInfo
ASAN_CC    ?= clang-14
TSAN_CC    ?= clang-14
FUZZ_CC    ?= clang-14
FUZZ_TIME  ?= 30
CTEST_J    ?= 2
CTEST_ARGS ?=
NPROC      := $(shell nproc 2>/dev/null || echo 2)
PYTHON     := $(CURDIR)/.venv/bin/python
CMAKE      ?= cmake
CTEST      ?= ctest
DEMO_DIR   ?= build/demo-ckpt
GPT2_DIR   ?= build/demo-gpt2
TRAIN_DIR  ?= build/demo-train

MAKEFLAGS += --no-print-directory

CONFIGURE_COMMON = -DDCP_PYTHON=$(PYTHON) -DCMAKE_INSTALL_PREFIX=$(PREFIX)

.PHONY: all deps build configure demo check test asan asan-build tsan \
        tsan-build install install-test uninstall clean format format-check \
        help bench bench-s3 bench-cluster fuzz fuzz-build reliability

all: build

help:
	@sed -n '4,36p' Makefile

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
	rm -rf build/demo-python build/demo-tutorial build/demo-tutorial.ref.pt
	PYTHONPATH=$(CURDIR)/build/python $(PYTHON) examples/python/tutorials/getting_started.py \
	  build/demo-tutorial --save-ranks 2 --load-ranks 3
	PYTHONPATH=$(CURDIR)/build/python $(PYTHON) examples/python/dropin.py build/demo-python
	rm -rf $(DEMO_DIR)
	build/dcp_demo $(DEMO_DIR)
	build/dcptool info $(DEMO_DIR)
	build/dcptool ls $(DEMO_DIR)
	$(PYTHON) scripts/demo_torch_load.py $(DEMO_DIR)
	bash scripts/demo_train.sh build $(TRAIN_DIR)
	bash scripts/demo_gpt2.sh build $(GPT2_DIR)

# Every phase runs even if an earlier one failed, so one run reports all
# failures; the target fails if any phase did. (One phase per recipe line, so
# that `make -n check` only prints the install test instead of running it.)
CHECK_FAILED = build/check-failed

check: build
	@rm -f $(CHECK_FAILED)
	@echo "==> [1/5] tests in build/ ($(BUILD_TYPE))"
	@$(MAKE) test || echo tests >> $(CHECK_FAILED)
	@echo "==> [2/5] tests in build-asan/ (ASan+UBSan, $(ASAN_CC))"
	@$(MAKE) asan || echo asan >> $(CHECK_FAILED)
	@echo "==> [3/5] async tests in build-tsan/ (ThreadSanitizer, $(TSAN_CC))"
	@$(MAKE) tsan || echo tsan >> $(CHECK_FAILED)
	@echo "==> [4/5] install test (tests/install/run.sh build)"
	bash tests/install/run.sh build || echo install >> $(CHECK_FAILED)
	@echo "==> [5/5] libFuzzer, $(FUZZ_TIME) s per target (build-fuzz/)"
	@$(MAKE) fuzz || echo fuzz >> $(CHECK_FAILED)
	@if [ -f $(CHECK_FAILED) ]; then \
	  echo "make check: FAILED:" $$(cat $(CHECK_FAILED)) >&2; exit 1; fi
	@echo "make check: tests, asan tests, tsan tests, install test and fuzzing all passed"

# BENCH_ARGS: e.g. '--runs 7', or '--scale small --no-torch' for a smoke run
# (then also '--out DIR' to keep bench/ as it is).
BENCH_ARGS ?=

# PY_BENCH_RUNS: repetitions of each save and load of bench/py_dropin_bench.py
# (PyTorch through dcp_torch's drop-in storage against torch's own, issue 28);
# PY_BENCH_ARGS: e.g. '--smoke --out /tmp/x' for a quick check.
PY_BENCH_RUNS ?= 3
PY_BENCH_ARGS ?=
# PY_API_BENCH_ARGS: the same for bench/py_api_bench.py (issue 31 item 6).
PY_API_BENCH_ARGS ?=

bench: build
	$(PYTHON) bench/run_bench.py --build build $(BENCH_ARGS)
	$(MAKE) bench-s3
	PYTHONPATH=$(CURDIR)/build/python $(PYTHON) bench/py_dropin_bench.py --build build \
	  --runs $(PY_BENCH_RUNS) $(PY_BENCH_ARGS)
	PYTHONPATH=$(CURDIR)/build/python $(PYTHON) bench/py_api_bench.py --build build \
	  --runs $(PY_BENCH_RUNS) $(PY_API_BENCH_ARGS)

# The S3 benchmark alone (bench/s3_bench.py against a server on loopback:
# radosgw, S3_SERVER=moto for moto); S3_BENCH_ARGS: e.g. '--runs 3' or
# '--scale medium'.
S3_SERVER ?= rgw
S3_BENCH_ARGS ?=
bench-s3: build
	DCP_S3_ENV_TIMEOUT=3600 $(PYTHON) tests/s3/s3_env.py --server $(S3_SERVER) \
	  $(PYTHON) bench/s3_bench.py --build build $(S3_BENCH_ARGS)

# Read once, tier restore from peers, save and load against the capped
# store link, on 4 nodes (tests/cluster/run.sh --bench; docs/CLUSTER.md):
# the cluster_* keys of bench/results.json and bench/cluster.png.
bench-cluster: build
	bash tests/cluster/run.sh --bench build/tests/cluster/cluster_ckpt bench/results.json
	$(PYTHON) bench/cluster_plot.py bench/results.json bench/cluster.png

test:
	$(CTEST) --test-dir build --output-on-failure --no-tests=error -j$(CTEST_J) $(CTEST_ARGS)

asan-build: deps
	$(CMAKE) -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug \
	  -DCMAKE_C_COMPILER=$(ASAN_CC) -DDCP_SANITIZE=address,undefined \
	  $(CONFIGURE_COMMON)
	$(CMAKE) --build build-asan -j$(NPROC)

asan: asan-build
	$(CTEST) --test-dir build-asan --output-on-failure --no-tests=error -j$(CTEST_J) $(CTEST_ARGS)

# ThreadSanitizer over the tests labelled async (the asynchronous save and
# its worker thread, the CUDA staging path against the fake libcudart), in
# a serial build so that MPI's own threads add no noise (c-style.md 14).
TSAN_TARGETS = test_async test_phases cuda_roundtrip fake_cudart

tsan-build: deps
	$(CMAKE) -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DCMAKE_C_COMPILER=$(TSAN_CC) -DDCP_SANITIZE=thread -DDCP_WITH_MPI=OFF \
	  -DDCP_BUILD_PYTHON=OFF $(CONFIGURE_COMMON)
	$(CMAKE) --build build-tsan -j$(NPROC) --target $(TSAN_TARGETS)

tsan: tsan-build
	$(CTEST) --test-dir build-tsan --output-on-failure --no-tests=error -j$(CTEST_J) -L async
# libFuzzer binaries only (the library instrumented, no MPI): tests/fuzz/.
fuzz-build: deps
	$(CMAKE) -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DCMAKE_C_COMPILER=$(FUZZ_CC) -DDCP_SANITIZE=address,undefined \
	  -DDCP_BUILD_FUZZERS=ON -DDCP_WITH_MPI=OFF -DDCP_BUILD_EXAMPLES=OFF \
	  $(CONFIGURE_COMMON)
	$(CMAKE) --build build-fuzz -j$(NPROC) --target fuzz_pickle \
	  fuzz_torchzip fuzz_metadata fuzz_safetensors fuzz_srcfile

fuzz: fuzz-build
	bash tests/fuzz/run_fuzz.sh build-fuzz $(FUZZ_TIME)

# Full versions of the reliability suites and their figures (several
# minutes; docs/RELIABILITY.md). FUZZ_TIME defaults to 120 s here.
reliability: build
	@$(MAKE) fuzz-build
	bash scripts/reliability.sh build build-fuzz \
	  $(if $(filter command line environment,$(origin FUZZ_TIME)),$(FUZZ_TIME),120)

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
