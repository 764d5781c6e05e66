#!/usr/bin/env bash
# Runs a test program with one x86 kernel variant forced (issue 13: every
# variant against the same golden transcripts and perplexities):
#   run_variant.sh avx2|avx2vnni PROGRAM [ARGS...]
# avx2: NM_NO_AVX512=1 NM_NO_VNNI=1 (the AVX2 + FMA + F16C kernels);
# avx2vnni: NM_NO_AVX512=1 (AVX2 with the AVX-VNNI dots). The default run of
# each program is the best variant the CPU has (AVX-512 where it has the set).
# A CPU without the variant's instructions: exit 77, which ctest counts as
# skipped (SKIP_RETURN_CODE), with the reason; so does a CPU whose default run
# already is the variant (no AVX-512F, and AVX-VNNI exactly when the variant
# has it: the program's own ctest entry runs those kernels, the same bits).
set -u
variant=$1; shift
flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null)
has() { for f in "$@"; do [[ " $flags " == *" $f "* ]] || return 1; done; }
case $variant in
    avx2) need=(avx2 fma f16c); export NM_NO_AVX512=1 NM_NO_VNNI=1 ;;
    avx2vnni) need=(avx2 fma f16c avx_vnni); export NM_NO_AVX512=1 ;;
    *) echo "run_variant.sh: unknown variant '$variant' (avx2, avx2vnni)" >&2; exit 2 ;;
esac
if ! has "${need[@]}"; then
    echo "skip: this CPU lacks ${need[*]} (the $variant variant)"
    echo "0 passed, 0 failed, 1 skipped"
    exit 77
fi
if ! has avx512f && { [ "$variant" = avx2vnni ] || ! has avx_vnni; }; then
    echo "skip: this CPU's default kernels are the $variant variant (no AVX-512F): the default run covers it"
    echo "0 passed, 0 failed, 1 skipped"
    exit 77
fi
echo "variant $variant: NM_NO_AVX512=${NM_NO_AVX512:-} NM_NO_VNNI=${NM_NO_VNNI:-}"
exec "$@"
