#!/usr/bin/env bash
# The public API as a user gets it: install the build into a scratch prefix,
# then compile tests/public/pipeline.c with nothing but the installed
# nanomind.h and `pkg-config nanomind`, and run it (an LLM brick and a TTS
# brick on their own threads, joined by rings). Also: the shared library
# exports the public API and nothing else. Prints "N passed, N failed, N skipped".
#   test_public_api.sh BUILD_DIR
set -u
build=$1
src=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$src/../.." && pwd)
models=${NM_MODEL_DIR:-$HOME/.cache/nanomind/models}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0 skip=0
ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; [ -n "${2:-}" ] && sed 's/^/     /' <<< "$2" | head -20; }

# 1. install, then every symbol the library exports is declared in the header
if out=$(cmake --install "$build" --prefix "$tmp/prefix" 2>&1); then ok install; else bad install "$out"; fi
lib=$(ls "$tmp"/prefix/lib*/libnanomind.so.0 2>/dev/null | head -1)
if [ -n "$lib" ]; then
    # (names starting with _ are the toolchain's and the sanitizers': _init, __odr_asan_gen_* ...)
    nm -D --defined-only "$lib" | awk '{print $3}' | grep -v '^_' | sort > "$tmp/exported"
    cat "$root/include/nanomind.h" "$root"/include/nanomind/*.h | grep -oE '\bnm_[a-z0-9_]+\(' | tr -d '(' | sort -u > "$tmp/declared"
    extra=$(comm -23 "$tmp/exported" "$tmp/declared")
    missing=$(comm -13 "$tmp/exported" "$tmp/declared")
    if [ -z "$extra" ] && [ -z "$missing" ]; then ok "exports_only_the_header ($(wc -l < "$tmp/exported") symbols)"
    else bad exports_only_the_header "exported, not declared: $extra
declared, not exported: $missing"; fi
else
    bad exports_only_the_header "no libnanomind.so.0 installed"
fi

# 2. a program built with the installed header and pkg-config alone
export PKG_CONFIG_PATH=$(dirname "$(ls "$tmp"/prefix/lib*/pkgconfig/nanomind.pc | head -1)")
flags=$(pkg-config --cflags --libs nanomind 2>&1)
# a sanitizer build's library needs its runtime in the program too
san=
if [ -n "$lib" ] && nm -D "$lib" | grep -q ' __asan_init'; then san="-fsanitize=address,undefined"; fi
if [ -n "$lib" ] && nm -D "$lib" | grep -q ' __tsan_init'; then san="-fsanitize=thread"; fi
if out=$(cc -std=c11 -Wall -Wextra -Werror $san -o "$tmp/pipeline" "$src/pipeline.c" $flags -pthread 2>&1); then
    ok "builds_with_pkg_config ($flags)"
else
    bad builds_with_pkg_config "$out"
fi
# it cannot reach an internal function: declaring one by hand does not link
cat > "$tmp/internal.c" <<'C'
#include <nanomind.h>
int nm_cpu_features_str(void); /* internal: src/core/cpu.h */
int main(void) { return nm_cpu_features_str(); }
C
if out=$(cc $san -o "$tmp/internal" "$tmp/internal.c" $flags 2>&1); then bad internal_symbols_hidden "linked"
else ok internal_symbols_hidden; fi

# 3. run it on the default model
if [ ! -f "$models/SmolLM2-135M-Instruct.Q4_1.gguf" ]; then
    if [ -n "${NM_CI:-}" ] && [ "$NM_CI" != 0 ]; then bad pipeline_runs "SmolLM2 missing under NM_CI"
    else skip=$((skip + 1)); echo "skip pipeline_runs (SmolLM2 not in $models)"; fi
elif [ -x "$tmp/pipeline" ]; then
    out=$(LD_LIBRARY_PATH=$(dirname "$lib") timeout 120 "$tmp/pipeline" "$models/SmolLM2-135M-Instruct.Q4_1.gguf" \
          "The capital of France is" 12 2>&1)
    rc=$?
    # the LLM and its rings copy nothing; the TTS brick's copies are its engine's (text in, samples out)
    if [ $rc = 0 ] && grep -q "^answer: 12 tokens" <<< "$out" && grep -qE "^speech: [1-9][0-9]+ samples" <<< "$out" \
       && ! grep -q "llm" <<< "$(grep '^ledger:  ' <<< "$out")"; then
        ok "pipeline_runs ($(grep '^speech' <<< "$out"))"
    else
        bad pipeline_runs "$out"
    fi
else
    bad pipeline_runs "not built"
fi
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" = 0 ]
