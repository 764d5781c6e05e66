// gemmq: many weight rows x many quantized activation rows (the prefill
// matmul), checked against the ref (the plain loop over dotq_ref) for odd
// shapes, every tile edge up to 9 x 9, extreme quants, unaligned strides and
// ldy > n_rows, in every SIMD table of this CPU. NM_TEST_BENCH=1 adds a speed
// line per type: gemmq against the per-pair dotq loop of the same table.
#include <stddef.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>
#include <stdint.h>
#include <time.h>

#include "core/cpu.h"
#include "nmtest.h"
#include "quant/kernels_impl.h"
#include "quant_testutil.h"



static const char *tname(uint32_t t) { return nm_type_traits_get(t)->name; }

#define MAX_ROWS 17
#define MAX_TOK 64
#define MAX_K 4608 // 18 K-quant super-blocks: past their tiles' K chunk of 8
// Paddings: rows start off the SIMD (16/32-byte) alignment, and the pad bytes
// are garbage a kernel must not read as data. They stay multiples of 4: rows in
// a GGUF file always keep their element alignment (f32 rows 4 bytes, blocks
// with an fp16 scale 2), and the C kernels rely on it.
#define W_PAD 12
#define X_PAD 4
#define Y_PAD 3

// One test problem: n_rows weight rows and n_tok activation rows of K
// elements, quantized, plus their dequantized values for the tolerance.
typedef struct {
    uint32_t t, at;
    int64_t n_rows, n_tok, K;
    size_t w_stride, x_stride;
    uint8_t *wq, *xq;
    float *wd, *xd; // (n_rows, K), (n_tok, K)
} problem;

static uint8_t wq_buf[MAX_ROWS * (MAX_K * 4 + W_PAD)], xq_buf[MAX_TOK * (MAX_K * 4 + X_PAD)];
static float wd_buf[MAX_ROWS * MAX_K], xd_buf[MAX_TOK * MAX_K], tmp[MAX_K];

static problem make_problem(uint32_t t, int64_t n_rows, int64_t n_tok, int64_t K) {
    if (K > MAX_K || n_rows > MAX_ROWS || n_tok > MAX_TOK) { // the buffers are sized by these
        fprintf(stderr, "make_problem: %lld x %lld, K=%lld is past the test's buffers\n", (long long)n_rows,
                (long long)n_tok, (long long)K);
        abort();
    }
    problem p = {t, nm_vec_dot_type(t), n_rows, n_tok, K, 0, 0, wq_buf, xq_buf, wd_buf, xd_buf};
    p.w_stride = nm_row_size(t, K) + W_PAD;
    p.x_stride = nm_row_size(p.at, K) + X_PAD;
    memset(wq_buf, 0xa5, sizeof wq_buf);
    memset(xq_buf, 0x5a, sizeof xq_buf);
    const int minfmt = t == NM_TYPE_Q4_1 || t == NM_TYPE_Q5_1 || t == NM_TYPE_Q2_K || t == NM_TYPE_Q4_K ||
                       t == NM_TYPE_Q5_K;
    for (int64_t r = 0; r < n_rows; r++) {
        for (int64_t j = 0; j < K; j++) tmp[j] = grand() * 0.5f + (minfmt ? 0.3f : 0.f);
        nm_quantize_row_ref(t, tmp, p.wq + r * p.w_stride, K);
        nm_dequantize_row_ref(t, p.wq + r * p.w_stride, p.wd + r * K, K);
    }
    for (int64_t i = 0; i < n_tok; i++) {
        for (int64_t j = 0; j < K; j++) tmp[j] = grand() * ((j % 97) ? 1.f : 8.f); // an outlier channel
        if (i == 1 && K >= 64) memset(tmp + 32, 0, 32 * sizeof(float));            // a zero block
        nm_kernels_ref()->quant_act[p.at](tmp, p.xq + i * p.x_stride, K);
        nm_dequantize_row_ref(p.at, p.xq + i * p.x_stride, p.xd + i * K, K);
    }
    return p;
}

// Tolerance of pair (r, i): 1e-5 of sum |w x|, plus the fp16 rounding of the
// q8_1 sum field for the min formats (scaled as in test_quant_act.c).
static double pair_tol(const problem *p, int64_t r, int64_t i) {
    double s = 0;
    for (int64_t j = 0; j < p->K; j++) s += fabs((double)p->wd[r * p->K + j] * p->xd[i * p->K + j]);
    if (p->t == NM_TYPE_Q4_1 || p->t == NM_TYPE_Q5_1) {
        for (int64_t b = 0; b < p->K / NM_QK; b++) {
            const uint8_t *wb = p->wq + r * p->w_stride, *xb = p->xq + i * p->x_stride;
            uint16_t m, sx;
            memcpy(&m, wb + (size_t)b * nm_row_size(p->t, NM_QK) + 2, 2); // d, m first in q4_1 and q5_1
            memcpy(&sx, xb + (size_t)b * sizeof(nm_block_q8_1) + 2, 2);
            s += fabs((double)nm_fp16_to_fp32(m) * nm_fp16_to_fp32(sx));
        }
    }
    return 1e-5 * s;
}

