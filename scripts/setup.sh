#!/usr/bin/env bash
# Installs the system packages nanomind needs to build and test. Idempotent:
# only missing packages are installed. As root it runs apt-get; otherwise it
# prints the exact command to run. (clang, for the libFuzzer build, is optional:
# apt-get install clang, then cmake -DNM_FUZZ=ON with CC=clang.)
set -euo pipefail

PKGS=(build-essential cmake pkg-config libpcre2-dev libpng-dev libjpeg62-turbo-dev libsndfile1-dev libsoxr-dev libkissfft-dev libasound2-dev python3 python3-pip time spin)
# Text-to-speech brick (src/bricks/tts): espeak-ng and its voice data.
PKGS+=(libespeak-ng-dev espeak-ng-data)
# Speech tests (tests/unit/test_transcribe.c): the espeak-ng command speaks the round-trip sentences.
PKGS+=(espeak-ng)
# OpenCL (src/backend/opencl, loaded at run time): the ICD loader and PoCL, an OpenCL device on the CPU,
# for the OpenCL tests; clinfo to look at the platforms.
PKGS+=(ocl-icd-libopencl1 pocl-opencl-icd clinfo)
# JSON (unit profiles, src/sched/profile.c; the server).
PKGS+=(libcjson-dev)
# HTTP for `nanomind serve` (tools/cli/cmd_serve.c).
PKGS+=(libcivetweb-dev)

missing=()
for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# python3/pip may come from elsewhere (pyenv): accept a working one.
if command -v python3 >/dev/null && python3 -m pip --version >/dev/null 2>&1; then
    missing=("${missing[@]/python3-pip}")
    missing=("${missing[@]/python3}")
fi
missing=($(printf '%s\n' "${missing[@]}" | grep -v '^$' || true))

install_pkgs() {
    if [ "$(id -u)" -ne 0 ]; then
        echo "setup: missing packages: ${missing[*]}" >&2
        echo "setup: run:  sudo apt-get update && sudo apt-get install -y ${missing[*]}" >&2
        exit 1
    fi
    echo "setup: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get update -qq; then
        echo "setup: apt-get update failed: is the Debian package mirror reachable?" >&2
        exit 1
    fi
    apt-get install -y -qq "${missing[@]}"
}

if [ ${#missing[@]} -eq 0 ]; then
    echo "setup: system packages present"
else
    install_pkgs
fi

# numpy, for the reference implementations the tests compare against
# (tools only, never the runtime). Installed for whichever python3 is first
# on PATH, from PyPI.
if ! python3 -c 'import numpy' 2>/dev/null; then
    echo "setup: installing numpy for $(command -v python3)"
    if ! python3 -m pip install -q numpy; then
        echo "setup: pip install numpy failed: is PyPI reachable?" >&2
        exit 1
    fi
fi

# Jinja2, the oracle of the chat-template interpreter's tests (tools/jinja_expect.py, ctest jinja_expect).
if ! python3 -c 'import jinja2' 2>/dev/null; then
    echo "setup: installing jinja2 for $(command -v python3)"
    if ! python3 -m pip install -q 'jinja2>=3.1'; then
        echo "setup: pip install jinja2 failed: is PyPI reachable?" >&2
        exit 1
    fi
fi

# onnx, onnxruntime and piper-tts, the oracles of the Piper converter's, voice's and phonemes' tests
# (tests/tools/test_convert_piper.py, test_piper_ort.py, test_piper_phonemes.py): test-only, never
# part of the runtime.
for pkg in onnx:onnx onnxruntime:onnxruntime piper:piper-tts; do
    if ! python3 -c "import ${pkg%%:*}" 2>/dev/null; then
        echo "setup: installing ${pkg#*:} for $(command -v python3)"
        if ! python3 -m pip install -q "${pkg#*:}"; then
            echo "setup: pip install ${pkg#*:} failed: is PyPI reachable?" >&2
            exit 1
        fi
    fi
done

# The official OpenAI client, which the server's tests (tests/server) use against `nanomind serve`.
if ! python3 -c 'import openai' 2>/dev/null; then
    echo "setup: installing openai (the client) for $(command -v python3)"
    if ! python3 -m pip install -q openai; then
        echo "setup: pip install openai failed: is PyPI reachable?" >&2
        exit 1
    fi
fi
