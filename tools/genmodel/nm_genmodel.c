// nm-genmodel: writes a small random-weight GGUF language model of a given
// architecture (llama, qwen2, qwen2vl, qwen3, smollm3, gemma3, lfm2) in llama.cpp's tensor names and keys,
// with the tokenizer copied from an existing GGUF file. Used to compare our
// forward pass with llama.cpp's on architectures whose real weights we cannot
// reach (docs/correctness.md), and by tests.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "genmodel.h"
#include "quant/quant.h"

static int usage(void) {
    fprintf(stderr,
            "usage: nm-genmodel --arch llama|qwen2|qwen2vl|qwen3|smollm3|gemma3|lfm2 --tokenizer-from MODEL.gguf\n"
            "                   -o OUT.gguf\n"
            "                   [--type f32|f16|q8_0|q4_0|q4_K|...] [--seed S] [--layers N] [--embd D]\n"
            "                   [--heads H] [--kv-heads K] [--ff F] [--head-dim HD] [--swa W]\n"
            "                   [--final-softcap C] [--vocab N] [--user-tokens A,B] [--script TEXT]\n"
            "                   [--attn-layers I,J,..] [--conv-l L]\n"
            "  --attn-layers: lfm2's attending layers (the others short convolutions; default every third)\n"
            "  --conv-l L: lfm2's convolution taps (default 3)\n"
            "  --vocab N: the tokenizer's tokens padded with control tokens to N (a real model's output head)\n"
            "  --user-tokens A,B: user-defined tokens added to the vocabulary (e.g. <think>,</think>)\n"
            "  --script TEXT: f32 weights whose greedy answer after a prompt ending in a newline is TEXT\n"
            "                 (each token of it followed by one token only)\n");
    return 2;
}

int main(int argc, char **argv) {
    gen_opts o = nm_genmodel_defaults();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) return usage();
        i++;
        if (!strcmp(a, "--arch")) o.arch = v;
        else if (!strcmp(a, "--tokenizer-from")) o.tok_from = v;
        else if (!strcmp(a, "-o")) o.out = v;
        else if (!strcmp(a, "--seed")) o.seed = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--layers")) o.layers = atoi(v);
        else if (!strcmp(a, "--embd")) o.embd = atoi(v);
        else if (!strcmp(a, "--heads")) o.heads = atoi(v);
        else if (!strcmp(a, "--kv-heads")) o.kv_heads = atoi(v);
        else if (!strcmp(a, "--ff")) o.ff = atoi(v);
        else if (!strcmp(a, "--head-dim")) o.head_dim = atoi(v);
        else if (!strcmp(a, "--swa")) o.swa = atoi(v);
        else if (!strcmp(a, "--final-softcap")) o.final_softcap = strtof(v, NULL);
        else if (!strcmp(a, "--vocab")) o.vocab = strtoll(v, NULL, 10);
        else if (!strcmp(a, "--user-tokens")) o.user_tokens = v;
        else if (!strcmp(a, "--script")) o.script = v;
        else if (!strcmp(a, "--attn-layers")) o.attn_layers = v;
        else if (!strcmp(a, "--conv-l")) o.conv_l = atoi(v);
        else if (!strcmp(a, "--type")) {
            uint32_t t;
            for (t = 0; t < NM_TYPE_COUNT; t++) {
                const nm_type_traits *tr = nm_type_traits_get(t);
                if (tr && tr->supported && !strcmp(tr->name, v)) break;
            }
            if (t == NM_TYPE_COUNT) {
                fprintf(stderr, "nm-genmodel: unknown type '%s'\n", v);
                return 2;
            }
            o.type = t;
        } else return usage();
    }
    if (!o.arch || !o.tok_from || !o.out) return usage();
    const int rc = nm_genmodel_write(&o); // (2: options it refuses, 1: a failure)
    if (!rc) printf("nm-genmodel: wrote %s (%s, %d layers, d %d, %s)\n", o.out, o.arch, o.layers, o.embd,
                    nm_type_traits_get(o.type)->name);
    return rc;
}
