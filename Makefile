# Convenience entry points; the build itself is CMake.
#   make demo   set up, fetch the default models, build, chat with SmolLM2
#   make test   set up, fetch the models, build, run the whole test suite (ctest)
BUILD ?= build
ASAN_BUILD ?= build-asan
JOBS ?= $(shell nproc)
MODELS ?= $(HOME)/.cache/nanomind/models
PREFIX ?= /usr/local

.PHONY: all setup models build demo test test-asan install clean

all: build

setup:
	@bash scripts/setup.sh

models:
	@bash scripts/fetch_models.sh

build: setup
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=$(PREFIX) > /dev/null
	cmake --build $(BUILD) -j$(JOBS)

demo: build models
	./$(BUILD)/nanomind run -m $(MODELS)/SmolLM2-135M-Instruct.Q4_1.gguf --chat --temp 0 -n 200 --stats \
		-p "In three sentences, why is the sky blue?"

test: build models
	cd $(BUILD) && ctest --output-on-failure -j1

# The unit tests and fuzz-corpus replays under ASan+UBSan, plus one golden
# generation (the long golden checks run in the plain build only).
test-asan: setup models
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DNM_SANITIZE=ON > /dev/null
	cmake --build $(ASAN_BUILD) -j$(JOBS)
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
		ctest --output-on-failure -j1 -E 'golden_' && \
		NM_GOLDEN_QUICK=1 ctest --output-on-failure -R 'golden_test_generate'

install: build
	cmake --install $(BUILD)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)
