#!/usr/bin/env bash
# The optional parts (CMakeLists.txt, NM_WITH_*) as a build has them:
#  - libnanomind.so needs (readelf -d) only what the built parts bring, never
#    FFTW (GPL-2), and, without NM_WITH_TTS, nothing of espeak-ng's GPL-3
#    chain (espeak-ng, pcaudio, PulseAudio, X11, systemd) down its whole ldd tree;
#  - it exports exactly the header's calls in every build (src/off/ stands in);
#  - the command names the CMake option where it is asked for a part left out;
#  - an LLM-only run works.
# Prints how many libraries it needs and loads, then "N passed, N failed, N skipped".
#   test_parts.sh BUILD_DIR NANOMIND "NM_WITH_STT=1;NM_WITH_TTS=0;..."
set -u
build=$1 NM=$2 defs=$3
root=$(cd "$(dirname "$0")/../.." && pwd)
models=${NM_MODEL_DIR:-$HOME/.cache/nanomind/models}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0 skip=0
ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; [ -n "${2:-}" ] && sed 's/^/     /' <<< "$2" | head -20; }
skipped() {
    if [ -n "${NM_CI:-}" ] && [ "$NM_CI" != 0 ]; then bad "$1" "$2 (NM_CI: set-up should have fetched it)"
    else skip=$((skip + 1)); echo "skip $1: $2"; fi
}
declare -A with
for d in ${defs//;/ }; do with[${d%=*}]=${d#*=}; done
for p in STT TTS VISION SERVER OPENCL; do
    [ -n "${with[NM_WITH_$p]:-}" ] || { echo "test_parts.sh: no NM_WITH_$p in '$defs'" >&2; exit 2; }
done
audio=$(( with[NM_WITH_STT] || with[NM_WITH_TTS] ))
echo "  parts: STT ${with[NM_WITH_STT]} TTS ${with[NM_WITH_TTS]} VISION ${with[NM_WITH_VISION]}" \
     "SERVER ${with[NM_WITH_SERVER]} OPENCL ${with[NM_WITH_OPENCL]}"

lib=$build/libnanomind.so
# 1. the libraries it names (DT_NEEDED): each one a built part brings
allowed='libc|libm|ld-linux-x86-64|ld-linux-aarch64|libpthread|libdl|libgcc_s|libasan|libubsan|libtsan|libpcre2-8|libcjson'
[ "${with[NM_WITH_VISION]}" = 1 ] && allowed+='|libpng16|libjpeg'
[ "$audio" = 1 ] && allowed+='|libsndfile|libsoxr|libasound'
[ "${with[NM_WITH_STT]}" = 1 ] && allowed+='|libkissfft-float'
[ "${with[NM_WITH_TTS]}" = 1 ] && allowed+='|libespeak-ng'
[ "${with[NM_WITH_SERVER]}" = 1 ] && allowed+='|libcivetweb'
if needed=$(readelf -d "$lib" 2>&1); then
    needed=$(sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' <<< "$needed")
    stray=$(grep -vE "^($allowed)\.so" <<< "$needed")
    if [ -z "$stray" ]; then ok "needs_only_its_parts ($(wc -l <<< "$needed") libraries: $(echo $needed))"
    else bad needs_only_its_parts "needs what no part of this build brings: $(echo $stray)"; fi
else
    bad needs_only_its_parts "readelf -d $lib: $needed"
fi

# 2. what it loads, all the way down (ldd): no GPL without NM_WITH_TTS, FFTW never
if tree=$(ldd "$lib" 2>&1); then
    n=$(grep -c '=>' <<< "$tree")
    forbidden='libfftw3'
    [ "${with[NM_WITH_TTS]}" = 1 ] || forbidden+='|libespeak|libpcaudio|libsonic|libpulse|libX11|libxcb|libsystemd|libdbus'
    [ "$audio" = 1 ] || forbidden+='|libsndfile|libsoxr|libasound|libFLAC|libvorbis|libopus|libmpg123|libmp3lame'
    [ "${with[NM_WITH_VISION]}" = 1 ] || forbidden+='|libpng|libjpeg'
    [ "${with[NM_WITH_SERVER]}" = 1 ] || forbidden+='|libcivetweb'
    found=$(grep -oE "($forbidden)[^ ]*" <<< "$tree" | sort -u)
    if [ -z "$found" ]; then ok "loads_no_left_out_library ($n libraries in its ldd tree)"
    else bad loads_no_left_out_library "loads: $(echo $found)"; fi
else
    bad loads_no_left_out_library "ldd $lib: $tree"
fi

# 3. the same exports in every build: each call of the header, nothing else
nm -D --defined-only "$lib" | awk '{print $3}' | grep -v '^_' | sort > "$tmp/exported"
cat "$root/include/nanomind.h" "$root"/include/nanomind/*.h | grep -oE '\bnm_[a-z0-9_]+\(' | tr -d '(' | sort -u > "$tmp/declared"
extra=$(comm -23 "$tmp/exported" "$tmp/declared")
missing=$(comm -13 "$tmp/exported" "$tmp/declared")
if [ -z "$extra" ] && [ -z "$missing" ]; then ok "exports_the_header ($(wc -l < "$tmp/exported") calls)"
else bad exports_the_header "exported, not declared: $(echo $extra)
declared, not exported: $(echo $missing)"; fi

# 4. a part left out: the command says which option brings it (exit 1 or 2, never a crash)
# refused NAME OPTION -- ARGS...
refused() {
    local name=$1 option=$2
    shift 3
    out=$(timeout 20 "$NM" "$@" 2>&1)
    local rc=$?
    if { [ $rc = 1 ] || [ $rc = 2 ]; } && grep -q -- "-D$option=ON" <<< "$out"; then ok "$name"
    else bad "$name" "exit $rc, wanted 1 or 2 and a message naming -D$option=ON:
$out"; fi
}
M=$models/SmolLM2-135M-Instruct.Q4_1.gguf
[ "${with[NM_WITH_STT]}" = 1 ] || refused transcribe_names_option NM_WITH_STT -- transcribe -m x.gguf a.wav
[ "${with[NM_WITH_TTS]}" = 1 ] || refused say_names_option NM_WITH_TTS -- say hello
[ "${with[NM_WITH_SERVER]}" = 1 ] || refused serve_names_option NM_WITH_SERVER -- serve -m "$M"
[ "${with[NM_WITH_VISION]}" = 1 ] || refused mmproj_names_option NM_WITH_VISION -- run -m "$M" --mmproj x.gguf -p hi
if [ "${with[NM_WITH_OPENCL]}" = 0 ]; then
    if [ -f "$M" ]; then refused opencl_names_option NM_WITH_OPENCL -- run -m "$M" -dev opencl -p hi -n 1
    else skipped opencl_names_option "no $M"; fi
fi

# 5. a language model alone
if [ -f "$M" ]; then
    out=$(timeout 120 "$NM" run -m "$M" -p "The capital of France is" -n 8 --seed 1 2> "$tmp/err")
    rc=$?
    if [ $rc = 0 ] && [ -n "${out// /}" ]; then ok "llm_run ('$(tr '\n' ' ' <<< "$out" | cut -c1-60)')"
    else bad llm_run "exit $rc, output '$out': $(tail -5 "$tmp/err")"; fi
else
    skipped llm_run "no $M"
fi

echo "$pass passed, $fail failed, $skip skipped"
[ $fail = 0 ]
