// The CPU backend's attention: causal attention of queries over one layer's
// f16 KV cache (NM_OP_ATTENTION: decode one query at a time with an online
// softmax; Whisper's beams sharing keys; prefill on the AVX-512 panels) and the
// encoders' bidirectional attention (NM_OP_ATTENTION_FULL).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_impl.h"

// One query row against cache rows [k_lo, k_hi]: single pass with an online
// softmax (running max and sum), so no per-context score buffer is needed.
// K and V rows are f16: K goes through the f16 x f32 dot kernel, each V row is
// widened once into `v` (1 KiB of stack at most).
static void attn_one(const nm_cpu *c, const float *q, const uint16_t *kc, const uint16_t *vc, int64_t stride, int hd,
                     const int32_t *rows, int64_t k_lo, int64_t k_hi, float scale, float softcap, float *out) {
    const nm_dot_fn hdot = c->k->dot[NM_TYPE_F16];
    const nm_dequant_fn widen = c->k->dequant[NM_TYPE_F16];
    float acc[1024], v[1024];
    float m = -INFINITY, l = 0.0f;
    memset(acc, 0, sizeof(float) * (size_t)hd);
    for (int64_t j = k_lo; j <= k_hi; j++) {
        const int64_t row = KVROW(rows, j);
        float s = hdot(kc + row * stride, q, hd) * scale;
        if (softcap > 0.0f) s = softcap * tanhf(s / softcap);
        widen(vc + row * stride, v, hd);
        if (s > m) {
            float r = nm_expf(m - s); // rescale what was accumulated under the old max
            for (int d = 0; d < hd; d++) acc[d] = acc[d] * r + v[d];
            l = l * r + 1.0f;
            m = s;
        } else {
            float p = nm_expf(s - m);
            for (int d = 0; d < hd; d++) acc[d] += p * v[d];
            l += p;
        }
    }
    float inv = l > 0.0f ? 1.0f / l : 0.0f;
    for (int d = 0; d < hd; d++) out[d] = acc[d] * inv;
}

// ggml's non-flash attention of one query (NM_OPF_GGML_F16): q rounded to
// f16, s_j = (k_j . q) * scale, softmax with expf, each probability rounded to
// f16, then sum_j p_j v_j in f32. At most NM_ATTN_GGML_MAX keys.
static void attn_one_ggml(const nm_cpu *c, const float *q, const uint16_t *kc, const uint16_t *vc, int64_t stride,
                          int hd, const int32_t *rows, int64_t k_lo, int64_t k_hi, float scale, float *out) {
    const nm_dot_fn hdot = c->k->dot[NM_TYPE_F16];
    const nm_dequant_fn widen = c->k->dequant[NM_TYPE_F16];
    float qh[1024], v[1024], p[NM_ATTN_GGML_MAX];
    memcpy(qh, q, sizeof(float) * (size_t)hd);
    round_f16(c, qh, hd);
    float m = -INFINITY, sum = 0.0f;
    for (int64_t j = k_lo; j <= k_hi; j++) {
        p[j - k_lo] = hdot(kc + KVROW(rows, j) * stride, qh, hd) * scale;
        m = p[j - k_lo] > m ? p[j - k_lo] : m;
    }
    for (int64_t j = k_lo; j <= k_hi; j++) sum += (p[j - k_lo] = expf(p[j - k_lo] - m));
    const float inv = 1.0f / sum;
    for (int64_t j = 0; j <= k_hi - k_lo; j++) p[j] *= inv;
    round_f16(c, p, k_hi - k_lo + 1);
    memset(out, 0, sizeof(float) * (size_t)hd);
    for (int64_t j = k_lo; j <= k_hi; j++) {
        const float pj = p[j - k_lo];
        widen(vc + KVROW(rows, j) * stride, v, hd);
        for (int d = 0; d < hd; d++) out[d] += pj * v[d];
    }
}

