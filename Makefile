# Convenience entry points; the build itself is CMake.
#   make demo   set up, fetch the default models, build, then a spoken question answered and spoken back
#               (TTS -> Whisper -> SmolLM2 -> TTS, scripts/demo.sh)
#   make test   set up, fetch the models, build, run the whole test suite (ctest)
#   make test-minimal  the library without its optional parts (LLM only, every NM_WITH_* OFF):
#               its unit tests and what libnanomind.so links (tests/public/test_parts.sh)
BUILD ?= build
MIN_BUILD ?= build-min
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
JOBS ?= $(shell nproc)
# The sanitizer builds: optimized, with line tables only (-g1: the reports' stacks name file and line,
# and there is less to compile and link than with -g)
SAN_TYPE = -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG"
MODELS ?= $(HOME)/.cache/nanomind/models
PREFIX ?= /usr/local

.PHONY: all setup models build demo test test-minimal test-asan test-tsan test-arm mutate mutate-sample install clean

all: build

setup:
	@bash scripts/setup.sh

models:
	@bash scripts/fetch_models.sh

build: setup
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=$(PREFIX) > /dev/null
	cmake --build $(BUILD) -j$(JOBS)

demo: build models
	@BUILD=$(BUILD) MODELS=$(MODELS) bash scripts/demo.sh

# NM_CI=1: set-up has fetched every model, so a case that finds one missing
# fails instead of skipping. The last line adds up every program's cases.
test: build models
	cd $(BUILD) && NM_CI=1 ctest --output-on-failure -j1; rc=$$?; cd $(CURDIR) && \
		bash tests/summary.sh $(BUILD) && exit $$rc

# The minimal configuration: no speech, vision, server or OpenCL, so no GPL
# (espeak-ng) and none of their libraries. Its unit tests (those of the parts
# it has) and the `parts` check; the golden runs are the full build's.
NM_MINIMAL = -DNM_WITH_STT=OFF -DNM_WITH_TTS=OFF -DNM_WITH_VISION=OFF -DNM_WITH_SERVER=OFF -DNM_WITH_OPENCL=OFF
test-minimal: setup models
	cmake -S . -B $(MIN_BUILD) -DCMAKE_BUILD_TYPE=Release $(NM_MINIMAL) > /dev/null
	cmake --build $(MIN_BUILD) -j$(JOBS)
	cd $(MIN_BUILD) && NM_CI=1 ctest --output-on-failure -j1 -R '^(test_|parts$$)'; rc=$$?; \
		cd $(CURDIR) && bash tests/summary.sh $(MIN_BUILD) && exit $$rc

# Everything but the perplexity runs, the spin model check (no C of ours in
# it), the docs' figures (the same runs, timed by the Release build), the long
# speech decodes, and the three checks of numbers or of the install that walk
# no path the others do not (piper_ort: our voice against onnxruntime; vlm: the
# trained VLM's answers; public_api: the installed library's exports) under
# ASan+UBSan: unit tests, fuzz-corpus replays, the CLI and server tests, and
# the golden generation and architecture tests (the forward pass of every arch
# and its error paths). The library's SIMD kernels are not ASan-instrumented
# in this build, the kernel tests' copies are (CMakeLists.txt: NM_SIMD_SPLIT).
# (NM_SANITIZED=1: the server test skips the cases its NUMERIC_REPEATS names.)
# The tests with no C of ours in them (Python against Python) run in the Release build only.
NM_PY_ONLY = ^(convert_piper|fetch_models|jinja_expect|mutants_texts|mutation_harness)$$
test-asan: setup models
	cmake -S . -B $(ASAN_BUILD) $(SAN_TYPE) -DNM_SANITIZE=ON > /dev/null
	cmake --build $(ASAN_BUILD) -j$(JOBS)
	cd $(ASAN_BUILD) && NM_CI=1 NM_SANITIZED=1 ASAN_OPTIONS=detect_leaks=1 LSAN_OPTIONS=suppressions=$(CURDIR)/tests/asan/lsan.supp UBSAN_OPTIONS=print_stacktrace=1 \
		ctest --output-on-failure -j1 -E 'golden_test_perplexity|golden_test_opencl|spin_|test_transcribe|check_docs|piper_ort|^vlm$$|public_api|$(NM_PY_ONLY)'; rc=$$?; \
		cd $(CURDIR) && bash tests/summary.sh $(ASAN_BUILD) && exit $$rc
	# test_transcribe's whisper.cpp comparison and WER cases decode minutes of
	# speech (too slow instrumented); its other cases run here.
	for t in wer_levenshtein output_formats null_arguments slot_path_and_errors silence; do \
		ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
		NM_CI=1 NM_MODEL_DIR=$(MODELS) ./$(ASAN_BUILD)/test_transcribe --filter $$t || exit 1; done