static const float SENTINEL = -12345.678f;
static float y_ref[MAX_TOK * (MAX_ROWS + Y_PAD)], y_got[MAX_TOK * (MAX_ROWS + Y_PAD)];

static void run(nm_gemmq_fn f, const problem *p, float *y, int64_t ldy) {
    for (int64_t i = 0; i < MAX_TOK * (MAX_ROWS + Y_PAD); i++) y[i] = SENTINEL;
    f(p->wq, p->w_stride, p->n_rows, p->xq, p->x_stride, p->n_tok, p->K, y, ldy);
}

// Entries outside the n_rows x n_tok block are untouched.
static int untouched_outside(const problem *p, const float *y, int64_t ldy) {
    for (int64_t i = 0; i < MAX_TOK * (MAX_ROWS + Y_PAD); i++) {
        int64_t tok = i / ldy, r = i % ldy;
        if ((tok >= p->n_tok || r >= p->n_rows) && memcmp(&y[i], &SENTINEL, sizeof(float)) != 0) return 0;
    }
    return 1;
}

NM_TEST(gemmq_tables_complete) {
    const nm_kernels *tabs[2] = {nm_kernels_ref(), nm_kernels_get()};
    for (int k = 0; k < 2; k++)
        for (int t = 0; t < NM_TYPE_COUNT; t++) NM_CHECK((tabs[k]->dotq[t] != NULL) == (tabs[k]->gemmq[t] != NULL));
}

// The ref is the dotq_ref loop bit for bit, writes only its block, and reads
// rows at the given strides.
NM_TEST(gemmq_ref_is_the_dotq_loop) {
    const nm_kernels *r = nm_kernels_ref();
    for (size_t ti = 0; ti < N_WTYPES; ti++) {
        uint32_t t = weight_types[ti];
        const int64_t K = 3 * nm_type_traits_get(t)->blck_size * (nm_type_traits_get(t)->blck_size == 1 ? 32 : 1);
        problem p = make_problem(t, 5, 3, K);
        const int64_t ldy = p.n_rows + Y_PAD;
        run(r->gemmq[t], &p, y_got, ldy);
        NM_CHECK(untouched_outside(&p, y_got, ldy));
        for (int64_t i = 0; i < p.n_tok; i++)
            for (int64_t o = 0; o < p.n_rows; o++) {
                float want = r->dotq[t](p.wq + o * p.w_stride, p.xq + i * p.x_stride, K);
                NM_CHECK(memcmp(&want, &y_got[i * ldy + o], sizeof want) == 0);
            }
    }
}

// The chosen table and every SIMD table under it (the AVX2 gemmq that
// AVX-VNNI overrides must stay right for CPUs without it; the plain NEON
// tiles for ARM CPUs without dotprod). Returns the count.
static int tables(const nm_kernels *out[5]) {
    int n = 0;
    out[n++] = nm_kernels_get();
#if defined(NM_HAVE_X86_SIMD) && (defined(__x86_64__) || defined(__i386__))
    if (out[0] != nm_kernels_ref()) {
        out[n++] = nm_kernels_avx2();
        const nm_cpu_features *f = nm_cpu_features_get();
        if (f->avx_vnni) out[n++] = nm_kernels_avxvnni();
        if (f->avx512f && f->avx512vl && f->avx512vnni) out[n++] = nm_kernels_avx512vnni_ymm();
    }
#elif defined(NM_HAVE_ARM_SIMD) && defined(__aarch64__)
    if (out[0] != nm_kernels_ref()) {
        out[n++] = nm_kernels_neon();
        if (nm_cpu_features_get()->dotprod) out[n++] = nm_kernels_neon_dotprod();
    }
#endif
    return n;
}

// Every table's gemmq of type t against the ref on problem p (ldy = n_rows +
// Y_PAD). Returns the number of tables checked; prints the first misses and
// fails the calling test (its nmtest_failed) on any.
static int check_tables(int *nmtest_failed, const problem *p, const char *what) {
    const nm_kernels *tabs[5], *r = nm_kernels_ref();
    const int ntab = tables(tabs);
    const int64_t ldy = p->n_rows + Y_PAD;
    int checked = 0;
    run(r->gemmq[p->t], p, y_ref, ldy);
    for (int k = 0; k < ntab; k++) {
        if (!tabs[k]->gemmq[p->t]) continue;
        run(tabs[k]->gemmq[p->t], p, y_got, ldy);
        NM_CHECK(untouched_outside(p, y_got, ldy));
        int bad = 0;
        for (int64_t i = 0; i < p->n_tok; i++)
            for (int64_t o = 0; o < p->n_rows; o++) {
                double tol = pair_tol(p, o, i), got = y_got[i * ldy + o], want = y_ref[i * ldy + o];
                if (!(fabs(got - want) <= tol) && bad++ < 3) {
                    fprintf(stderr, "  %s %s %s %lldx%lld K=%lld: y[tok %lld][row %lld] = %.7g, ref %.7g\n",
                            tabs[k]->name, tname(p->t), what, (long long)p->n_rows, (long long)p->n_tok,
                            (long long)p->K, (long long)i, (long long)o, got, want);
                    NM_CHECK_NEAR(got, want, tol);
                }
            }
        checked++;
    }
    return checked;
}