// NM_OPF_GGML_F16 with several queries at one position over the same keys
// (Whisper's cross-attention of a batch of beams): a chunk is one head; each
// query's scores and softmax as attn_one_ggml computes them, then each V row
// is widened once for all the queries, which add it in the same order.
void attn_shared_worker(void *arg, int64_t h, int ith) {
    const attn_task *t = arg;
    const nm_op *op = t->op;
    const nm_cpu *c = t->c;
    const int n_head = op->i0, n_kv = op->i1, hd = op->i2;
    const int64_t stride = (int64_t)n_kv * hd, T = op->src0->ne[1], pos = IDS(op)[0];
    const int64_t lo = attn_lo(op, pos), nk = pos - lo + 1;
    const int kvh = (int)h / (n_head / n_kv);
    const uint16_t *kc = KVK(op) + kvh * hd, *vc = KVV(op) + kvh * hd;
    const int32_t *rows = KVROWS(op);
    const nm_dot_fn hdot = c->k->dot[NM_TYPE_F16];
    const nm_dequant_fn widen = c->k->dequant[NM_TYPE_F16];
    float p[NM_ATTN_SHARED_MAX], qh[1024], v[1024];
    for (int64_t q = 0; q < T; q++) {
        float *pq = p + q * nk, m = -INFINITY, sum = 0.0f;
        memcpy(qh, (const float *)TD(op->src0) + (q * n_head + h) * hd, sizeof(float) * (size_t)hd);
        round_f16(c, qh, hd);
        for (int64_t j = 0; j < nk; j++) {
            pq[j] = hdot(kc + KVROW(rows, lo + j) * stride, qh, hd) * op->f0;
            m = pq[j] > m ? pq[j] : m;
        }
        for (int64_t j = 0; j < nk; j++) sum += (pq[j] = expf(pq[j] - m));
        const float inv = 1.0f / sum;
        for (int64_t j = 0; j < nk; j++) pq[j] *= inv;
        round_f16(c, pq, nk);
        memset((float *)TD(op->dst) + (q * n_head + h) * hd, 0, sizeof(float) * (size_t)hd);
    }
    for (int64_t j = 0; j < nk; j++) {
        widen(vc + KVROW(rows, lo + j) * stride, v, hd);
        for (int64_t q = 0; q < T; q++) {
            const float pj = p[q * nk + j];
            float *out = (float *)TD(op->dst) + (q * n_head + h) * hd;
            for (int d = 0; d < hd; d++) out[d] += pj * v[d];
        }
    }
}

void attn_worker(void *arg, int64_t i, int ith) {
    const attn_task *t = arg;
    const nm_op *op = t->op;
    const int n_head = op->i0, n_kv = op->i1, hd = op->i2;
    const int64_t stride = (int64_t)n_kv * hd;
    const float *q = TD(op->src0);
    float *out = TD(op->dst);
    // chunk i = one (token, head) pair
    int64_t tok = i / n_head;
    int h = (int)(i % n_head);
    int kvh = h / (n_head / n_kv); // grouped-query attention: heads share a KV head
    int64_t pos = IDS(op)[tok];
    int64_t lo = attn_lo(op, pos);
    if (op->flags & NM_OPF_GGML_F16)
        attn_one_ggml(t->c, q + (tok * n_head + h) * hd, KVK(op) + kvh * hd, KVV(op) + kvh * hd, stride, hd,
                      KVROWS(op), lo, pos, op->f0, out + (tok * n_head + h) * hd);
    else
        attn_one(t->c, q + (tok * n_head + h) * hd, KVK(op) + kvh * hd, KVV(op) + kvh * hd, stride, hd, KVROWS(op),
                 lo, pos, op->f0, op->f1, out + (tok * n_head + h) * hd);
}

// ---- bidirectional attention (encoders) -------------------------------------------------
//
// A chunk is one head and a contiguous group of queries, taken in blocks of
// NM_FA_QB queries: S = (scale Q) K^T, softmax, O = S V.
//
// With the AVX-512 panel kernels, a block of queries is packed into two
// 16-query panels, S = K Q^T comes out in panel layout (key j's 16 queries
// in one zmm, K read in place) and is, after a per-lane softmax, the packed
// activations of O = V^T S^T (V transposed once per chunk into rows of
// T + 16 floats): no pass over S outside the kernels.
//
// Without them, the chunk copies K and V^T into the thread's workspace once
// and both products go through the f32 GEMM (contiguous rows).
_Static_assert(NM_FA_QB == 2 * NM_GEMM_PACK_ROWS, "a query block is two panels");

