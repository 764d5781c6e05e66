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

# 4. the examples (examples/*.c), built the same way, answer as the command does on the default models:
# chat.c's conversation is `nanomind run --chat` with the library's default seed; transcribe.c's
# segments are `nanomind transcribe`'s; assistant.c (at most 80 lines) hears, answers and speaks two
# spoken questions into a folder (and one with an image), and names a question it cannot read; server.c
# serves `run`'s completion on a port the system picks, and exits 0 on SIGTERM
for e in chat transcribe assistant server; do
    if out=$(cc -std=c11 -Wall -Wextra -Werror $san -o "$tmp/$e" "$root/examples/$e.c" $flags -pthread 2>&1); then
        ok "example_${e}_builds ($(wc -l < "$root/examples/$e.c") lines)"
    else
        bad "example_${e}_builds" "$out"
    fi
done
nm_bin=$build/nanomind
W=$models/whisper-tiny.en.gguf M=$models/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -f "$M" ] || [ ! -f "$W" ]; then
    if [ -n "${NM_CI:-}" ] && [ "$NM_CI" != 0 ]; then bad examples_answer "a default model missing under NM_CI"
    else skip=$((skip + 1)); echo "skip examples_answer (SmolLM2 or Whisper not in $models)"; fi
elif [ -x "$tmp/chat" ] && [ -x "$tmp/transcribe" ]; then
    qs=$'What is the capital of France?\nAnd of Italy?\n'
    a=$(LD_LIBRARY_PATH=$(dirname "$lib") timeout 120 "$tmp/chat" "$M" <<< "$qs" 2>/dev/null)
    b=$(timeout 120 "$nm_bin" run -m "$M" --chat --seed 24301 <<< "$qs" 2>/dev/null)
    if [ -n "$a" ] && [ "$a" = "$b" ]; then ok "example_chat_as_run ($(head -c 60 <<< "$a" | tr '\n' ' '))"
    else bad example_chat_as_run "example: $a
run:     $b"; fi
    speech=$root/tests/data/speech
    a=$(LD_LIBRARY_PATH=$(dirname "$lib") timeout 300 "$tmp/transcribe" "$W" "$speech/tts_16k.wav" "$speech/tts_long.ogg" 2>&1)
    b=$(timeout 300 "$nm_bin" transcribe -m "$W" "$speech/tts_16k.wav" "$speech/tts_long.ogg" 2>/dev/null)
    strip() { sed 's/^\[[^]]*\] *//'; }
    if [ "$(wc -l <<< "$a")" -ge 3 ] && [ "$(strip <<< "$a")" = "$(strip <<< "$b")" ]; then
        ok "example_transcribe_as_transcribe ($(wc -l <<< "$a") segments)"
    else
        bad example_transcribe_as_transcribe "example: $a
transcribe: $b"
    fi
    # a file that cannot be read: named, a non-zero exit, the next file still transcribed
    a=$(LD_LIBRARY_PATH=$(dirname "$lib") timeout 120 "$tmp/transcribe" "$W" /nonexistent.wav "$speech/tts_16k.wav" 2>&1)
    rc=$?
    if [ $rc = 1 ] && grep -q "/nonexistent.wav: cannot open" <<< "$a" && grep -q "quick brown fox" <<< "$a"; then
        ok example_transcribe_bad_file
    else
        bad example_transcribe_bad_file "rc $rc: $a"
    fi
else
    bad examples_answer "not built"
fi
if [ ! -f "$M" ]; then
    skip=$((skip + 1)); echo "skip example_server (SmolLM2 not in $models)"
elif [ -x "$tmp/server" ]; then
    : > "$tmp/server.out"
    LD_LIBRARY_PATH=$(dirname "$lib") "$tmp/server" "$M" 0 > "$tmp/server.out" 2> "$tmp/server.err" &
    spid=$!
    port=
    for _ in $(seq 1 300); do
        port=$(sed -n 's|^listening on http://127.0.0.1:\([0-9]*\)$|\1|p' "$tmp/server.out")
        [ -n "$port" ] && break
        sleep 0.1
    done
    a=$(curl -s "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
        -d '{"prompt": "The capital of France is", "max_tokens": 6, "temperature": 0}' |
        python3 -c 'import json, sys; print("The capital of France is" + json.load(sys.stdin)["choices"][0]["text"])' 2>&1)
    b=$(timeout 120 "$nm_bin" run -m "$M" -no-cnv -p "The capital of France is" -n 6 --temp 0 2>/dev/null)
    kill -TERM $spid
    wait $spid
    rc=$?
    if [ -n "$port" ] && [ "$a" = "$b" ] && [ $rc = 0 ]; then ok "example_server_answers_as_run (port $port)"
    else bad example_server_answers_as_run "port '$port', rc $rc: '$a' against run's '$b' $(cat "$tmp/server.err")"; fi
else
    bad example_server "not built"
fi
if [ ! -f "$M" ] || [ ! -f "$W" ]; then
    skip=$((skip + 1)); echo "skip example_assistant (SmolLM2 or Whisper not in $models)"
elif [ -x "$tmp/assistant" ]; then
    q=$root/tests/data/speech/tts_16k.wav
    [ "$(wc -l < "$root/examples/assistant.c")" -le 80 ] && ok example_assistant_at_most_80_lines || bad example_assistant_at_most_80_lines
    mkdir -p "$tmp/said" "$tmp/said_img" "$tmp/said_bad"
    a=$(LD_LIBRARY_PATH=$(dirname "$lib") timeout 300 "$tmp/assistant" "$M" "$W" - - "$tmp/said" "$q" "$q" 2> "$tmp/said.err")
    rc=$?
    frames=$(python3 -c "import sys, wave
print(' '.join('%d@%d' % (w.getnframes(), w.getframerate()) for w in (wave.open(f) for f in sys.argv[1:])))" "$tmp/said/answer-1.wav" "$tmp/said/answer-2.wav" 2>&1)
    if [ $rc = 0 ] && [ "$(grep -c . <<< "$a")" -ge 2 ] && [ "$(grep -c '^asked: .*quick brown fox' "$tmp/said.err")" = 2 ] \
       && grep -qE '^[1-9][0-9]{4,}@22050 [1-9][0-9]{4,}@22050$' <<< "$frames"; then
        ok "example_assistant_answers_aloud ($frames)"
    else
        bad example_assistant_answers_aloud "rc $rc: $a $(cat "$tmp/said.err") $frames"
    fi
    LD_LIBRARY_PATH=$(dirname "$lib") timeout 300 "$tmp/assistant" "$M" "$W" "$root/tests/data/vlm/vlm-mmproj-q8_0.gguf" \
        "$root/tests/data/vlm/scene-4242-1.ppm" "$tmp/said_img" "$q" > /dev/null 2>&1
    rc=$?
    if [ $rc = 0 ] && [ -s "$tmp/said_img/answer-1.wav" ]; then ok example_assistant_with_an_image
    else bad example_assistant_with_an_image "rc $rc"; fi
    a=$(LD_LIBRARY_PATH=$(dirname "$lib") timeout 300 "$tmp/assistant" "$M" "$W" - - "$tmp/said_bad" /nonexistent.wav "$q" 2>&1)
    rc=$?
    if [ $rc = 1 ] && grep -q "/nonexistent.wav" <<< "$a" && [ -s "$tmp/said_bad/answer-1.wav" ]; then
        ok example_assistant_bad_file
    else
        bad example_assistant_bad_file "rc $rc: $a"
    fi
else
    bad example_assistant "not built"
fi
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" = 0 ]