// The VNNI builds (AVX-VNNI's VEX vpdpbusd, AVX512-VNNI's EVEX one on ymm)
// sum the same integers as the AVX2 build (vpmaddubsw + vpmaddwd, no operand
// reaching its saturation): bit for bit the AVX2 results, dotq and gemmq, for
// every type they take. Skipped where the CPU has neither.
NM_TEST(vnni_builds_equal_avx2_bits) {
#if defined(NM_HAVE_X86_SIMD) && (defined(__x86_64__) || defined(__i386__))
    const nm_cpu_features *f = nm_cpu_features_get();
    const nm_kernels *v[2];
    int nv = 0;
    if (f->avx_vnni) v[nv++] = nm_kernels_avxvnni();
    if (f->avx512f && f->avx512vl && f->avx512vnni) v[nv++] = nm_kernels_avx512vnni_ymm();
    if (nv == 0 || nm_kernels_get() == nm_kernels_ref()) NM_SKIP("this CPU has no VNNI (AVX-VNNI or AVX512-VNNI)");
    const nm_kernels *a = nm_kernels_avx2();
    int checked = 0;
    for (size_t ti = 0; ti < N_WTYPES; ti++) {
        const uint32_t t = weight_types[ti];
        const int64_t bs = nm_type_traits_get(t)->blck_size;
        if (bs == 1) continue;
        problem p = make_problem(t, 17, 9, 17 * (bs >= 256 ? bs : 8 * bs));
        const int64_t ldy = p.n_rows + Y_PAD;
        for (int k = 0; k < nv; k++) {
            if (v[k]->gemmq[t] && a->gemmq[t]) {
                run(a->gemmq[t], &p, y_ref, ldy);
                run(v[k]->gemmq[t], &p, y_got, ldy);
                NM_CHECK(memcmp(y_ref, y_got, sizeof y_ref) == 0);
                checked++;
            }
            if (v[k]->dotq[t] && a->dotq[t]) {
                for (int64_t r = 0; r < p.n_rows; r++) {
                    const float want = a->dotq[t](p.wq + r * p.w_stride, p.xq, p.K);
                    const float got = v[k]->dotq[t](p.wq + r * p.w_stride, p.xq, p.K);
                    NM_CHECK(memcmp(&want, &got, sizeof want) == 0);
                }
                checked++;
            }
        }
    }
    NM_CHECK(checked > 0);
    printf("  %d (build, type, kernel) sets bit-identical to AVX2\n", checked);
#else
    NM_SKIP("not an x86 SIMD build");
#endif
}

NM_TEST(gemmq_matches_ref) {
    static const int64_t shapes[][2] = {{1, 1}, {3, 5}, {17, 7}, {16, 64}, {2, 4}, {5, 9}}; // rows x tokens
    static const int64_t blocks[] = {1, 3, 8, 17}; // 17: past the K chunk of the K-quant tiles (8 super-blocks; <= MAX_K)
    int checked = 0;
    for (size_t ti = 0; ti < N_WTYPES; ti++) {
        uint32_t t = weight_types[ti];
        const int64_t bs = nm_type_traits_get(t)->blck_size;
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
            for (size_t bi = 0; bi < sizeof blocks / sizeof blocks[0]; bi++) {
                const int64_t K = bs == 1 ? 32 * blocks[bi] + 5 : bs * blocks[bi]; // floats: an odd tail
                problem p = make_problem(t, shapes[si][0], shapes[si][1], K);
                checked += check_tables(nmtest_failed, &p, "gauss");
            }
    }
    NM_CHECK(checked >= (int)(N_WTYPES * 6 * 3));
}

// Every tile edge: 1..9 rows (tiles of 2 and 4 rows, and their tails) x 1..9
// tokens (tiles of 4 and 8, and their tails), two blocks.
NM_TEST(gemmq_tile_edges) {
    int checked = 0;
    for (size_t ti = 0; ti < N_WTYPES; ti++) {
        const uint32_t t = weight_types[ti];
        const int64_t bs = nm_type_traits_get(t)->blck_size;
        if (bs == 1) continue; // the float types have no tiles
        for (int64_t rows = 1; rows <= 9; rows++)
            for (int64_t tok = 1; tok <= 9; tok++) {
                problem p = make_problem(t, rows, tok, 2 * bs);
                checked += check_tables(nmtest_failed, &p, "edges");
            }
    }
    NM_CHECK(checked >= (int)((N_WTYPES - 3) * 81));
}

