#!/usr/bin/env bash
# Adds up the cases of a ctest run: every test program prints
# "N passed, N failed[, N skipped]" as its last line; this reads them from
# ctest's log and prints one line for the whole suite, the last line of
# `make test`. A program that printed no such line (it crashed, or timed out)
# counts as one failed case. Exits non-zero if anything failed.
#   tests/summary.sh BUILD_DIR
set -euo pipefail
log=${1:?usage: tests/summary.sh BUILD_DIR}/Testing/Temporary/LastTest.log
[ -f "$log" ] || { echo "summary: no ctest log at $log" >&2; exit 1; }
awk '
/^[0-9]+\/[0-9]+ Testing: / { name = $3; line = ""; next }
/^[0-9]+ passed, [0-9]+ failed(, [0-9]+ skipped)?$/ { line = $0; next }
/^Test Passed\./ || /^Test Failed\./ || /^Test Skipped/ {
    n_prog++
    if (line != "") {
        split(line, w, /[ ,]+/)
        p += w[1]; f += w[3]; s += (w[5] == "" ? 0 : w[5])
    } else if ($0 ~ /^Test Skipped/) {
        s++
    } else {
        f++; printf "summary: %s printed no summary line (counted as one failed case)\n", name
    }
    if ($0 ~ /^Test Failed/ && line != "" && w[3] == 0) {
        f++; printf "summary: %s exited non-zero after \"%s\" (counted as one failed case)\n", name, line
    }
    line = ""
}
END {
    printf "%d test programs: %d passed, %d failed, %d skipped\n", n_prog, p, f, s
    exit f > 0
}' "$log"