#define FA_R16(n) (((n) + 15) / 16 * 16)
// qp (QB x hd) | scores (QB x T) | V^T (hd x (T + 16)) | K copy (T x hd)
int64_t fa_ws_floats(int64_t T, int64_t hd) {
    return FA_R16(NM_FA_QB * hd) + FA_R16(NM_FA_QB * T) + FA_R16(hd * (T + 16)) + FA_R16(T * hd);
}

// ggml's softmax of one row of n scores (NM_OPF_GGML_F16): the scale after
// the dot, exact expf, the sum in order, normalized (the caller rounds to f16).
static void softmax_ggml(float *s, int64_t n, float scale) {
    float m = -INFINITY, sum = 0.0f;
    for (int64_t j = 0; j < n; j++) m = (s[j] *= scale) > m ? s[j] : m;
    for (int64_t j = 0; j < n; j++) sum += (s[j] = expf(s[j] - m));
    const float inv = 1.0f / sum;
    for (int64_t j = 0; j < n; j++) s[j] *= inv;
}

// The same for the 16 lanes of a panel at once (sp[16 j + l], j < n): each
// lane the same operations in the same order as softmax_ggml on its row, in
// contiguous passes.
static void softmax_ggml_panel(float *sp, int64_t n, float scale) {
    float m[16], sum[16], inv[16];
    for (int l = 0; l < 16; l++) m[l] = -INFINITY, sum[l] = 0.0f;
    for (int64_t j = 0; j < n; j++)
        for (int l = 0; l < 16; l++) {
            const float v = sp[16 * j + l] *= scale;
            m[l] = v > m[l] ? v : m[l];
        }
    for (int64_t j = 0; j < n; j++)
        for (int l = 0; l < 16; l++) sum[l] += (sp[16 * j + l] = expf(sp[16 * j + l] - m[l]));
    for (int l = 0; l < 16; l++) inv[l] = 1.0f / sum[l];
    for (int64_t j = 0; j < n; j++)
        for (int l = 0; l < 16; l++) sp[16 * j + l] *= inv[l];
}