// Sets the scale fields of every block of the weight rows to tame values
// (d 1.0, the min/dmin fields 0.5, mxfp4's exponent 2^-1), leaving the quant
// and sub-block scale bytes as they are.
static void tame_scales(problem *p) {
    const size_t bsz = nm_row_size(p->t, nm_type_traits_get(p->t)->blck_size);
    const int64_t nb = p->K / nm_type_traits_get(p->t)->blck_size;
    const uint16_t one = 0x3c00, half = 0x3800;
    const float fone = 1.0f;
    for (int64_t r = 0; r < p->n_rows; r++)
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *blk = p->wq + r * p->w_stride + (size_t)b * bsz;
            switch (p->t) {
            case NM_TYPE_MXFP4: blk[0] = 127; break;
            case NM_TYPE_Q4_1: case NM_TYPE_Q5_1: case NM_TYPE_Q4_K: case NM_TYPE_Q5_K: // d, then m / dmin
                memcpy(blk, &one, 2), memcpy(blk + 2, &half, 2);
                break;
            case NM_TYPE_Q2_K:
                memcpy(blk + offsetof(nm_block_q2_K, d), &one, 2);
                memcpy(blk + offsetof(nm_block_q2_K, dmin), &half, 2);
                break;
            case NM_TYPE_Q3_K: memcpy(blk + offsetof(nm_block_q3_K, d), &one, 2); break;
            case NM_TYPE_Q6_K: memcpy(blk + offsetof(nm_block_q6_K, d), &one, 2); break;
            case NM_TYPE_Q8_K: memcpy(blk, &fone, 4); break;
            default: memcpy(blk, &one, 2); break; // q4_0, q5_0, q8_0, q8_1: d first
            }
        }
}

// Extreme quants: weight rows filled with one byte pattern (all quants at
// the ends of their range, the 6-bit and 8-bit sub-block scales at +-max)
// against activations at +-127 in every element, so the int32 block sums
// reach their largest values (no int16 step may overflow).
NM_TEST(gemmq_extreme_quants) {
    static const uint8_t patterns[] = {0x00, 0xff, 0x80, 0x7f, 0x55, 0xaa};
    int checked = 0;
    for (size_t ti = 0; ti < N_WTYPES; ti++) {
        const uint32_t t = weight_types[ti];
        const int64_t bs = nm_type_traits_get(t)->blck_size;
        if (bs == 1) continue;
        for (size_t pi = 0; pi < sizeof patterns; pi++) {
            problem p = make_problem(t, 5, 6, 4 * bs);
            for (int64_t r = 0; r < p.n_rows; r++) memset(p.wq + r * p.w_stride, patterns[pi], nm_row_size(t, p.K));
            tame_scales(&p);
            for (int64_t r = 0; r < p.n_rows; r++) nm_dequantize_row_ref(t, p.wq + r * p.w_stride, p.wd + r * p.K, p.K);
            for (int64_t i = 0; i < 3; i++) { // tokens +1, -1, alternating; 3.. keep make_problem's Gaussians
                for (int64_t j = 0; j < p.K; j++) tmp[j] = i == 0 ? 1.f : i == 1 ? -1.f : (j & 1 ? 1.f : -1.f);
                nm_kernels_ref()->quant_act[p.at](tmp, p.xq + i * p.x_stride, p.K);
                nm_dequantize_row_ref(p.at, p.xq + i * p.x_stride, p.xd + i * p.K, p.K);
            }
            checked += check_tables(nmtest_failed, &p, "extreme");
        }
    }
    NM_CHECK(checked >= (int)((N_WTYPES - 3) * 6));
}

// ---- packed prefill: 16 tokens per vector, the reference's bits ------------------------

static uint8_t pack_buf[(MAX_TOK + NM_GQP_TOK - 1) / NM_GQP_TOK * NM_GQP_BYTES(MAX_K)] __attribute__((aligned(64)));

// p's activations packed group by group, then gemmq_packed into y (SENTINEL first).
static void run_packed(const nm_kernels *k, const problem *p, float *y, int64_t ldy) {
    for (int64_t t0 = 0; t0 < p->n_tok; t0 += NM_GQP_TOK) {
        const int64_t nt = p->n_tok - t0 < NM_GQP_TOK ? p->n_tok - t0 : NM_GQP_TOK;
        k->gemmq_pack[p->at](p->xq + t0 * p->x_stride, p->x_stride, nt, p->K,
                             pack_buf + t0 / NM_GQP_TOK * NM_GQP_BYTES(p->K));
    }
    for (int64_t i = 0; i < MAX_TOK * (MAX_ROWS + Y_PAD); i++) y[i] = SENTINEL;
    k->gemmq_packed[p->t](p->wq, p->w_stride, p->n_rows, pack_buf, p->n_tok, p->K, y, ldy);
}

