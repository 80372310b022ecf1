# Thin wrapper over CMake for the commands in README.md. CMakeLists.txt is the build.
#   make model  fetch stories260K.gguf into $(SHARED)/models if it is not there
#   make run    install what is missing, build, tell a story with stories260K
#   make test   install, build, run every test (release, then ASan+UBSan, then fuzz smoke)
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
FUZZ_SECONDS ?= 20

.PHONY: all deps build model run test test-fast test-asan test-fuzz clean

all: build

deps:
	@scripts/install-deps.sh

build: deps
	@cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build build -j $(JOBS)

model:
	@scripts/fetch-model.sh "$(STORIES_URL)" "$(STORIES)" $(STORIES_SHA256)

# the default model is fetched when missing; a MODEL=... of your own is used as given
run: build $(if $(filter $(STORIES),$(MODEL)),model)
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
