#!/usr/bin/env bash
# Decode and prefill on an OpenCL device with random-weight models of known
# shapes (the speed depends on the shapes and types, not on the values):
#   bench/opencl_models.sh NANOMIND_BIN_DIR TOKENIZER.gguf DEVICE [MODELS...]
# MODELS: smol (SmolLM2-135M's shape, q4_1), llama1b (16 x 2048, ff 8192, q4_0),
# llama8b (Llama-3-8B's 32 x 4096, ff 14336, GQA 32/8, q4_0), llama8b8 (its
# first 8 layers: the same matrices, a quarter of the bytes), gemma (Gemma 3
# 270M's shape, q5_0 throughout: needs GEMMA_TOK=a GGUF with Gemma's tokenizer,
# the vocabulary of 262144 is part of the shape); default: smol llama1b llama8b8.
# TOKENIZER: any GGUF whose tokenizer the models copy (a small one
# made with nm-genmodel from SmolLM2 keeps the vocabulary at 49152). Prints
# `nanomind bench` (pp512/tg128; llama8b pp256/tg32) for each, with the
# device's roofline (its measured read bandwidth / bytes per token).
set -euo pipefail
bin=$1 tok=$2 dev=$3
shift 3
models=("$@")
[ ${#models[@]} -gt 0 ] || models=(smol llama1b llama8b8)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
for m in "${models[@]}"; do
    case $m in
        smol) args=(--arch llama --layers 30 --embd 576 --heads 9 --kv-heads 3 --ff 1536 --type q4_1) ;;
        llama1b) args=(--arch llama --layers 16 --embd 2048 --heads 32 --kv-heads 8 --ff 8192 --type q4_0) ;;
        llama8b) args=(--arch llama --layers 32 --embd 4096 --heads 32 --kv-heads 8 --ff 14336 --type q4_0) ;;
        llama8b8) args=(--arch llama --layers 8 --embd 4096 --heads 32 --kv-heads 8 --ff 14336 --type q4_0) ;;
        gemma) args=(--arch gemma3 --layers 18 --embd 640 --heads 4 --kv-heads 1 --ff 2048 --head-dim 256 --swa 512
                     --type q5_0) ;;
        *) echo "opencl_models.sh: unknown model '$m' (smol, llama1b, llama8b, llama8b8, gemma)" >&2; exit 2 ;;
    esac
    t=$tok
    [ "$m" = gemma ] && t=${GEMMA_TOK:?gemma needs GEMMA_TOK (a GGUF with Gemma 3 tokenizer)}
    "$bin/nm-genmodel" --tokenizer-from "$t" -o "$dir/$m.gguf" "${args[@]}" > /dev/null
    pp=512 tg=128
    [ "$m" = llama8b ] && pp=256 tg=32
    echo "== $m (${args[*]})"
    "$bin/nanomind" bench -m "$dir/$m.gguf" -p $pp -n $tg -r 3 --device "$dev"
    rm -f "$dir/$m.gguf"
done
