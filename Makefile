# qwenrt top-level Makefile: thin wrappers around CMake and the project scripts.
#   make        build build/qwenrt (installs missing Debian packages first)
#   make demo   build, then run the main job on an embedded default model
#   make test   build and run every test, then the whole suite again under ASan + UBSan
#               (build-asan/, ASAN_BUILD=) and a generate run under valgrind (tests/cli_valgrind.sh)
#   make fuzz   build the libFuzzer targets (build-fuzz/) and run each FUZZ_SECONDS (default 60)
#   make test-cuda  build and run the GPU tests (skipped without a GPU)
BUILD ?= build
CMAKE_FLAGS ?=
JOBS ?= $(shell nproc)

.PHONY: all deps configure demo test test-asan fuzz test-cuda clean

all: configure
	cmake --build $(BUILD) -j $(JOBS)

deps:
	./scripts/setup.sh

configure: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) >/dev/null

demo: all
	./scripts/demo.sh $(BUILD)/qwenrt

test: all
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)
	$(MAKE) test-asan

# Every test program again with AddressSanitizer + UndefinedBehaviorSanitizer (CUDA off: the
# sanitizers watch host code; the shell tests run the sanitized qwenrt). ASAN_CTEST= passes
# ctest filters (e.g. -E test_gdn_chunked) when a slow test must be left out locally.
ASAN_BUILD ?= build-asan
ASAN_CTEST ?=
test-asan: deps
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Release -DQWENRT_SANITIZE=ON \
		-DQWENRT_CUDA=OFF >/dev/null
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	ctest --test-dir $(ASAN_BUILD) --output-on-failure -j $(JOBS) $(ASAN_CTEST)

fuzz: deps
	./scripts/fuzz.sh

# The CUDA tests (label cuda): skipped (exit 77) where no GPU can be used.
test-cuda: all
	ctest --test-dir $(BUILD) --output-on-failure -L cuda

clean:
	rm -rf $(BUILD)/CMakeFiles $(BUILD)/CMakeCache.txt $(BUILD)/qwenrt $(BUILD)/test_*
