# qwenrt top-level Makefile: thin wrappers around CMake and the project scripts.
#   make        build build/qwenrt (installs missing Debian packages first)
#   make demo   build, then run the main job on an embedded default model
#   make test   build and run every test
#   make test-cuda  build and run the GPU tests (skipped without a GPU)
BUILD ?= build
CMAKE_FLAGS ?=
JOBS ?= $(shell nproc)

.PHONY: all deps configure demo test test-cuda clean

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

# The CUDA tests (label cuda): skipped (exit 77) where no GPU can be used.
test-cuda: all
	ctest --test-dir $(BUILD) --output-on-failure -L cuda

clean:
	rm -rf $(BUILD)/CMakeFiles $(BUILD)/CMakeCache.txt $(BUILD)/qwenrt $(BUILD)/test_*