// The packed kernel of p's type (if this CPU's table has one) against the
// reference gemmq (the dotq_ref loop): the same bits, y untouched outside.
static int check_packed(int *nmtest_failed, const problem *p, const char *what) {
    const nm_kernels *k = nm_kernels_get();
    if (!k->gemmq_packed[p->t]) return 0;
    NM_CHECK(k->gemmq_pack[p->at] != NULL);
    const int64_t ldy = p->n_rows + Y_PAD;
    run(nm_kernels_ref()->gemmq[p->t], p, y_ref, ldy);
    run_packed(k, p, y_got, ldy);
    NM_CHECK(untouched_outside(p, y_got, ldy));
    int bad = 0;
    for (int64_t i = 0; i < p->n_tok; i++)
        for (int64_t o = 0; o < p->n_rows; o++) {
            const float got = y_got[i * ldy + o], want = y_ref[i * ldy + o];
            if (memcmp(&got, &want, sizeof got) != 0 && bad++ < 3) {
                fprintf(stderr, "  packed %s %s %lldx%lld K=%lld: y[tok %lld][row %lld] = %.9g, ref %.9g\n",
                        tname(p->t), what, (long long)p->n_rows, (long long)p->n_tok, (long long)p->K,
                        (long long)i, (long long)o, got, want);
                NM_CHECK(memcmp(&got, &want, sizeof got) == 0);
            }
        }
    return 1;
}

// Row tiles of 8 (and tails), token groups of 16 (and tails), K chunks of 64
// blocks (the K formats: 4 super-blocks) and a K past two of them.
NM_TEST(gemmq_packed_equals_ref_bits) {
    const nm_kernels *k = nm_kernels_get();
    int n_types = 0;
    for (int t = 0; t < NM_TYPE_COUNT; t++) n_types += k->gemmq_packed[t] != NULL;
    if (n_types == 0) NM_SKIP("no packed prefill kernels on this CPU (they need AVX-512 with VNNI)");
    static const int64_t rows[] = {1, 7, 8, 9, 16, 17}, toks[] = {1, 2, 15, 16, 17, 33, 64}, blocks[] = {1, 3, 64, 65, 144},
                         sblocks[] = {1, 3, 4, 5, 9}; // K formats: super-blocks
    int checked = 0;
    for (size_t ti = 0; ti < N_WTYPES; ti++)
        for (size_t ri = 0; ri < sizeof rows / sizeof rows[0]; ri++)
            for (size_t ki = 0; ki < sizeof toks / sizeof toks[0]; ki++)
                for (size_t bi = 0; bi < sizeof blocks / sizeof blocks[0]; bi++) {
                    if ((rows[ri] > 9 || toks[ki] > 17) && blocks[bi] > 3 && bi % 2) continue; // keep it short
                    const int64_t bs = nm_type_traits_get(weight_types[ti])->blck_size;
                    problem p = make_problem(weight_types[ti], rows[ri], toks[ki], bs * (bs == NM_QK_K ? sblocks[bi] : blocks[bi]));
                    checked += check_packed(nmtest_failed, &p, "gauss");
                }
    NM_CHECK(checked > 0);
    printf("  %d problems over %d types: bit-identical to the reference\n", checked, n_types);
}

// Quants at the ends of their ranges against activations at +-127.
NM_TEST(gemmq_packed_extreme_quants) {
    if (!nm_kernels_get()->gemmq_packed[NM_TYPE_Q4_0]) NM_SKIP("no packed prefill kernels on this CPU");
    static const uint8_t patterns[] = {0x00, 0xff, 0x80, 0x7f, 0x55, 0xaa};
    int checked = 0;
    for (size_t ti = 0; ti < N_WTYPES; ti++) {
        const uint32_t t = weight_types[ti];
        for (size_t pi = 0; pi < sizeof patterns; pi++) {
            problem p = make_problem(t, 9, 18, 4 * nm_type_traits_get(t)->blck_size);
            for (int64_t r = 0; r < p.n_rows; r++) memset(p.wq + r * p.w_stride, patterns[pi], nm_row_size(t, p.K));
            tame_scales(&p);
            for (int64_t i = 0; i < 3; i++) {
                for (int64_t j = 0; j < p.K; j++) tmp[j] = i == 0 ? 1.f : i == 1 ? -1.f : (j & 1 ? 1.f : -1.f);
                nm_kernels_ref()->quant_act[p.at](tmp, p.xq + i * p.x_stride, p.K);
            }
            checked += check_packed(nmtest_failed, &p, "extreme");
        }
    }
    NM_CHECK(checked >= 6 * 6);
}

