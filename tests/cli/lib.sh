# Helpers of the CLI suites (test_cli.sh, test_bad_input.sh), sourced after
# NM (the nanomind binary) is set: nm runs it, expect judges one case, setup
# prepares one. Every case checks both the exit status of each nanomind run it
# makes (run through nm, never through a pipeline's last command) and its
# output. A nanomind killed by a signal, or one that never ran, fails the case.
# A case that needs a model absent from $NM_MODEL_DIR is a skip, or a failure
# when NM_CI is set (to anything but 0): set-up should have fetched it.
MODELS=${NM_MODEL_DIR:-$HOME/.cache/nanomind/models}
M=$MODELS/SmolLM2-135M-Instruct.Q4_1.gguf
WM=$MODELS/whisper-tiny.en.gguf
PV=$MODELS/piper-en_US-joe-medium.gguf
pass=0 fail=0 skip=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ci=0
[ -n "${NM_CI:-}" ] && [ "$NM_CI" != 0 ] && ci=1

# nm ARGS...: runs nanomind ($NM_TIMEOUT s at most, default 300) and appends
# its exit status to $tmp/rc, so that expect sees it wherever the run sits in a case.
NM_TIMEOUT=${NM_TIMEOUT:-300}
nm() {
    timeout "$NM_TIMEOUT" "$NM" "$@"
    local rc=$?
    echo "$rc" >> "$tmp/rc"
    return "$rc"
}

# expect NAME RC REGEX [NEEDED_FILE...] -- CMD...
# CMD (nm ARGS, or a case function that calls nm) must run nanomind at least
# once; every run must exit with RC, and the output (stdout+stderr) must match
# REGEX. A missing NEEDED_FILE makes the case a skip (a failure under NM_CI).
expect() {
    local name=$1 want_rc=$2 re=$3 f
    shift 3
    # NM_CLI_FILTER (an extended regex): only the cases it names run (the mutation harness's mutants)
    if [ -n "${NM_CLI_FILTER:-}" ] && ! [[ "$name" =~ ^($NM_CLI_FILTER)$ ]]; then return; fi
    local needs=()
    while [ "$#" -gt 0 ] && [ "$1" != -- ]; do needs+=("$1"); shift; done
    shift
    for f in "${needs[@]}"; do
        if [ ! -f "$f" ]; then
            if [ "$ci" = 1 ]; then
                fail=$((fail + 1)); echo "FAIL $name (needs $f, which is missing, and NM_CI=$NM_CI)"
            else
                skip=$((skip + 1)); echo "skip $name (needs $f, which is missing)"
            fi
            return
        fi
    done
    : > "$tmp/rc"
    local out rc why="" rcs=() t0=$EPOCHREALTIME took=""
    out=$("$@" 2>&1 < /dev/null)
    # NM_TEST_TIMES=1: each case's wall time (to see where the minutes go; never judged)
    [ "${NM_TEST_TIMES:-}" = 1 ] && took=" ($(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }') s)"
    mapfile -t rcs < "$tmp/rc"
    if [ "${#rcs[@]}" = 0 ]; then
        why="nanomind did not run"
    fi
    for rc in "${rcs[@]}"; do
        if [ "$rc" -gt 128 ]; then
            why="nanomind killed by signal $((rc - 128)) (SIG$(kill -l $((rc - 128)) 2>/dev/null)), exit $rc"
            break
        elif [ "$rc" = 124 ]; then
            why="nanomind timed out ($NM_TIMEOUT s)"
        elif [ "$rc" != "$want_rc" ] && [ -z "$why" ]; then
            why="nanomind exited $rc, want $want_rc"
        fi
    done
    if [ -z "$why" ] && ! grep -Eq -- "$re" <<< "$out"; then
        why="output does not match /$re/"
    fi
    if [ -z "$why" ]; then
        pass=$((pass + 1)); echo "ok   $name$took"
    else
        [ "${#rcs[@]}" -gt 1 ] && why="$why; exits: ${rcs[*]}"
        fail=$((fail + 1)); echo "FAIL $name ($why)"; echo "$out" | head -5 | sed 's/^/     /'
    fi
}

# setup WHAT OUT CMD...: a preparation step, its stdout to OUT; if it fails,
# that is one failed case
setup() {
    local what=$1 to=$2
    shift 2
    if ! "$@" > "$to" 2> "$tmp/setup.err"; then
        fail=$((fail + 1)); echo "FAIL setup: $what"; head -5 "$tmp/setup.err" | sed 's/^/     /'
    fi
}

