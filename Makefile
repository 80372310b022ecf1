# Thin wrapper over CMake for the commands in README.md. CMakeLists.txt is the build.
#   make run    install what is missing, build, tell a story with stories260K
#   make test   install, build, run every test (release, then ASan+UBSan, then fuzz smoke)
JOBS ?= $(shell nproc)
SHARED ?= $(abspath ../shared)
MODEL ?= $(SHARED)/models/stories260K.gguf
PROMPT ?= Once upon a time
# -n -1: until the story ends or the model's context (128 tokens for stories260K) is full
TOKENS ?= -1
FUZZ_SECONDS ?= 20

.PHONY: all deps build run test test-fast test-asan test-fuzz clean

all: build

deps:
	@scripts/install-deps.sh

build: deps
	@cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build build -j $(JOBS)

run: build
	./build/weld generate -m "$(MODEL)" -p "$(PROMPT)" -n $(TOKENS)

test-fast: build
	cd build && ctest --output-on-failure -j $(JOBS)

test-asan: deps
	@cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_COMPILER=clang -DWELD_SANITIZE=ON >/dev/null
	@cmake --build build-asan -j $(JOBS)
	cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j $(JOBS)

test-fuzz: deps
	@cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_COMPILER=clang -DWELD_FUZZ=ON >/dev/null
	@cmake --build build-fuzz -j $(JOBS)
	@scripts/run-fuzz.sh build-fuzz/tests $(FUZZ_SECONDS)

test: test-fast test-asan test-fuzz

clean:
	rm -rf build build-asan build-fuzz