void fa_worker(void *arg, int64_t chunk, int ith) {
    const fa_task *t = arg;
    const nm_cpu *c = t->c;
    const nm_op *op = t->op;
    const int64_t T = op->src0->ne[1], n_head = op->i0, hd = op->i2, stride = n_head * hd;
    const int64_t h = chunk / t->n_groups;
    int64_t q_lo, q_hi;
    nm_split_range(T, (int)(chunk % t->n_groups), (int)t->n_groups, &q_lo, &q_hi);
    if (q_lo >= q_hi) return;
    const float *Q = (const float *)TD(op->src0) + h * hd, *K = (const float *)TD(op->src1) + h * hd;
    const float *V = (const float *)TD(op->src2) + h * hd;
    float *O = (float *)TD(op->dst) + h * hd;
    const bool g16 = op->flags & NM_OPF_GGML_F16;
    const nm_gemm_panel_kernels *pk = c->pk;
    float *ws = c->attn_ws + (size_t)ith * (size_t)c->attn_ws_floats;
    float *qp = ws;                         // pk: 2 panels of hd; else (QB, hd)
    float *sc = qp + FA_R16(NM_FA_QB * hd); // pk: 2 panels of T; else (QB, T)
    float *vt = sc + FA_R16(NM_FA_QB * T);  // V^T: (hd, ldv)
    float *kc = vt + FA_R16(hd * (T + 16)); // K (T, hd), where it is copied
    const int64_t ldv = pk ? T + 16 : T;
    for (int64_t j = 0; j < T; j++)
        for (int64_t d = 0; d < hd; d++) vt[d * ldv + j] = V[j * stride + d];
    const float *kr = K; // K's rows: in place with pk unless rounded, else the copy
    int64_t ldk = stride;
    if (!pk || g16) {
        for (int64_t j = 0; j < T; j++) memcpy(kc + j * hd, K + j * stride, sizeof(float) * (size_t)hd);
        kr = kc;
        ldk = hd;
    }
    if (g16) { // ggml casts K and V to f16
        round_f16(c, kc, T * hd);
        for (int64_t d = 0; d < hd; d++) round_f16(c, vt + d * ldv, T);
    }
    const float scale = op->f0, qs = g16 ? 1.0f : scale; // ggml: Q to f16, the scale after the dot
    for (int64_t q0 = q_lo; q0 < q_hi; q0 += NM_FA_QB) {
        const int64_t nq = q_hi - q0 < NM_FA_QB ? q_hi - q0 : NM_FA_QB;
        if (pk) {
            nm_gemm_pack16(Q + q0 * stride, stride, 1, nq < 16 ? nq : 16, hd, qp);
            nm_gemm_pack16(nq > 16 ? Q + (q0 + 16) * stride : Q, stride, 1, nq > 16 ? nq - 16 : 0, hd, qp + 16 * hd);
            for (int64_t i = 0; i < NM_FA_QB * hd; i++) qp[i] *= qs;
        } else {
            for (int64_t i = 0; i < nq; i++)
                for (int64_t d = 0; d < hd; d++) qp[i * hd + d] = Q[(q0 + i) * stride + d] * qs;
        }
        if (g16) round_f16(c, qp, pk ? NM_FA_QB * hd : nq * hd);
        if (pk) { // sc[16 j + l] = k_j . q_l, the second panel at sc + 16 T
            for (int64_t j = 0; j < T; j += NM_GEMM_XPANEL_ROWS)
                pk->gemm_pout(kr + j * ldk, ldk, T - j < NM_GEMM_XPANEL_ROWS ? T - j : NM_GEMM_XPANEL_ROWS, qp, nq, hd,
                              sc + 16 * j, 16 * T);
            const int np = nq > 16 ? 2 : 1;
            for (int p = 0; p < np; p++) {
                float *sp = sc + 16 * T * p;
                if (g16 && pk->softmax_ggml)
                    pk->softmax_ggml(sp, T, scale, nm_expf_libm_table());
                else if (g16)
                    softmax_ggml_panel(sp, T, scale);
                else
                    pk->softmax(sp, T);
            }
            if (g16) round_f16(c, sc, np * 16 * T);
            for (int64_t d = 0; d < hd; d += NM_GEMM_XPANEL_ROWS) // O[i, d] = sum_j p_ij v_j[d]
                pk->gemm(vt + d * ldv, ldv, hd - d < NM_GEMM_XPANEL_ROWS ? hd - d : NM_GEMM_XPANEL_ROWS, sc, nq, T,
                         O + q0 * stride + d, stride, NULL);
            continue;
        }
        c->gemm(kr, T, qp, nq, hd, sc, T, NULL); // sc[i * T + j] = q_i . k_j
        for (int64_t i = 0; i < nq; i++) {
            float *s = sc + i * T;
            if (g16) {
                softmax_ggml(s, T, scale);
                round_f16(c, s, T);
                continue;
            }
            float m = -INFINITY;
            for (int64_t j = 0; j < T; j++) m = s[j] > m ? s[j] : m;
            const float inv = 1.0f / c->expsum(s, T, m);
            for (int64_t j = 0; j < T; j++) s[j] *= inv;
        }
        c->gemm(vt, hd, sc, nq, T, O + q0 * stride, stride, NULL);
    }
}

// Prefill (NM_ATTN_PANEL_MIN_TOKENS tokens or more) with the AVX-512 panel
// kernels: a chunk is one head and a block of NM_FA_QB tokens. The block's
// keys [klo, khi] (every key one of its queries sees) are widened from the
// f16 cache once per chunk, K into rows, V transposed; S = K Q^T comes out in
// panel layout, is scaled (after the dot, as attn_one), softcapped, masked
// to each query's [lo, pos] (exact zeros after the softmax), and is the
// packed activations of O = V^T S^T. The same function as attn_one, summed
// in another order. The workspace is the encoders' (grown in compute).

void attn_key_range(const nm_op *op, int64_t t0, int64_t t1, int64_t *klo, int64_t *khi) {
    *klo = INT64_MAX, *khi = -1;
    for (int64_t t = t0; t < t1; t++) {
        const int64_t pos = IDS(op)[t], lo = attn_lo(op, pos);
        *klo = lo < *klo ? lo : *klo;
        *khi = pos > *khi ? pos : *khi;
    }
}

