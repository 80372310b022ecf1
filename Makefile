# Thin wrapper over CMake for the commands in README.md. CMakeLists.txt is the build.
#   make model      fetch stories260K.gguf into $(SHARED)/models if it is not there
#   make run        install what is missing, build, tell a story with stories260K
#   make check      build, run the unit tests (ctest -L unit; ~20 s): the edit-compile-test loop
#   make test       what CI runs (~12 min on 2 cores from scratch): test-fast, test-asan, test-fuzz
#   make test-fast  release build, every test (ctest -j)
#   make test-asan  ASan+UBSan build, the tests labelled asan
#   make test-fuzz  fuzz build, each libFuzzer target for FUZZ_SECONDS (10), JOBS at a time
#   make fuzz-long  the same for FUZZ_LONG_SECONDS (600) each
#   make format-check  clang-format on the lines changed since FORMAT_BASE (HEAD~1), as CI does
JOBS ?= $(shell nproc)
SHARED ?= $(abspath ../shared)
STORIES := $(SHARED)/models/stories260K.gguf
# Karpathy's llama2.c stories260K converted to GGUF (ggml-org/tiny-llamas on Hugging Face)
STORIES_URL ?= https://huggingface.co/ggml-org/tiny-llamas/resolve/main/stories260K.gguf
STORIES_SHA256 := 047bf46455a544931cff6fef14d7910154c56afbc23ab1c5e56a72e69912c04b
MODEL ?= $(STORIES)
PROMPT ?= Once upon a time
# -n -1: until the story ends or the model's context (128 tokens for stories260K) is full
TOKENS ?= -1
FUZZ_SECONDS ?= 10
FUZZ_LONG_SECONDS ?= 600
FORMAT_BASE ?= HEAD~1

.PHONY: all deps build model run check test test-fast test-asan test-fuzz fuzz-long \
	fuzz-build format-check clean

all: build

deps:
	@scripts/install-deps.sh

build: deps
	@cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DWELD_SHARED=$(SHARED) >/dev/null
	@cmake --build build -j $(JOBS)

model:
	@scripts/fetch-model.sh "$(STORIES_URL)" "$(STORIES)" $(STORIES_SHA256)

# the default model is fetched when missing; a MODEL=... of your own is used as given
run: build $(if $(filter $(STORIES),$(MODEL)),model)
	./build/weld generate -m "$(MODEL)" -p "$(PROMPT)" -n $(TOKENS)

check: build
	cd build && ctest --output-on-failure -j $(JOBS) -L unit

test-fast: build
	cd build && ctest --output-on-failure -j $(JOBS)

test-asan: deps
	@cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_COMPILER=clang -DWELD_SANITIZE=ON -DWELD_SHARED=$(SHARED) >/dev/null
	@cmake --build build-asan -j $(JOBS)
	cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j $(JOBS) -L asan

fuzz-build: deps
	@cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_COMPILER=clang -DWELD_FUZZ=ON -DWELD_SHARED=$(SHARED) >/dev/null
	@cmake --build build-fuzz -j $(JOBS) --target fuzz_all

test-fuzz: fuzz-build
	@scripts/run-fuzz.sh build-fuzz/tests $(FUZZ_SECONDS) $(JOBS)

fuzz-long: fuzz-build
	@scripts/run-fuzz.sh build-fuzz/tests $(FUZZ_LONG_SECONDS) $(JOBS)

test: test-fast test-asan test-fuzz

format-check:
	@scripts/check-format.sh $(FORMAT_BASE)

clean:
	rm -rf build build-asan build-fuzz
