// Models that load but cannot be right are refused by name (issue 12): values
// no model can have, a block_count that disagrees with the tensors, special
// token ids outside the vocabulary, head counts that do not divide the width,
// tensors whose bytes overlap. Each file is a small random llama with
// SmolLM2's tokenizer (nm_genmodel_write) with one thing wrong.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "genmodel.h"
#include "gguf/gguf.h"
#include "nanomind.h"
#include "nmtest.h"

static gen_opts base(const char *tok, const char *out) {
    gen_opts o = nm_genmodel_defaults();
    o.arch = "llama";
    o.tok_from = tok;
    o.out = out;
    o.layers = 2;
    o.embd = 64;
    o.heads = 4;
    o.kv_heads = 2;
    o.ff = 128;
    return o;
}

// Loads o's file and checks the load fails with a message holding want.
static void refused(gen_opts *o, const char *want, int *nmtest_failed) {
    char err[512] = "";
    NM_CHECK(nm_genmodel_write(o) == 0);
    nm_model *m = NULL;
    nm_status st = nm_model_load(o->out, NULL, &m, err, sizeof err);
    fprintf(stderr, "  %s: %s\n", want, st == NM_OK ? "LOADED" : err);
    NM_CHECK(st == NM_ERR_FORMAT && strstr(err, want) != NULL);
    nm_model_free(m);
    unlink(o->out);
}

#define NEED_TOK(tok)                                                                            \
    char tok[1024], out[128];                                                                    \
    if (!nmtest_model_path("SmolLM2-135M-Instruct.Q4_1.gguf", tok, sizeof tok))                 \
        NM_SKIP_MISSING("SmolLM2-135M-Instruct.Q4_1.gguf (its tokenizer) is not in the cache");  \
    snprintf(out, sizeof out, "/tmp/nm-test-model-checks-%d.gguf", (int)getpid())

NM_TEST(good_model_loads) {
    NEED_TOK(tok);
    gen_opts o = base(tok, out);
    NM_CHECK(nm_genmodel_write(&o) == 0);
    nm_model *m = NULL;
    NM_CHECK(nm_model_load(out, NULL, &m, NULL, 0) == NM_OK);
    nm_model_free(m);
    unlink(out);
}

NM_TEST(rope_freq_base_not_positive) {
    NEED_TOK(tok);
    gen_opts o = base(tok, out);
    o.bad_rope_base = -10000.0f;
    refused(&o, "llama.rope.freq_base -10000 must be a positive number", nmtest_failed);
}

// qwen2vl's M-RoPE sections: absent, or more pairs than a head has (a head of 16 rotates 8: 2 + 3 + 3 + 1)
NM_TEST(mrope_sections_missing_or_past_the_head) {
    NEED_TOK(tok);
    gen_opts o = base(tok, out);
    o.arch = "qwen2vl";
    o.bad_mrope = 1;
    refused(&o, "missing metadata key 'qwen2vl.rope.dimension_sections' (M-RoPE's sections)", nmtest_failed);
    o.bad_mrope = 2;
    refused(&o, "qwen2vl.rope.dimension_sections' sums to 9 pairs; a head rotates 8", nmtest_failed);
}

NM_TEST(norm_epsilon_not_positive) {
    NEED_TOK(tok);
    gen_opts o = base(tok, out);
    o.bad_norm_eps = -1e-6f;
    refused(&o, "llama.attention.layer_norm_rms_epsilon -1e-06 must be a positive number", nmtest_failed);
}

NM_TEST(block_count_smaller_than_the_blocks) {
    NEED_TOK(tok);
    gen_opts o = base(tok, out);
    o.bad_block_count = 1;
    refused(&o, "tensor 'blk.1.attn_norm.weight' belongs to block 1, but llama.block_count is 1", nmtest_failed);
}