// ---- gemv: the decode matmul (one token) ----------------------------------------------

// The table with gemv entries on this CPU (the chosen one, where the CPU has
// the AVX-512 subsets; NM_NO_AVX512=1 takes them out), or NULL.
static const nm_kernels *gemv_table(void) {
    const nm_kernels *k = nm_kernels_get();
    for (int t = 0; t < NM_TYPE_COUNT; t++)
        if (k->gemv[t]) return k;
    return NULL;
}

static uint8_t prep_buf[NM_GEMV_PREP_BYTES(MAX_K)] __attribute__((aligned(64)));

// y[0..n_rows) by gemv with token 0 of p, y[n_rows..) left as SENTINEL; then
// each row against dotq_ref within pair_tol.
static int check_gemv(int *nmtest_failed, const nm_kernels *k, const problem *p, const char *what) {
    if (!k->gemv[p->t]) return 0;
    NM_CHECK(k->gemv_prep[p->t] != NULL);
    for (int64_t i = 0; i < MAX_ROWS + Y_PAD; i++) y_got[i] = SENTINEL;
    k->gemv_prep[p->t](p->xq, p->K, prep_buf);
    k->gemv[p->t](p->wq, p->w_stride, p->n_rows, 0, prep_buf, p->K, y_got);
    int bad = 0;
    for (int64_t o = 0; o < p->n_rows; o++) {
        const double want = nm_kernels_ref()->dotq[p->t](p->wq + o * p->w_stride, p->xq, p->K);
        const double tol = pair_tol(p, o, 0), got = y_got[o];
        if (!(fabs(got - want) <= tol) && bad++ < 3) {
            fprintf(stderr, "  gemv %s %s %lld rows K=%lld: y[%lld] = %.7g, ref %.7g\n", tname(p->t), what,
                    (long long)p->n_rows, (long long)p->K, (long long)o, got, want);
            NM_CHECK_NEAR(got, want, tol);
        }
    }
    for (int64_t i = p->n_rows; i < MAX_ROWS + Y_PAD; i++) NM_CHECK(memcmp(&y_got[i], &SENTINEL, sizeof(float)) == 0);
    return 1;
}

NM_TEST(gemv_entries_paired) {
    const nm_kernels *tabs[5];
    const int ntab = tables(tabs);
    for (int k = 0; k < ntab; k++)
        for (int t = 0; t < NM_TYPE_COUNT; t++) {
            NM_CHECK((tabs[k]->gemv[t] != NULL) == (tabs[k]->gemv_prep[t] != NULL));
            if (tabs[k]->gemv[t]) NM_CHECK(tabs[k]->dotq[t] != NULL);
        }
    NM_CHECK(nm_kernels_ref()->gemv[NM_TYPE_Q4_1] == NULL);
}

// Every block count from 1 to 64 (the kernels go 16 or 32 blocks at a time
// and mask the rest) and the widths of the models, 1..17 rows, rows off the
// SIMD alignment (W_PAD).
NM_TEST(gemv_matches_ref) {
    const nm_kernels *k = gemv_table();
    if (!k) NM_SKIP("no gemv kernels on this CPU");
    static const int64_t rows[] = {1, 2, 5, 17};
    int checked = 0;
    for (size_t ti = 0; ti < N_WTYPES; ti++) {
        const uint32_t t = weight_types[ti];
        const int64_t bs = nm_type_traits_get(t)->blck_size;
        if (!k->gemv[t]) continue;
        for (int64_t nb = 1; nb * bs <= MAX_K; nb = nb < 64 ? nb + 1 : nb * 2)
            for (size_t ri = 0; ri < sizeof rows / sizeof rows[0]; ri++) {
                problem p = make_problem(t, rows[ri], 1, nb * bs);
                checked += check_gemv(nmtest_failed, k, &p, "gauss");
            }
        static const int64_t widths[] = {576, 640, 1024, 1536, 2048};
        for (size_t wi = 0; wi < sizeof widths / sizeof widths[0]; wi++) {
            if (widths[wi] % bs) continue; // the K formats: 256 | K
            problem p = make_problem(t, 9, 1, widths[wi]);
            checked += check_gemv(nmtest_failed, k, &p, "model width");
        }
    }
    NM_CHECK(checked > 0);
}

