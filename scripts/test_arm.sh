#!/usr/bin/env bash
# The quant kernels on aarch64: cross-builds src/quant, src/core and the quant
# unit tests (NM_QUANT_ONLY, static executables) with aarch64-linux-gnu-gcc and
# runs each test under qemu-aarch64-static twice: -cpu max (NEON + dotprod:
# the SDOT dots) and -cpu cortex-a53 (NEON only: the vmull_s8 dots). Checks
# correctness only; qemu timings mean nothing.
#
# Installs the cross compiler and qemu when missing (apt-get as root, else
# prints the command). Ends with one "N passed, N failed, N skipped" line summing the
# tests' own counts; a test binary that dies without its summary counts as one
# failure. Exit status 0 only when nothing failed.
#   BUILD_ARM=dir  build directory (default build-arm)   JOBS=n  build jobs
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_ARM=${BUILD_ARM:-build-arm}
JOBS=${JOBS:-$(nproc)}
CPUS=(max cortex-a53)
PKGS=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user-static cmake)

missing=()
for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "test_arm: missing packages: ${missing[*]}" >&2
        echo "test_arm: run:  sudo apt-get update && sudo apt-get install -y ${missing[*]}" >&2
        exit 1
    fi
    echo "test_arm: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${missing[@]}" > /dev/null
fi

cmake -S . -B "$BUILD_ARM" -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake -DNM_QUANT_ONLY=ON \
    -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build "$BUILD_ARM" -j"$JOBS"

tests=()
for src in tests/unit/test_quant*.c; do tests+=("$(basename "$src" .c)"); done

passed=0 failed=0 skipped=0
for cpu in "${CPUS[@]}"; do
    for t in "${tests[@]}"; do
        log=$(mktemp)
        rc=0
        qemu-aarch64-static -cpu "$cpu" "$BUILD_ARM/$t" > "$log" 2>&1 || rc=$?
        kernels=$(sed -n 's/^  kernels: //p' "$log" | head -1)
        summary=$(grep -E '^[0-9]+ passed, [0-9]+ failed(, [0-9]+ skipped)?$' "$log" | tail -1 || true)
        if [ -n "$summary" ]; then
            read -r p f s <<< "$(sed -E 's/^([0-9]+) passed, ([0-9]+) failed(, ([0-9]+) skipped)?$/\1 \2 \4/' <<< "$summary")"
            passed=$((passed + p))
            failed=$((failed + f))
            skipped=$((skipped + ${s:-0}))
            [ "$rc" -ne 0 ] && [ "$f" -eq 0 ] && failed=$((failed + 1)) # exit status says more than the count
        else
            failed=$((failed + 1))
            summary="no summary (exit $rc)"
        fi
        printf 'test_arm: %-11s %-16s %s%s\n' "$cpu" "$t" "$summary" "${kernels:+  [kernels: $kernels]}"
        if [ "$rc" -ne 0 ] || [ -z "$summary" ] || ! grep -qE ' 0 failed(, [0-9]+ skipped)?$' <<< "$summary"; then
            sed 's/^/    /' "$log" | grep -vE '^    ok ' | tail -40
        fi
        rm -f "$log"
    done
done

echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