NM_TEST(block_count_larger_than_the_blocks) {
    NEED_TOK(tok);
    gen_opts o = base(tok, out);
    o.bad_block_count = 3;
    refused(&o, "missing tensor 'blk.2.attn_norm.weight'", nmtest_failed);
}

NM_TEST(bos_outside_the_vocabulary) {
    NEED_TOK(tok);
    gen_opts o = base(tok, out);
    o.bad_bos_id = 49152; // SmolLM2 has 49152 tokens
    refused(&o, "tokenizer.ggml.bos_token_id = 49152 is outside the vocabulary (49152 tokens)", nmtest_failed);
}

NM_TEST(heads_do_not_divide_the_width) {
    NEED_TOK(tok);
    gen_opts o = base(tok, out);
    o.bad_heads = 6; // 64 / 6; a multiple of the 2 KV heads
    refused(&o, "llama.attention.head_count 6 does not divide llama.embedding_length 64", nmtest_failed);
}

// A tensor with a dimension too many: the message gives its whole shape.
NM_TEST(tensor_with_a_third_dimension) {
    NEED_TOK(tok);
    gen_opts o = base(tok, out);
    o.bad_3d = "blk.0.attn_q.weight";
    refused(&o, "tensor 'blk.0.attn_q.weight' has shape [64, 64, 1], expected [64, 64]", nmtest_failed);
}

// A tensor whose offset is moved onto its neighbour's bytes (as a changed type
// or shape would make it run into them): the reader refuses the file. Both
// ways: b inside a, and b starting in a's last bytes and running past its end.
static void overlap_case(const char *tok, const char *out, int inside, int *nmtest_failed) {
    gen_opts o = base(tok, out);
    NM_CHECK(nm_genmodel_write(&o) == 0);
    nm_gguf *g = NULL;
    NM_CHECK(nm_gguf_open(out, &g, NULL, 0) == NM_OK);
    if (!g) return;
    const nm_gguf_tensor *a = nm_gguf_find_tensor(g, "blk.0.attn_q.weight"), *b = nm_gguf_find_tensor(g, "blk.0.attn_k.weight");
    NM_CHECK(a && b);
    FILE *f = fopen(out, "r+b");
    NM_CHECK(f != NULL);
    long pos = -1;
    if (f && a && b) {
        // The tensor info of b: its name, n_dims, ne[], type, then the 8-byte offset.
        const size_t hdr = (size_t)nm_gguf_data_offset(g); // the metadata and tensor infos
        uint8_t *buf = malloc(hdr);
        size_t n = buf ? fread(buf, 1, hdr, f) : 0;
        for (size_t i = 8; i + b->name.len < n; i++) {
            uint64_t len;
            memcpy(&len, buf + i - 8, 8);
            if (len == b->name.len && !memcmp(buf + i, b->name.ptr, b->name.len)) {
                pos = (long)(i + b->name.len + 4 + 8 * 2 + 4); // n_dims 2: two ne, then the type
                break;
            }
        }
        free(buf);
        NM_CHECK(pos > 0);
        const uint64_t off = inside ? a->offset + 64 : a->offset + a->nbytes - 64;
        NM_CHECK(pos > 0 && fseek(f, pos, SEEK_SET) == 0 && fwrite(&off, 8, 1, f) == 1);
    }
    if (f) fclose(f);
    nm_gguf_close(g);
    char err[512] = "";
    nm_gguf *h = NULL;
    nm_status st = nm_gguf_open(out, &h, err, sizeof err);
    fprintf(stderr, "  overlap (%s): %s\n", inside ? "inside" : "across the end", st == NM_OK ? "OPENED" : err);
    NM_CHECK(st == NM_ERR_FORMAT && strstr(err, "overlaps tensor") != NULL);
    nm_gguf_close(h);
    unlink(out);
}

NM_TEST(overlapping_tensors) {
    NEED_TOK(tok);
    overlap_case(tok, out, 1, nmtest_failed);
    overlap_case(tok, out, 0, nmtest_failed);
}

NM_TEST_MAIN()