# The concurrent code under ThreadSanitizer: the pool, the ops it runs, and the
# TABM ring (its stress test runs a smaller count under TSan; its dead-peer kills) and the LLM brick on rings.
test-tsan: setup
	cmake -S . -B $(TSAN_BUILD) $(SAN_TYPE) -DNM_TSAN=ON > /dev/null
	cmake --build $(TSAN_BUILD) -j$(JOBS) --target test_threadpool test_backend test_tabm test_tabm_stress test_tabm_xproc test_tabm_deadpeer test_tabm_llm_brick test_tabm_vision test_tts test_brick test_pipeline test_piper
	cd $(TSAN_BUILD) && TSAN_OPTIONS=halt_on_error=1 ctest --output-on-failure -j1 -R 'test_threadpool|test_backend|test_tabm|test_tts|test_brick'
	# the pipeline's threads (feed, answers, speech, delivery, the lanes, a caller hearing and cancelling, the
	# bricks freed and loaded between requests): the cases that race them hardest (its whole run takes
	# ~8 min under TSan)
	for f in barge_in cancel_then conversation_keeps power head_ended batches events_pushed vision_alone; do \
		TSAN_OPTIONS=halt_on_error=1 NM_TEST_FILTER=$$f $(TSAN_BUILD)/test_pipeline || exit 1; done
	# the Piper voice's convolutions and decoder on two threads (tiles, elementwise chunks)
	TSAN_OPTIONS=halt_on_error=1 NM_TEST_FILTER=conv $(TSAN_BUILD)/test_piper
	TSAN_OPTIONS=halt_on_error=1 NM_TEST_FILTER=piper_tiny $(TSAN_BUILD)/test_piper

# The quant kernels cross-built for aarch64 and run under qemu, with and
# without dotprod (correctness only). Installs the cross toolchain if missing.
test-arm:
	@JOBS=$(JOBS) bash scripts/test_arm.sh

# The mutation harness (tests/mutation/mutate.py): every mutant in
# tests/mutation/mutants.txt applied to a scratch copy of the tree, its tests
# run, killed or survived recorded (a row each in $(MUTATE_REPORT) as it ends).
# It resumes: a mutant with a row for this tree is not run again, so an
# interrupted `make mutate` goes on where it stopped. SHARD=K/N runs shard K
# of N (make mutate SHARD=2/5), into the same report; FRESH=1 empties the
# report first. mutate-sample runs MUTATE_N of them, a slice that rotates
# with the commit (what CI runs),
# a mutant's tests stopped after 150 s (the slowest passing set takes ~60 s;
# a mutant that makes Whisper decode garbage to its token limit, or a TABM
# wait hang, is killed by that timeout, not waited for).
# MUTATE_IN_PLACE=BUILD (CI, on its fresh clone, right after `make test`
# passed in BUILD): the mutants go into this tree and that build, no scratch
# copy built and no baseline run again (mutate.py --in-place BUILD --tested).
MUTATE_N ?= 4
MUTATE_IN_PLACE ?=
MUTATE_REPORT ?= /tmp/nm-mutate/report.md
SHARD ?=
FRESH ?=
mutate: setup models
	NM_CI=1 python3 tests/mutation/mutate.py --jobs $(JOBS) --report $(MUTATE_REPORT) \
		$(if $(SHARD),--shard $(SHARD)) $(if $(FRESH),--fresh)
mutate-sample: setup models
	NM_CI=1 python3 tests/mutation/mutate.py --jobs $(JOBS) --sample $(MUTATE_N) --timeout 150 \
		$(if $(MUTATE_IN_PLACE),--in-place $(MUTATE_IN_PLACE) --tested)

install: build
	cmake --install $(BUILD)

clean:
	rm -rf $(BUILD) $(MIN_BUILD) $(ASAN_BUILD) $(TSAN_BUILD)