// Quants at the ends of their range against +-127 activations.
NM_TEST(gemv_extreme_quants) {
    const nm_kernels *k = gemv_table();
    if (!k) NM_SKIP("no gemv kernels on this CPU");
    static const uint8_t patterns[] = {0x00, 0xff, 0x80, 0x7f, 0x55, 0xaa};
    for (size_t ti = 0; ti < N_WTYPES; ti++) {
        const uint32_t t = weight_types[ti];
        if (!k->gemv[t]) continue;
        for (size_t pi = 0; pi < sizeof patterns; pi++)
            for (int sign = 0; sign < 3; sign++) {
                const int64_t bs = nm_type_traits_get(t)->blck_size;
                problem p = make_problem(t, 5, 1, (37 * bs <= MAX_K ? 37 : MAX_K / bs) * bs);
                for (int64_t r = 0; r < p.n_rows; r++) memset(p.wq + r * p.w_stride, patterns[pi], nm_row_size(t, p.K));
                tame_scales(&p);
                for (int64_t r = 0; r < p.n_rows; r++) nm_dequantize_row_ref(t, p.wq + r * p.w_stride, p.wd + r * p.K, p.K);
                for (int64_t j = 0; j < p.K; j++) tmp[j] = sign == 0 ? 1.f : sign == 1 ? -1.f : (j & 1 ? 1.f : -1.f);
                nm_kernels_ref()->quant_act[p.at](tmp, p.xq, p.K);
                nm_dequantize_row_ref(p.at, p.xq, p.xd, p.K);
                check_gemv(nmtest_failed, k, &p, "extreme");
            }
    }
}

// The last row ends exactly where a PROT_NONE page starts (as a tensor can
// end where an mmapped file does): the kernels' loads stop at the row.
NM_TEST(gemv_stops_at_the_row_end) {
    const nm_kernels *k = gemv_table();
    if (!k) NM_SKIP("no gemv kernels on this CPU");
    const size_t page = (size_t)sysconf(_SC_PAGESIZE), len = 4 * page;
    uint8_t *map = mmap(NULL, len + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    NM_CHECK(map != MAP_FAILED);
    if (map == MAP_FAILED) return;
    NM_CHECK(mprotect(map + len, page, PROT_NONE) == 0);
    for (size_t ti = 0; ti < N_WTYPES; ti++) {
        const uint32_t t = weight_types[ti];
        if (!k->gemv[t]) continue;
        for (int64_t nb = 1; nb <= 40 && nb * nm_type_traits_get(t)->blck_size <= MAX_K; nb++) {
            problem p = make_problem(t, 3, 1, nb * nm_type_traits_get(t)->blck_size);
            const size_t rb = nm_row_size(t, p.K);
            uint8_t *w = map + len - 3 * rb; // packed rows, the last one flush with the guard page
            for (int r = 0; r < 3; r++) memcpy(w + r * rb, p.wq + r * p.w_stride, rb);
            k->gemv_prep[t](p.xq, p.K, prep_buf);
            k->gemv[t](w, rb, 3, 0, prep_buf, p.K, y_got);
            for (int r = 0; r < 3; r++)
                NM_CHECK_NEAR(y_got[r], nm_kernels_ref()->dotq[t](p.wq + r * p.w_stride, p.xq, p.K), pair_tol(&p, r, 0));
        }
    }
    munmap(map, len + page);
}

// ---- speed (NM_TEST_BENCH=1) ------------------------------------------------------------

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void pair_loop(nm_dotq_fn dot, const problem *p, float *y, int64_t ldy) {
    for (int64_t i = 0; i < p->n_tok; i++)
        for (int64_t o = 0; o < p->n_rows; o++) y[i * ldy + o] = dot(p->wq + o * p->w_stride, p->xq + i * p->x_stride, p->K);
}

// ns per 1000 multiply-adds of one ~10 ms run.
static double time_ns(const nm_kernels *k, const problem *p, int gemm) {
    const double macs = (double)p->n_rows * (double)p->n_tok * (double)p->K;
    int iters = 0;
    double t0 = now_s(), t1;
    do {
        if (gemm) k->gemmq[p->t](p->wq, p->w_stride, p->n_rows, p->xq, p->x_stride, p->n_tok, p->K, y_got, p->n_rows);
        else pair_loop(k->dotq[p->t], p, y_got, p->n_rows);
        iters++;
    } while ((t1 = now_s()) - t0 < 0.01);
    return (t1 - t0) * 1e9 / iters / macs * 1000;
}

// ns per 1000 multiply-adds of the packed kernel, the activations packed once before.
static double time_packed_ns(const nm_kernels *k, const problem *p) {
    const double macs = (double)p->n_rows * (double)p->n_tok * (double)p->K;
    run_packed(k, p, y_got, p->n_rows);
    int iters = 0;
    double t0 = now_s(), t1;
    do {
        k->gemmq_packed[p->t](p->wq, p->w_stride, p->n_rows, pack_buf, p->n_tok, p->K, y_got, p->n_rows);
        iters++;
    } while ((t1 = now_s()) - t0 < 0.01);
    return (t1 - t0) * 1e9 / iters / macs * 1000;
}

// Best of 5 interleaved runs each (the machine is shared: the minimum is the signal).
static void bench(const nm_kernels *k, const problem *p, double *gemm_ns, double *loop_ns) {
    *gemm_ns = *loop_ns = 1e30;
    for (int rep = 0; rep < 5; rep++) {
        double g = time_ns(k, p, 1), d = time_ns(k, p, 0);
        if (g < *gemm_ns) *gemm_ns = g;
        if (d < *loop_ns) *loop_ns = d;
    }
}

NM_TEST_OPTIN(gemmq_speed, "NM_TEST_BENCH") {
    static const uint32_t types[] = {NM_TYPE_Q4_0, NM_TYPE_Q4_1, NM_TYPE_Q5_0, NM_TYPE_Q8_0,
                                     NM_TYPE_MXFP4, NM_TYPE_Q4_K, NM_TYPE_Q5_K, NM_TYPE_Q6_K};
    static const int64_t Ks[] = {576, 2048};
    const nm_kernels *tabs[5];
    const int ntab = tables(tabs);
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++)
        for (size_t ki = 0; ki < 2; ki++) {
            uint32_t t = types[ti];
            int64_t K = Ks[ki] % nm_type_traits_get(t)->blck_size ? 2304 : Ks[ki]; // K formats: 256 | K
            if (ki == 0 && K == 2304) K = 768;
            problem p = make_problem(t, 16, 64, K);
            for (int k = 0; k < ntab; k++) {
                if (!tabs[k]->gemmq[t]) continue;
                double g, d;
                bench(tabs[k], &p, &g, &d);
                printf("  %-10s %-6s 16x64 K=%-5lld gemmq %6.1f ns/kMAC  dotq loop %6.1f  x%.2f\n", tabs[k]->name,
                       tname(t), (long long)K, g, d, d / g);
                if (k == 0 && tabs[k]->gemmq_packed[t]) {
                    double pk = 1e30;
                    for (int rep = 0; rep < 5; rep++) pk = fmin(pk, time_packed_ns(tabs[k], &p));
                    printf("  %-10s %-6s 16x64 K=%-5lld packed %6.1f ns/kMAC (activations packed once, not timed)  x%.2f of gemmq\n",
                           tabs[k]->name, tname(t), (long long)K, pk, g / pk);
                }
                // the bench ran on the same data: gemmq still agrees with the loop
                run(tabs[k]->gemmq[t], &p, y_got, p.n_rows);
                pair_loop(tabs[k]->dotq[t], &p, y_ref, p.n_rows);
                for (int64_t i = 0; i < p.n_tok; i += 7)
                    for (int64_t o = 0; o < p.n_rows; o += 3)
                        NM_CHECK_NEAR(y_got[i * p.n_rows + o], y_ref[i * p.n_rows + o], pair_tol(&p, o, i));
            }
        }
}