void attn_panel_worker(void *arg, int64_t chunk, int ith) {
    const attn_blocks *t = arg;
    const nm_cpu *c = t->c;
    const nm_op *op = t->op;
    const nm_gemm_panel_kernels *pk = c->pk;
    const int n_head = op->i0, n_kv = op->i1, hd = op->i2;
    const int64_t stride = (int64_t)n_kv * hd, qstride = (int64_t)n_head * hd, T = op->src0->ne[1];
    const int64_t b = t->n_blocks - 1 - chunk / n_head; // the longest blocks first
    const int h = (int)(chunk % n_head), kvh = h / (n_head / n_kv);
    const int64_t t0 = b * NM_FA_QB, nq = T - t0 < NM_FA_QB ? T - t0 : NM_FA_QB;
    int64_t klo, khi;
    attn_key_range(op, t0, t0 + nq, &klo, &khi);
    const int64_t nk = khi - klo + 1, ldv = nk + 16;
    float *qp = c->attn_ws + (size_t)ith * (size_t)c->attn_ws_floats;
    float *sc = qp + FA_R16(NM_FA_QB * hd), *vt = sc + FA_R16(NM_FA_QB * nk), *kf = vt + FA_R16(hd * ldv);
    const nm_dequant_fn widen = c->k->dequant[NM_TYPE_F16];
    const uint16_t *kc = KVK(op) + kvh * hd, *vc = KVV(op) + kvh * hd;
    for (int64_t j = 0; j < nk; j++) {
        float v[1024];
        widen(kc + (klo + j) * stride, kf + j * hd, hd);
        widen(vc + (klo + j) * stride, v, hd);
        for (int d = 0; d < hd; d++) vt[d * ldv + j] = v[d];
    }
    const float *q = (const float *)TD(op->src0) + (t0 * n_head + h) * hd;
    nm_gemm_pack16(q, qstride, 1, nq < 16 ? nq : 16, hd, qp);
    nm_gemm_pack16(nq > 16 ? q + 16 * qstride : q, qstride, 1, nq > 16 ? nq - 16 : 0, hd, qp + 16 * hd);
    for (int64_t j = 0; j < nk; j += NM_GEMM_XPANEL_ROWS)
        pk->gemm_pout(kf + j * hd, hd, nk - j < NM_GEMM_XPANEL_ROWS ? nk - j : NM_GEMM_XPANEL_ROWS, qp, nq, hd,
                      sc + 16 * j, 16 * nk);
    const float scale = op->f0, cap = op->f1;
    for (int64_t i = 0; i < nq; i++) { // lanes past nq keep their zeros: finite, and never stored
        float *s = sc + 16 * nk * (i / 16) + i % 16;
        const int64_t pos = IDS(op)[t0 + i], lo = attn_lo(op, pos);
        for (int64_t j = 0; j < nk; j++) {
            float v = s[16 * j] * scale;
            if (cap > 0.0f) v = cap * tanhf(v / cap);
            s[16 * j] = klo + j < lo || klo + j > pos ? -INFINITY : v;
        }
    }
    for (int p = 0; p < (nq > 16 ? 2 : 1); p++) pk->softmax(sc + 16 * nk * p, nk);
    float *out = (float *)TD(op->dst) + (t0 * n_head + h) * hd;
    for (int64_t d = 0; d < hd; d += NM_GEMM_XPANEL_ROWS)
        pk->gemm(vt + d * ldv, ldv, hd - d < NM_GEMM_XPANEL_ROWS ? hd - d : NM_GEMM_XPANEL_ROWS, sc, nq, nk, out + d,
                 qstride, NULL);
}

bool fa_supported(const nm_cpu *c, const nm_op *op) {
    const int64_t T = op->src0->ne[1], hd = op->i2;
    if (op->i0 <= 0 || hd <= 0 || op->src0->ne[0] != op->i0 * hd || !op->src1 || !op->src2) return false;
    if (op->src1->ne[0] != op->src0->ne[0] || op->src2->ne[0] != op->src0->ne[0] || op->src1->ne[1] != T ||
        op->src2->ne[1] != T)
        return false;
    return c->attn_ws && T <= c->attn_max_seq && hd <= c->attn_max_hd;
}