// Decode: the gemv kernel against the per-row dotq loop of the same table, 16
// rows, best of 5 interleaved ~10 ms runs. The activation is prepared once
// outside the timing, as the backend prepares it once per op for all its rows.
static double time_gemv_ns(const nm_kernels *k, const problem *p, int gemv) {
    const double macs = (double)p->n_rows * (double)p->K;
    if (gemv) k->gemv_prep[p->t](p->xq, p->K, prep_buf);
    int iters = 0;
    double t0 = now_s(), t1;
    do {
        if (gemv) {
            k->gemv[p->t](p->wq, p->w_stride, p->n_rows, 0, prep_buf, p->K, y_got);
        } else {
            for (int64_t o = 0; o < p->n_rows; o++) y_got[o] = k->dotq[p->t](p->wq + o * p->w_stride, p->xq, p->K);
        }
        iters++;
    } while ((t1 = now_s()) - t0 < 0.01);
    return (t1 - t0) * 1e9 / iters / macs * 1000;
}

NM_TEST_OPTIN(gemv_speed, "NM_TEST_BENCH") {
    const nm_kernels *k = gemv_table();
    if (!k) NM_SKIP("no gemv kernels on this CPU");
    static const int64_t Ks[] = {576, 640, 1024, 2048};
    for (int t = 0; t < NM_TYPE_COUNT; t++) {
        if (!k->gemv[t]) continue;
        for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++) {
            if (Ks[ki] % nm_type_traits_get((uint32_t)t)->blck_size) continue;
            problem p = make_problem((uint32_t)t, 16, 1, Ks[ki]);
            double g = 1e30, d = 1e30;
            for (int rep = 0; rep < 5; rep++) {
                g = fmin(g, time_gemv_ns(k, &p, 1));
                d = fmin(d, time_gemv_ns(k, &p, 0));
            }
            printf("  %-6s 16 rows K=%-5lld gemv %6.1f ns/kMAC  dotq loop %6.1f  x%.2f\n", tname((uint32_t)t),
                   (long long)Ks[ki], g, d, d / g);
            NM_CHECK(check_gemv(nmtest_failed, k, &p, "bench") == 1); // the timed kernel still agrees
        }
    }
}

NM_TEST_MAIN()
