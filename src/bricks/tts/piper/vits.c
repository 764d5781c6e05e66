// Piper's VITS on our kernels (vits.h; docs/piper.md).
#include "bricks/tts/piper/vits.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/cpu/conv1d.h"
#include "core/clock.h"
#include "backend/cpu/gemm.h"
#include "core/fail.h"
#include "gguf/gguf.h"

#define MAX_LAYERS 16
#define MAX_UPS 6
#define MAX_RES 4
#define MAX_DIL 4
#define MAX_IDS 4096

typedef struct ln {
    const float *g, *b;
} ln;

typedef struct dds { // DDSConv: depthwise dilated convolutions, each with a 1x1 and two norms
    const float *sep_w[MAX_LAYERS], *sep_b[MAX_LAYERS]; // [ch][k] as stored (depthwise: one input channel)
    nm_conv1d pw[MAX_LAYERS];
    ln n1[MAX_LAYERS], n2[MAX_LAYERS];
} dds;

typedef struct cflow { // the duration predictor's spline coupling flow
    const float *pre_w, *pre_b; // [F][1][1]
    dds convs;
    nm_conv1d proj;
} cflow;

typedef struct wn_layer {
    nm_conv1d in, rs;
} wn_layer;

typedef struct coupling {
    nm_conv1d pre, post;
    wn_layer wn[MAX_LAYERS];
} coupling;

// A HiFi-GAN convolution, run as a backend op (NM_OP_CONV1D, or NM_OP_CONV_T1D where t): PyTorch's
// weights and bias as the file has them (the backend lays the weights out its own way when a context is
// made, nm_vits_ctx_create), "same" padding (pad_l = pad_r = dil (k - 1) / 2), or the upsampling's
// stride and pad; a leaky ReLU of `slope` on the input first.
typedef struct dconv {
    nm_tensor w;         // host memory: [oc][ic][k] (ne k, ic, oc), transposed [ic][oc][k] (ne k, oc, ic)
    const float *bias;   // [oc] or NULL
    int32_t ic, oc, k, dil, stride, pad, id; // id: its place in a context's tables
    float slope;
    bool t;
} dconv;

struct nm_vits {
    nm_gguf *g;
    bool mapped;   // g maps a file (its packed weights' pages are given back); false: the caller's memory
    nm_vits_info info;
    // hyperparameters
    int32_t hidden, inter, filt, ffn_k, n_layers, n_heads, window;
    int32_t dp_filt, dp_k, dp_layers, dp_flows, dp_bins;
    int32_t n_coupling, wn_layers, wn_k;
    int32_t dec_init, dec_k, n_ups, ups_rate[MAX_UPS], ups_k[MAX_UPS], resblock, n_res, res_k[MAX_RES],
        n_dil, res_dil[MAX_RES][MAX_DIL];
    // the phoneme map: the UTF-8 strings and their ids
    nm_str *phon;
    int32_t n_phon, *phon_off, *phon_n, *phon_ids;
    // weights
    const float *emb;
    struct {
        const float *rel_k, *rel_v;
        nm_conv1d q, k, v, o, f1, f2;
        ln n1, n2;
    } enc[MAX_LAYERS];
    nm_conv1d proj;
    nm_conv1d dp_pre, dp_proj;
    dds dp_convs;
    cflow dp_flow[MAX_LAYERS];
    const float *dp_m, *dp_exp_neg_logs;
    coupling flow[MAX_LAYERS];
    dconv dec_pre, dec_post;
    dconv ups[MAX_UPS];
    dconv res[MAX_UPS][MAX_RES][2 * MAX_DIL]; // ResBlock2: [dil]; ResBlock1: convs1 [2 d], convs2 [2 d + 1]
    dconv *dec[2 + MAX_UPS * (1 + MAX_RES * 2 * MAX_DIL)]; // every one of them, by id
    int32_t n_dec;
    int64_t work1; // the most floats one thread's tile of any convolution needs
    int32_t flow_reach; // frames the coupling flow reads beyond a frame's own: its WaveNet kernels' reaches
    // the packed weights (owned)
    float **owned;
    int32_t n_owned, cap_owned;
    char err[256];
};

// ---- loading ---------------------------------------------------------------------------------

static bool bad(nm_vits *v, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool bad(nm_vits *v, const char *fmt, ...) {
    if (!v->err[0]) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(v->err, sizeof v->err, fmt, ap);
        va_end(ap);
    }
    return false;
}

// Tensor `name` of PyTorch shape d0 x d1 x d2 (0: that dimension absent), f32. NULL (err set) if not.
static const float *tensor(nm_vits *v, const char *name, int64_t d0, int64_t d1, int64_t d2) {
    const nm_gguf_tensor *t = nm_gguf_find_tensor(v->g, name);
    if (!t) {
        bad(v, "weight %s missing", name);
        return NULL;
    }
    const int64_t want_ne[3] = {d0, d1, d2};
    int nd = d2 ? 3 : d1 ? 2 : 1;
    bool ok = t->type == 0 && (int)t->n_dims == nd;
    for (int i = 0; ok && i < nd; i++) ok = t->ne[nd - 1 - i] == want_ne[i];
    if (!ok) {
        char got[96] = "", want[96] = "";
        for (int i = (int)t->n_dims - 1, k = 0; i >= 0 && k < 80; i--)
            k += snprintf(got + k, sizeof got - (size_t)k, "%s%lld", i == (int)t->n_dims - 1 ? "" : " ", (long long)t->ne[i]);
        for (int i = 0, k = 0; i < nd && k < 80; i++)
            k += snprintf(want + k, sizeof want - (size_t)k, "%s%lld", i ? " " : "", (long long)want_ne[i]);
        bad(v, "weight %s: type %u, shape [%s] (f32 [%s] expected)", name, (unsigned)t->type, got, want);
        return NULL;
    }
    return t->data;
}

static float *own(nm_vits *v, size_t n) {
    if (v->n_owned == v->cap_owned) {
        const int32_t cap = v->cap_owned ? 2 * v->cap_owned : 64;
        float **o = realloc(v->owned, sizeof *o * (size_t)cap);
        if (!o) return NULL;
        v->owned = o, v->cap_owned = cap;
    }
    float *p = malloc(sizeof(float) * n);
    if (p) v->owned[v->n_owned++] = p;
    else snprintf(v->err, sizeof v->err, "out of memory");
    return p;
}

// The file's pages of a weight that was packed (never read again) given back: the resident set holds
// the packed copy only. (Whole pages inside [p, p + n): a neighbour's pages stay.)
static void drop_pages(const void *p, size_t n) {
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), a = ((uintptr_t)p + page - 1) & ~(page - 1),
                    b = ((uintptr_t)p + n) & ~(page - 1);
    if (b > a) madvise((void *)a, b - a, MADV_DONTNEED);
}

// A convolution's weight `name`: f32 as PyTorch's [rows][cols][k], or f16 / q8_0 with a row's weights a
// row ([rows][cols k]: tools/convert_piper.py --q8); *wt its tensor (its host address in offs). False
// (err set) if it is missing or of another shape or type.
static bool conv_weight(nm_vits *v, const char *name, int32_t rows, int32_t cols, int32_t k, nm_tensor *wt) {
    const nm_gguf_tensor *gt = nm_gguf_find_tensor(v->g, name);
    if (gt && (gt->type == NM_TYPE_F16 || gt->type == NM_TYPE_Q8_0)) {
        if (gt->n_dims != 2 || gt->ne[0] != (int64_t)cols * k || gt->ne[1] != rows)
            return bad(v, "weight %s: %s of shape [%lld %lld] (%s [%d %d] expected)", name,
                       nm_type_traits_get(gt->type)->name, (long long)gt->ne[1], (long long)gt->ne[0],
                       nm_type_traits_get(gt->type)->name, (int)rows, (int)(cols * k));
        *wt = (nm_tensor){.type = gt->type, .ne = {(int64_t)cols * k, rows, 1, 1}, .offs = (size_t)(uintptr_t)gt->data};
        return true;
    }
    const float *w = tensor(v, name, rows, cols, k);
    *wt = (nm_tensor){.type = NM_TYPE_F32, .ne = {k, cols, rows, 1}, .offs = (size_t)(uintptr_t)w};
    return w != NULL;
}

// Conv1d `prefix`.weight [oc][ic][k] (packed for nm_conv1d; f16 / q8_0 widened first) and its bias (if `bias`);
// wino: the points of a Winograd tile allowed (nm_conv1d.winograd; 0 on the phonemes' short rows).
static bool conv(nm_vits *v, nm_conv1d *c, const char *prefix, int32_t oc, int32_t ic, int32_t k, int32_t dil,
                 bool bias, int32_t wino) {
    char name[160];
    nm_tensor wt;
    snprintf(name, sizeof name, "%.100s.weight", prefix);
    const bool have = conv_weight(v, name, oc, ic, k, &wt);
    snprintf(name, sizeof name, "%.100s.bias", prefix);
    const float *b = bias ? tensor(v, name, oc, 0, 0) : NULL;
    if (!have || (bias && !b)) return false;
    *c = (nm_conv1d){.bias = b, .ic = ic, .oc = oc, .k = k, .dil = dil, .in_slope = 1.0f, .winograd = wino};
    float *p = own(v, (size_t)nm_conv1d_packed_size(c));
    if (!p) return false;
    const int64_t nw = (int64_t)oc * ic * k;
    const float *w = nm_tensor_host(&wt);
    float *wide = NULL;
    if (wt.type != NM_TYPE_F32) {
        if (!(wide = malloc(sizeof(float) * (size_t)nw))) return bad(v, "out of memory");
        nm_kernels_ref()->dequant[wt.type](w, wide, nw);
        w = wide;
    }
    nm_conv1d_pack(c, w, p);
    free(wide);
    if (v->mapped) drop_pages(nm_tensor_host(&wt), nm_tensor_bytes(&wt));
    if (nm_conv1d_work(c, 1) > v->work1) v->work1 = nm_conv1d_work(c, 1);
    return true;
}

// HiFi-GAN's convolution `prefix` (transposed where t: weight [ic][oc][k]), its bias if `bias`.
static bool dec_conv(nm_vits *v, dconv *c, const char *prefix, int32_t oc, int32_t ic, int32_t k, int32_t dil,
                     bool t, bool bias, float slope) {
    char name[160];
    nm_tensor wt; // (transposed: PyTorch's [ic][oc][k])
    snprintf(name, sizeof name, "%.100s.weight", prefix);
    const bool have = t ? conv_weight(v, name, ic, oc, k, &wt) : conv_weight(v, name, oc, ic, k, &wt);
    snprintf(name, sizeof name, "%.100s.bias", prefix);
    const float *b = bias ? tensor(v, name, oc, 0, 0) : NULL;
    if (!have || (bias && !b)) return false;
    *c = (dconv){.w = wt, .bias = b, .ic = ic, .oc = oc, .k = k, .dil = dil, .t = t, .slope = slope, .id = v->n_dec};
    v->dec[v->n_dec++] = c;
    return true;
}

static bool norm(nm_vits *v, ln *n, const char *prefix, int32_t ch) {
    char name[160];
    snprintf(name, sizeof name, "%.100s.gamma", prefix);
    n->g = tensor(v, name, ch, 0, 0);
    snprintf(name, sizeof name, "%.100s.beta", prefix);
    n->b = tensor(v, name, ch, 0, 0);
    return n->g && n->b;
}

static bool ddsconv(nm_vits *v, dds *d, const char *prefix) {
    char name[160];
    for (int32_t i = 0; i < v->dp_layers; i++) {
        snprintf(name, sizeof name, "%.100s.convs_sep.%d.weight", prefix, (int)i);
        d->sep_w[i] = tensor(v, name, v->dp_filt, 1, v->dp_k);
        snprintf(name, sizeof name, "%.100s.convs_sep.%d.bias", prefix, (int)i);
        d->sep_b[i] = tensor(v, name, v->dp_filt, 0, 0);
        snprintf(name, sizeof name, "%.100s.convs_1x1.%d", prefix, (int)i);
        if (!d->sep_w[i] || !d->sep_b[i] || !conv(v, &d->pw[i], name, v->dp_filt, v->dp_filt, 1, 1, true, 0)) return false;
        snprintf(name, sizeof name, "%.100s.norms_1.%d", prefix, (int)i);
        if (!norm(v, &d->n1[i], name, v->dp_filt)) return false;
        snprintf(name, sizeof name, "%.100s.norms_2.%d", prefix, (int)i);
        if (!norm(v, &d->n2[i], name, v->dp_filt)) return false;
    }
    return true;
}

// A u32 key in lo..hi (err naming it otherwise).
static bool key(nm_vits *v, const char *k, int32_t lo, int32_t hi, int32_t *out) {
    uint32_t x = 0;
    if (!nm_gguf_get_u32(v->g, k, &x)) return bad(v, "key %s missing", k);
    if ((int64_t)x < lo || (int64_t)x > hi) return bad(v, "key %s = %ld (%ld .. %ld expected)", k, (long)x, (long)lo, (long)hi);
    *out = (int32_t)x;
    return true;
}

// An i32 array key of 1..max entries in lo..hi: its length.
static int32_t arr(nm_vits *v, const char *k, int32_t max, int32_t lo, int32_t hi, int32_t *out) {
    const nm_gguf_kv *kv = nm_gguf_find(v->g, k);
    if (!kv || kv->type != NM_GGUF_ARRAY || kv->arr_n < 1 || kv->arr_n > (uint64_t)max ||
        nm_gguf_vtype_size(kv->arr_type) == 0)
        return bad(v, "key %s missing or not an array of 1 .. %d numbers", k, (int)max), 0;
    for (uint64_t i = 0; i < kv->arr_n; i++) {
        const double x = nm_gguf_arr_num(kv, i);
        if (x < lo || x > hi || x != (double)(int32_t)x) return bad(v, "key %s: entry %ld out of %d .. %d", k, (long)i, (int)lo, (int)hi), 0;
        out[i] = (int32_t)x;
    }
    return (int32_t)kv->arr_n;
}

// The decoder's reach in frames (each layer's, at its rate, added): conv_pre, each upsampling (its taps
// in input samples) and its residual blocks (the widest: their dilated kernels' reaches added),
// conv_post; rounded up, one more. op_reach: each convolution's (by id) as a backend's prepare_op gave
// it (NULL: the direct form's, each output's sums alone).
static int32_t dec_reach(const nm_vits *v, const int32_t *op_reach) {
#define R(C) (double)(op_reach ? op_reach[(C)->id] : nm_conv_reach((C)->t ? NM_OP_CONV_T1D : NM_OP_CONV1D, (C)->k, (C)->t ? (C)->stride : (C)->dil, 0))
    double reach = R(&v->dec_pre) + R(&v->dec_post) / v->info.hop;
    for (int32_t u = 0, before = 1; u < v->n_ups; before *= v->ups_rate[u], u++) {
        reach += R(&v->ups[u]) / before;
        double widest = 0;
        for (int32_t j = 0; j < v->n_res; j++) {
            double r = 0;
            for (int32_t d = 0; d < v->n_dil * (v->resblock == 1 ? 2 : 1); d++) r += R(&v->res[u][j][d]);
            widest = r > widest ? r : widest;
        }
        reach += widest / (before * v->ups_rate[u]);
    }
#undef R
    return (int32_t)ceil(reach) + 1;
}

static bool load_keys(nm_vits *v) {
    nm_str s;
    if (!nm_gguf_get_str(v->g, "general.architecture", &s) || !nm_str_eq(s, "piper"))
        return bad(v, "not a Piper voice (general.architecture is not \"piper\": tools/convert_piper.py makes one)");
    nm_vits_info *in = &v->info;
    int32_t rate = 0;
    bool ok = key(v, "piper.sample_rate", 8000, 192000, &rate) && key(v, "piper.num_symbols", 3, 1 << 20, &in->n_symbols) &&
              key(v, "piper.hidden", 8, 4096, &v->hidden) && key(v, "piper.inter", 2, 4096, &v->inter) &&
              key(v, "piper.filter", 1, 16384, &v->filt) && key(v, "piper.ffn_kernel", 1, 31, &v->ffn_k) &&
              key(v, "piper.n_layers", 1, MAX_LAYERS, &v->n_layers) && key(v, "piper.n_heads", 1, 64, &v->n_heads) &&
              key(v, "piper.window", 0, 64, &v->window) && key(v, "piper.dp_filter", 1, 4096, &v->dp_filt) &&
              key(v, "piper.dp_kernel", 1, 31, &v->dp_k) && key(v, "piper.dp_layers", 1, MAX_LAYERS, &v->dp_layers) &&
              key(v, "piper.dp_flows", 1, MAX_LAYERS, &v->dp_flows) && key(v, "piper.dp_bins", 2, 64, &v->dp_bins) &&
              key(v, "piper.flow_layers", 1, MAX_LAYERS, &v->n_coupling) &&
              key(v, "piper.flow_wn_layers", 1, MAX_LAYERS, &v->wn_layers) &&
              key(v, "piper.flow_kernel", 1, 31, &v->wn_k) && key(v, "piper.dec_initial", 2, 8192, &v->dec_init) &&
              key(v, "piper.dec_kernel", 1, 31, &v->dec_k) && key(v, "piper.resblock", 1, 2, &v->resblock);
    if (!ok) return false;
    if (v->hidden % v->n_heads || v->inter % 2 || v->ffn_k % 2 == 0 || v->dp_k % 2 == 0 || v->wn_k % 2 == 0 ||
        v->dec_k % 2 == 0)
        return bad(v, "hyperparameters that do not fit VITS (hidden %d, heads %d, inter %d, or an even kernel)",
                   (int)v->hidden, (int)v->n_heads, (int)v->inter);
    int32_t ups_k[MAX_UPS], dil[MAX_RES * MAX_DIL];
    v->n_ups = arr(v, "piper.upsample_rates", MAX_UPS, 1, 64, v->ups_rate);
    if (!v->n_ups || arr(v, "piper.upsample_kernels", MAX_UPS, 1, 128, ups_k) != v->n_ups)
        return bad(v, "piper.upsample_kernels: not one per rate");
    memcpy(v->ups_k, ups_k, sizeof ups_k);
    v->n_res = arr(v, "piper.resblock_kernels", MAX_RES, 1, 31, v->res_k);
    const int32_t nd = v->n_res ? arr(v, "piper.resblock_dilations", MAX_RES * MAX_DIL, 1, 64, dil) : 0;
    if (!v->n_res || nd % v->n_res || nd / v->n_res > MAX_DIL)
        return bad(v, "piper.resblock_dilations: not as many for each kernel");
    v->n_dil = nd / v->n_res;
    for (int32_t j = 0; j < v->n_res; j++)
        for (int32_t d = 0; d < v->n_dil; d++) v->res_dil[j][d] = dil[j * v->n_dil + d];
    int32_t hop = 1, ch = v->dec_init;
    for (int32_t u = 0; u < v->n_ups; u++) {
        hop *= v->ups_rate[u];
        if ((v->ups_k[u] - v->ups_rate[u]) % 2 || v->ups_k[u] < v->ups_rate[u] || ch % 2)
            return bad(v, "upsampling %d: kernel %d and rate %d do not fit", (int)u, (int)v->ups_k[u], (int)v->ups_rate[u]);
        ch /= 2;
    }
    in->hop = hop; // (the reach: once the decoder's convolutions are loaded)
    in->sample_rate = rate;
    if (!nm_gguf_get_f32(v->g, "piper.noise_scale", &in->noise_scale) ||
        !nm_gguf_get_f32(v->g, "piper.length_scale", &in->length_scale) ||
        !nm_gguf_get_f32(v->g, "piper.noise_w", &in->noise_w))
        return bad(v, "key piper.noise_scale, length_scale or noise_w missing");
    if (nm_gguf_get_str(v->g, "piper.espeak.voice", &s) && s.len < sizeof in->espeak_voice)
        memcpy(in->espeak_voice, s.ptr, s.len);
    if (nm_gguf_get_str(v->g, "general.name", &s) && s.len < sizeof in->name) memcpy(in->name, s.ptr, s.len);
    // the phoneme map
    const nm_gguf_kv *ph = nm_gguf_find(v->g, "piper.phonemes");
    const nm_gguf_kv *cn = nm_gguf_find(v->g, "piper.phoneme_id_counts"), *id = nm_gguf_find(v->g, "piper.phoneme_ids");
    if (!ph || !cn || !id || ph->type != NM_GGUF_ARRAY || ph->arr_type != NM_GGUF_STRING || cn->type != NM_GGUF_ARRAY ||
        id->type != NM_GGUF_ARRAY || cn->arr_n != ph->arr_n || ph->arr_n == 0 || ph->arr_n > 65536 ||
        id->arr_n > 1 << 20 || nm_gguf_vtype_size(cn->arr_type) == 0 || nm_gguf_vtype_size(id->arr_type) == 0)
        return bad(v, "the phoneme map (piper.phonemes, phoneme_id_counts, phoneme_ids) is missing or malformed");
    v->n_phon = (int32_t)ph->arr_n;
    v->phon = calloc((size_t)v->n_phon, sizeof *v->phon);
    v->phon_off = calloc((size_t)v->n_phon, sizeof *v->phon_off);
    v->phon_n = calloc((size_t)v->n_phon, sizeof *v->phon_n);
    v->phon_ids = calloc(id->arr_n + 1, sizeof *v->phon_ids);
    if (!v->phon || !v->phon_off || !v->phon_n || !v->phon_ids || !nm_gguf_arr_strings(ph, v->phon, ph->arr_n))
        return bad(v, "out of memory");
    int64_t at = 0;
    for (int32_t i = 0; i < v->n_phon; i++) {
        const double c = nm_gguf_arr_num(cn, (uint64_t)i);
        if (c < 1 || at + (int64_t)c > (int64_t)id->arr_n) return bad(v, "the phoneme map: counts past its ids");
        v->phon_off[i] = (int32_t)at, v->phon_n[i] = (int32_t)c;
        at += (int64_t)c;
    }
    for (uint64_t i = 0; i < id->arr_n; i++) {
        const double x = nm_gguf_arr_num(id, i);
        if (x < 0 || x >= in->n_symbols) return bad(v, "the phoneme map: id %ld out of 0 .. %d", (long)x, (int)in->n_symbols - 1);
        v->phon_ids[i] = (int32_t)x;
    }
    return true;
}

static bool load_weights(nm_vits *v) {
    char p[160];
    const int32_t H = v->hidden, dh = H / v->n_heads, W = 2 * v->window + 1, F = v->dp_filt;
    if (!(v->emb = tensor(v, "enc_p.emb.weight", v->info.n_symbols, H, 0))) return false;
    for (int32_t l = 0; l < v->n_layers; l++) {
        snprintf(p, sizeof p, "enc_p.encoder.attn_layers.%d.emb_rel_k", (int)l);
        v->enc[l].rel_k = tensor(v, p, 1, W, dh);
        snprintf(p, sizeof p, "enc_p.encoder.attn_layers.%d.emb_rel_v", (int)l);
        v->enc[l].rel_v = tensor(v, p, 1, W, dh);
        if (!v->enc[l].rel_k || !v->enc[l].rel_v) return false;
        const char *qkvo[] = {"q", "k", "v", "o"};
        nm_conv1d *cs[] = {&v->enc[l].q, &v->enc[l].k, &v->enc[l].v, &v->enc[l].o};
        for (int i = 0; i < 4; i++) {
            snprintf(p, sizeof p, "enc_p.encoder.attn_layers.%d.conv_%s", (int)l, qkvo[i]);
            if (!conv(v, cs[i], p, H, H, 1, 1, true, 0)) return false;
        }
        snprintf(p, sizeof p, "enc_p.encoder.ffn_layers.%d.conv_1", (int)l);
        if (!conv(v, &v->enc[l].f1, p, v->filt, H, v->ffn_k, 1, true, 0)) return false;
        snprintf(p, sizeof p, "enc_p.encoder.ffn_layers.%d.conv_2", (int)l);
        if (!conv(v, &v->enc[l].f2, p, H, v->filt, v->ffn_k, 1, true, 0)) return false;
        snprintf(p, sizeof p, "enc_p.encoder.norm_layers_1.%d", (int)l);
        if (!norm(v, &v->enc[l].n1, p, H)) return false;
        snprintf(p, sizeof p, "enc_p.encoder.norm_layers_2.%d", (int)l);
        if (!norm(v, &v->enc[l].n2, p, H)) return false;
    }
    if (!conv(v, &v->proj, "enc_p.proj", 2 * v->inter, H, 1, 1, true, 0)) return false;
    // the duration predictor: its flows in the order the reverse pass runs them (the last first)
    if (!conv(v, &v->dp_pre, "dp.pre", F, H, 1, 1, true, 0) || !conv(v, &v->dp_proj, "dp.proj", F, F, 1, 1, true, 0) ||
        !ddsconv(v, &v->dp_convs, "dp.convs"))
        return false;
    for (int32_t f = 0; f < v->dp_flows; f++) {
        const int idx = 1 + 2 * (v->dp_flows - f); // dp.flows.7, .5, .3 (.1 is training's only)
        cflow *c = &v->dp_flow[f];
        snprintf(p, sizeof p, "dp.flows.%d.pre.weight", idx);
        c->pre_w = tensor(v, p, F, 1, 1);
        snprintf(p, sizeof p, "dp.flows.%d.pre.bias", idx);
        c->pre_b = tensor(v, p, F, 0, 0);
        if (!c->pre_w || !c->pre_b) return false;
        snprintf(p, sizeof p, "dp.flows.%d.convs", idx);
        if (!ddsconv(v, &c->convs, p)) return false;
        snprintf(p, sizeof p, "dp.flows.%d.proj", idx);
        if (!conv(v, &c->proj, p, 3 * v->dp_bins - 1, F, 1, 1, true, 0)) return false;
    }
    if (!(v->dp_m = tensor(v, "dp.flows.0.m", 2, 1, 0)) ||
        !(v->dp_exp_neg_logs = tensor(v, "dp.flows.0.exp_neg_logs", 2, 1, 0)))
        return false;
    // the coupling flow
    const int32_t half = v->inter / 2;
    for (int32_t f = 0; f < v->n_coupling; f++) {
        coupling *c = &v->flow[f];
        snprintf(p, sizeof p, "flow.flows.%d.pre", 2 * (int)f);
        if (!conv(v, &c->pre, p, H, half, 1, 1, true, 0)) return false;
        snprintf(p, sizeof p, "flow.flows.%d.post", 2 * (int)f);
        if (!conv(v, &c->post, p, half, H, 1, 1, true, 0)) return false;
        for (int32_t l = 0; l < v->wn_layers; l++) {
            snprintf(p, sizeof p, "flow.flows.%d.enc.in_layers.%d", 2 * (int)f, (int)l);
            // (the flows' WaveNet, on the frames: 8 points, as 10 cost ~6 dB of SNR against onnxruntime)
            if (!conv(v, &c->wn[l].in, p, 2 * H, H, v->wn_k, 1, true, 8)) return false;
            snprintf(p, sizeof p, "flow.flows.%d.enc.res_skip_layers.%d", 2 * (int)f, (int)l);
            if (!conv(v, &c->wn[l].rs, p, l + 1 < v->wn_layers ? 2 * H : H, H, 1, 1, true, 0)) return false;
        }
    }
    // (dilation 1: the converter checks it; the WaveNet convolutions' reach as packed here, for this CPU)
    v->flow_reach = v->n_coupling * v->wn_layers * nm_conv_reach(NM_OP_CONV1D, v->wn_k, 1, v->flow[0].wn[0].in.wm);
    // HiFi-GAN (its leaky ReLUs are the convolutions' input slopes: 0.1 before each upsampling and each
    // residual convolution, F.leaky_relu's default 0.01 before the last)
    if (!dec_conv(v, &v->dec_pre, "dec.conv_pre", v->dec_init, v->inter, v->dec_k, 1, false, true, 1.0f)) return false;
    int32_t ch = v->dec_init;
    for (int32_t u = 0; u < v->n_ups; u++) {
        snprintf(p, sizeof p, "dec.ups.%d", (int)u);
        if (!dec_conv(v, &v->ups[u], p, ch / 2, ch, v->ups_k[u], 1, true, true, 0.1f)) return false;
        v->ups[u].stride = v->ups_rate[u], v->ups[u].pad = (v->ups_k[u] - v->ups_rate[u]) / 2;
        ch /= 2;
        for (int32_t j = 0; j < v->n_res; j++)
            for (int32_t d = 0; d < v->n_dil; d++) {
                const int blk = (int)(u * v->n_res + j);
                if (v->resblock == 2) {
                    snprintf(p, sizeof p, "dec.resblocks.%d.convs.%d", blk, (int)d);
                    if (!dec_conv(v, &v->res[u][j][d], p, ch, ch, v->res_k[j], v->res_dil[j][d], false, true, 0.1f))
                        return false;
                } else {
                    snprintf(p, sizeof p, "dec.resblocks.%d.convs1.%d", blk, (int)d);
                    if (!dec_conv(v, &v->res[u][j][2 * d], p, ch, ch, v->res_k[j], v->res_dil[j][d], false, true, 0.1f))
                        return false;
                    snprintf(p, sizeof p, "dec.resblocks.%d.convs2.%d", blk, (int)d);
                    if (!dec_conv(v, &v->res[u][j][2 * d + 1], p, ch, ch, v->res_k[j], 1, false, true, 0.1f)) return false;
                }
            }
    }
    if (!dec_conv(v, &v->dec_post, "dec.conv_post", 1, ch, v->dec_k, 1, false, false, 0.01f)) return false;
    v->info.reach = dec_reach(v, NULL);
    return true;
}

// The voice of an opened GGUF (path: its name in messages, NULL for memory).
static nm_status load(const char *path, const void *buf, size_t size, nm_vits **out, char *err, size_t err_size) {
    if (!out) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "piper: no place for the voice");
    *out = NULL;
    nm_vits *v = calloc(1, sizeof *v);
    if (!v) return nm_fail(NM_ERR_NOMEM, err, err_size, "piper: out of memory");
    nm_status st = path ? nm_gguf_open(path, &v->g, err, err_size) : nm_gguf_open_memory(buf, size, &v->g, err, err_size);
    if (st != NM_OK) {
        free(v);
        return st;
    }
    v->mapped = path != NULL;
    if (!load_keys(v) || !load_weights(v)) {
        st = !strcmp(v->err, "out of memory") ? NM_ERR_NOMEM : NM_ERR_FORMAT;
        nm_fail(st, err, err_size, "%s: %s", path ? path : "the voice", v->err);
        nm_vits_free(v);
        return st;
    }
    *out = v;
    return NM_OK;
}

nm_status nm_vits_load(const char *path, nm_vits **out, char *err, size_t err_size) {
    if (!path) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "piper: no voice file");
    return load(path, NULL, 0, out, err, err_size);
}

nm_status nm_vits_load_memory(const void *buf, size_t size, nm_vits **out, char *err, size_t err_size) {
    if (!buf) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "piper: no voice bytes");
    return load(NULL, buf, size, out, err, err_size);
}

void nm_vits_free(nm_vits *v) {
    if (!v) return;
    for (int32_t i = 0; i < v->n_owned; i++) free(v->owned[i]);
    free(v->owned);
    free(v->phon), free(v->phon_off), free(v->phon_n), free(v->phon_ids);
    nm_gguf_close(v->g);
    free(v);
}

const nm_vits_info *nm_vits_get_info(const nm_vits *v) { return &v->info; }

void nm_vits_cost(const nm_vits *v, double seconds, double *flops, double *dec_flops, uint64_t *weight_bytes) {
    const double frames = seconds * v->info.sample_rate / v->info.hop, ids = frames / 2.3;
    const double H = v->hidden, I = v->inter;
    // HiFi-GAN: conv_pre at the frame rate; each upsampling 2 ic oc k a sample in; its blocks' and conv_post
    // at the rate after it
    double dec = 2 * I * v->dec_init * v->dec_k * frames, rate = frames, ch = v->dec_init;
    for (int32_t u = 0; u < v->n_ups; u++) {
        dec += 2 * ch * (ch / 2) * v->ups_k[u] * rate;
        rate *= v->ups_rate[u], ch /= 2;
        for (int32_t j = 0; j < v->n_res; j++)
            dec += 2 * ch * ch * v->res_k[j] * rate * v->n_dil * (v->resblock == 1 ? 2 : 1);
    }
    dec += 2 * ch * v->dec_k * rate;
    // the flow at the frame rate; the text encoder and the duration predictor per id
    const double flow = v->n_coupling * frames * (2 * 2 * (I / 2) * H + v->wn_layers * (2 * H * 2 * H * v->wn_k + 2 * H * 2 * H));
    const double enc = ids * (v->n_layers * (8 * H * H + 4 * H * v->filt * v->ffn_k + 4 * ids * H) + 4 * H * I +
                              2.0 * v->dp_filt * v->dp_filt * (v->dp_layers * 2 + 2) * (v->dp_flows + 1));
    *dec_flops = dec;
    *flops = dec + flow + enc;
    uint64_t wb = 0;
    for (int64_t i = 0; i < nm_gguf_n_tensors(v->g); i++) {
        const nm_gguf_tensor *t = nm_gguf_tensor_at(v->g, i);
        uint64_t rows = 1;
        for (uint32_t d = 1; d < t->n_dims; d++) rows *= (uint64_t)t->ne[d];
        wb += nm_row_size(t->type, t->ne[0]) * rows;
    }
    *weight_bytes = wb;
}

int32_t nm_vits_phoneme_ids(const nm_vits *v, const char *ph, size_t len, int32_t *ids, int32_t cap) {
    for (int32_t i = 0; i < v->n_phon; i++) {
        if (v->phon[i].len != len || memcmp(v->phon[i].ptr, ph, len)) continue;
        for (int32_t k = 0; k < v->phon_n[i] && k < cap; k++) ids[k] = v->phon_ids[v->phon_off[i] + k];
        return v->phon_n[i];
    }
    return 0;
}

// ---- a synthesis's threads and scratch ---------------------------------------------------------

struct nm_vits_ctx {
    const nm_vits *v; // the voice it was made for
    nm_pool *pool;    // NULL: one thread
    int nth;
    float *buf[10]; // 64-byte aligned, grown as needed
    int64_t cap[10];
    // HiFi-GAN on the backend: the biases in its memory (bias[id]); its activations in dbuf, 6 regions
    // of dcap floats and the input's (din floats); the op list and its tensors, rebuilt each call
    nm_backend *be;
    nm_buffer *bbuf, *dbuf;
    nm_tensor *bias;
    int64_t dcap, din;
    nm_op *ops;
    nm_tensor *ts;
    int32_t max_ops;
    int32_t dec_reach; // the decoder's reach (dec_reach) from its convolutions' as this context's backend gave them
    nm_vits_phases ph; // the time its syntheses took, by phase
};

// The op of HiFi-GAN's convolution c on x (n frames) into y (tensors ts[0..4): x, y, the adds; *ts set
// by the caller but for the shapes), the sums plus a and b (NULL: none), times scale. Returns the frames out.
static int64_t dec_op(const nm_vits_ctx *cx, const dconv *c, nm_tensor *ts, int64_t n, int64_t org, const nm_tensor *a,
                      const nm_tensor *b, float scale, nm_op *op) {
    const int32_t pad = c->t ? c->pad : c->dil * (c->k - 1) / 2;
    const int64_t n_out = c->t ? (n - 1) * c->stride - 2 * pad + c->k : n + 2 * pad - (int64_t)c->dil * (c->k - 1);
    ts[0].type = ts[1].type = NM_TYPE_F32;
    ts[0].ne[0] = c->ic, ts[0].ne[1] = n, ts[0].ne[2] = ts[0].ne[3] = 1;
    ts[1].ne[0] = c->oc, ts[1].ne[1] = n_out, ts[1].ne[2] = ts[1].ne[3] = 1;
    *op = (nm_op){.kind = c->t ? NM_OP_CONV_T1D : NM_OP_CONV1D, .src0 = &ts[0], .src1 = &c->w,
                  .src2 = c->bias ? &cx->bias[c->id] : NULL, .dst = &ts[1], .f0 = c->slope, .f1 = scale,
                  .i0 = c->t ? c->stride : c->dil, .i1 = pad, .i2 = c->t ? 0 : pad,
                  .i3 = (int32_t)org}; // (< 2^31: an utterance is at most 10 minutes of samples)
    for (int i = 0; i < 2; i++) {
        const nm_tensor *add = i ? b : a;
        if (!add) continue;
        ts[2 + i] = *add;
        ts[2 + i].ne[0] = c->oc, ts[2 + i].ne[1] = n_out;
        op->add[i] = &ts[2 + i];
    }
    return n_out;
}

nm_status nm_vits_ctx_create(const nm_vits *v, const char *device, int n_threads, nm_vits_ctx **out, char *err,
                             size_t err_size) {
    if (!out) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "piper: no place for the context");
    *out = NULL;
    if (!v) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "piper: no voice for the context");
    nm_vits_ctx *c = calloc(1, sizeof *c);
    if (!c) return nm_fail(NM_ERR_NOMEM, err, err_size, "piper: out of memory");
    c->v = v;
    c->nth = n_threads > 0 ? n_threads : nm_cpu_count();
    if (c->nth > 1 && !(c->pool = nm_pool_create(c->nth))) c->nth = 1;
    const nm_backend_params bp = {.n_threads = c->nth, .max_row = 1, .max_tokens = 1};
    char why[256] = "";
    nm_status st = nm_backend_create(device ? device : "cpu", &bp, &c->be, why, sizeof why);
    if (st != NM_OK) {
        nm_vits_ctx_free(c);
        return nm_fail(st, err, err_size, "piper: device %s: %s", device ? device : "cpu", why);
    }
    c->max_ops = 3 + v->n_ups * (1 + v->n_res * v->n_dil * 2);
    c->ops = calloc((size_t)c->max_ops, sizeof *c->ops);
    c->ts = calloc((size_t)c->max_ops * 4, sizeof *c->ts);
    c->bias = calloc((size_t)v->n_dec, sizeof *c->bias);
    int64_t nb = 0;
    for (int32_t i = 0; i < v->n_dec; i++) nb += v->dec[i]->bias ? v->dec[i]->oc : 0;
    if (!c->ops || !c->ts || !c->bias || !(c->bbuf = nm_backend_buffer_alloc(c->be, sizeof(float) * (size_t)(nb + 1)))) {
        nm_vits_ctx_free(c);
        return nm_fail(NM_ERR_NOMEM, err, err_size, "piper: out of memory for a context on %s", device ? device : "cpu");
    }
    // the biases into the backend's memory; each convolution's weights laid out the backend's way (its
    // op on one frame: the shapes are what it checks); where it keeps a copy, the file's pages go back
    int64_t at = 0;
    int32_t reach[sizeof v->dec / sizeof v->dec[0]]; // each one's, as the backend places its sums
    for (int32_t i = 0; i < v->n_dec && st == NM_OK; i++) {
        const dconv *d = v->dec[i];
        if (d->bias) {
            c->bias[i] = (nm_tensor){.type = NM_TYPE_F32, .ne = {d->oc, 1, 1, 1}, .buf = c->bbuf, .offs = sizeof(float) * (size_t)at};
            st = nm_backend_tensor_set(c->be, &c->bias[i], 0, d->bias, sizeof(float) * (size_t)d->oc);
            at += d->oc;
        }
        const nm_tensor none = {.type = NM_TYPE_F32, .offs = 64};
        nm_tensor ts[4] = {none, none, none, none};
        nm_op op;
        dec_op(c, d, ts, 1, 0, NULL, NULL, 1.0f, &op);
        nm_op_prep prep = {0};
        if (st == NM_OK) st = nm_backend_prepare_op(c->be, &op, &prep);
        if (st == NM_OK && prep.copied && v->mapped)
            drop_pages(nm_tensor_host(&d->w), nm_tensor_bytes(&d->w));
        reach[i] = prep.reach;
    }
    if (st == NM_OK) c->dec_reach = dec_reach(v, reach);
    if (st != NM_OK) {
        nm_fail(st, err, err_size, "piper: HiFi-GAN on %s: %s", nm_backend_name(c->be), nm_backend_last_error(c->be));
        nm_vits_ctx_free(c);
        return st;
    }
    *out = c;
    return NM_OK;
}

void nm_vits_ctx_free(nm_vits_ctx *c) {
    if (!c) return;
    for (int i = 0; i < 10; i++) free(c->buf[i]);
    nm_pool_free(c->pool);
    if (c->be) {
        if (c->bbuf) nm_backend_buffer_free(c->be, c->bbuf);
        if (c->dbuf) nm_backend_buffer_free(c->be, c->dbuf);
        nm_backend_free(c->be);
    }
    free(c->ops), free(c->ts), free(c->bias);
    free(c);
}

const char *nm_vits_ctx_device(const nm_vits_ctx *c) { return c && c->be ? nm_backend_name(c->be) : "cpu"; }

int nm_vits_ctx_threads(const nm_vits_ctx *c) { return c ? c->nth : 1; }

int32_t nm_vits_ctx_reach(const nm_vits_ctx *c) { return c ? c->dec_reach : 0; }
void nm_vits_ctx_phases(const nm_vits_ctx *c, nm_vits_phases *out) { *out = c ? c->ph : (nm_vits_phases){0}; }

// Buffer i of at least n floats (its contents not kept when it grows).
static float *grow(nm_vits_ctx *c, int i, int64_t n) {
    if (n <= c->cap[i]) return c->buf[i];
    free(c->buf[i]);
    const int64_t cap = (n + 4095) & ~(int64_t)4095;
    c->buf[i] = aligned_alloc(64, sizeof(float) * (size_t)cap);
    c->cap[i] = c->buf[i] ? cap : 0;
    return c->buf[i];
}

// ---- the pieces of the forward pass -------------------------------------------------------------

// LayerNorm over each step's ch channels, in place (eps 1e-5, as VITS's).
static void layer_norm(float *x, int64_t n, int32_t ch, const ln *p) {
    for (int64_t t = 0; t < n; t++) {
        float *r = x + t * ch;
        double s = 0, s2 = 0;
        for (int32_t c = 0; c < ch; c++) s += r[c];
        const float mean = (float)(s / ch);
        for (int32_t c = 0; c < ch; c++) s2 += (double)(r[c] - mean) * (r[c] - mean);
        const float inv = 1.0f / sqrtf((float)(s2 / ch) + 1e-5f);
        for (int32_t c = 0; c < ch; c++) r[c] = (r[c] - mean) * inv * p->g[c] + p->b[c];
    }
}

static float gelu(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); }


// Scratch of one synthesis: floats, carved in turn (freed together).
typedef struct arena {
    float *base;
    size_t used, cap;
} arena;

static float *take(arena *a, int64_t n) {
    const size_t k = ((size_t)n + 15) & ~(size_t)15;
    if (a->used + k > a->cap) return NULL;
    float *p = a->base + a->used;
    a->used += k;
    return p;
}

// Multi-head self-attention with relative positions (a window each side, its
// embeddings shared by the heads), x [n][H] -> y [n][H] (before conv_o), as
// products on the convolutions' row kernel: per head, the keys and the 2W + 1
// relative key embeddings side by side as one weight [dh][n + 2W + 1] (each
// query's scores and its relative scores in one pass), and the values with the
// relative value embeddings below them as [n + 2W + 1][dh] (each query's
// probabilities, then its band of them by relative position, in one pass).
// Blocks of ATT_ROWS queries of a head are the pool's chunks.
#define ATT_ROWS NM_CONV_ROWS // (the kernel reads no row past a block of these)

typedef struct att_job {
    const nm_vits *v;
    const float *q;
    float *y, *kt, *vs, *work; // kt, vs: per head; work: per thread, att_work's
    int64_t n, blocks;
    nm_conv_rows_fn kern;
} att_job;

static int32_t up16(int32_t n) { return (n + 15) & ~15; }
static int64_t att_work(const nm_vits *v, int64_t n) { return ATT_ROWS * (v->hidden / v->n_heads + n + 2 * v->window + 1); }

static void att_block(void *arg, int64_t chunk, int ith) {
    const att_job *J = arg;
    const nm_vits *v = J->v;
    const int32_t H = v->hidden, dh = H / v->n_heads, W = v->window, R = 2 * W + 1, h = (int32_t)(chunk / J->blocks);
    const int64_t n = J->n, NR = n + R, i0 = (chunk % J->blocks) * ATT_ROWS, m = n - i0 < ATT_ROWS ? n - i0 : ATT_ROWS;
    const float scale = 1.0f / sqrtf((float)dh);
    float *qs = J->work + ith * att_work(v, n), *sp = qs + ATT_ROWS * dh; // qs [ATT_ROWS][dh], sp [ATT_ROWS][NR]
    for (int64_t i = 0; i < ATT_ROWS; i++)
        for (int32_t d = 0; d < dh; d++) qs[i * dh + d] = i < m ? J->q[(i0 + i) * H + h * dh + d] * scale : 0.0f;
    J->kern(qs, 0, J->kt + (int64_t)h * dh * up16((int32_t)NR), 0, 1, dh, (int32_t)NR, up16((int32_t)NR), NULL, m, NULL,
            sp, NR);
    for (int64_t i = 0; i < m; i++) {
        float *s = sp + i * NR, *band = s + n;
        const int64_t gi = i0 + i;
        float mx = -INFINITY;
        for (int64_t j = 0; j < n; j++) {
            const int64_t r = j - gi;
            if (r >= -W && r <= W) s[j] += band[r + W]; // (the keys' relative embedding)
            if (s[j] > mx) mx = s[j];
        }
        double sum = 0;
        for (int64_t j = 0; j < n; j++) sum += (s[j] = expf(s[j] - mx));
        const float inv = (float)(1.0 / sum);
        for (int64_t j = 0; j < n; j++) s[j] *= inv;
        for (int32_t r = -W; r <= W; r++) band[r + W] = gi + r >= 0 && gi + r < n ? s[gi + r] : 0.0f;
    }
    for (int64_t i = m; i < ATT_ROWS; i++) memset(sp + i * NR, 0, sizeof(float) * (size_t)NR);
    J->kern(sp, 0, J->vs + (int64_t)h * NR * up16(dh), 0, 1, (int32_t)NR, dh, up16(dh), NULL, m, NULL,
            J->y + i0 * H + h * dh, H);
}

// kv: the heads' packed keys and values, v->n_heads * att_kv(v, n) floats; work: nth * att_work(v, n).
static int64_t att_kv(const nm_vits *v, int64_t n) {
    const int32_t dh = v->hidden / v->n_heads, NR = (int32_t)n + 2 * v->window + 1;
    return (int64_t)dh * up16(NR) + (int64_t)NR * up16(dh);
}

static void attention(const nm_vits *v, int l, const float *q, const float *k, const float *val, int64_t n, float *y,
                      float *kv, float *work, nm_pool *pool) {
    const int32_t H = v->hidden, dh = H / v->n_heads, W = v->window, R = 2 * W + 1, NR = (int32_t)n + R;
    const int32_t ocs = up16(NR), ocv = up16(dh);
    float *kt = kv, *vs = kv + (int64_t)v->n_heads * dh * ocs;
    for (int32_t h = 0; h < v->n_heads; h++) {
        float *kh = kt + (int64_t)h * dh * ocs, *vh = vs + (int64_t)h * NR * ocv;
        for (int32_t d = 0; d < dh; d++) {
            float *row = kh + (int64_t)d * ocs;
            for (int64_t j = 0; j < n; j++) row[j] = k[j * H + h * dh + d];
            for (int32_t r = 0; r < R; r++) row[n + r] = v->enc[l].rel_k[r * dh + d];
            for (int32_t j = NR; j < ocs; j++) row[j] = 0.0f;
        }
        for (int32_t j = 0; j < NR; j++) {
            const float *src = j < n ? val + (int64_t)j * H + h * dh : v->enc[l].rel_v + (int64_t)(j - n) * dh;
            memcpy(vh + (int64_t)j * ocv, src, sizeof(float) * (size_t)dh);
            for (int32_t d = dh; d < ocv; d++) vh[(int64_t)j * ocv + d] = 0.0f;
        }
    }
    att_job J = {.v = v, .q = q, .y = y, .kt = kt, .vs = vs, .work = work, .n = n,
                 .blocks = (n + ATT_ROWS - 1) / ATT_ROWS, .kern = nm_conv_rows_get()};
    const int64_t chunks = J.blocks * v->n_heads;
    if (pool && chunks > 1) nm_pool_run(pool, att_block, &J, chunks);
    else
        for (int64_t c = 0; c < chunks; c++) att_block(&J, c, 0);
}

// A DDSConv layer's elementwise halves, over chunks of DDS_ROWS steps on the pool: before its 1x1, the
// depthwise convolution of x (g added first where given), its norm and GELU into y; after it, z's norm
// and GELU added to x.
#define DDS_ROWS 16
typedef struct dds_job {
    const nm_vits *v;
    const dds *d;
    int32_t l, dil, pad;
    float *x, *y, *z;
    const float *g;
    int64_t n;
} dds_job;

static void dds_before(void *arg, int64_t chunk, int ith) {
    const dds_job *J = arg;
    (void)ith;
    const int32_t F = J->v->dp_filt, K = J->v->dp_k, l = J->l;
    const int64_t t0 = chunk * DDS_ROWS, t1 = t0 + DDS_ROWS < J->n ? t0 + DDS_ROWS : J->n;
    for (int64_t t = t0; t < t1; t++) {
        for (int32_t c = 0; c < F; c++) {
            float acc = J->d->sep_b[l][c];
            for (int32_t j = 0; j < K; j++) {
                const int64_t s = t + (int64_t)j * J->dil - J->pad;
                if (s >= 0 && s < J->n) acc += J->d->sep_w[l][c * K + j] * J->x[s * F + c];
            }
            J->y[t * F + c] = acc;
        }
        layer_norm(J->y + t * F, 1, F, &J->d->n1[l]);
        for (int32_t c = 0; c < F; c++) J->y[t * F + c] = gelu(J->y[t * F + c]);
    }
}

static void dds_after(void *arg, int64_t chunk, int ith) {
    const dds_job *J = arg;
    (void)ith;
    const int32_t F = J->v->dp_filt;
    const int64_t t0 = chunk * DDS_ROWS, t1 = t0 + DDS_ROWS < J->n ? t0 + DDS_ROWS : J->n;
    layer_norm(J->z + t0 * F, t1 - t0, F, &J->d->n2[J->l]);
    for (int64_t i = t0 * F; i < t1 * F; i++) J->x[i] += gelu(J->z[i]);
}

static void dds_add_g(void *arg, int64_t chunk, int ith) {
    const dds_job *J = arg;
    (void)ith;
    const int32_t F = J->v->dp_filt;
    const int64_t t0 = chunk * DDS_ROWS, t1 = t0 + DDS_ROWS < J->n ? t0 + DDS_ROWS : J->n;
    for (int64_t i = t0 * F; i < t1 * F; i++) J->x[i] += J->g[i];
}

static void on_pool(nm_pool *pool, nm_pool_fn fn, void *arg, int64_t chunks) {
    if (pool && chunks > 1) nm_pool_run(pool, fn, arg, chunks);
    else
        for (int64_t c = 0; c < chunks; c++) fn(arg, c, 0);
}

// DDSConv over x [n][F] in place (g added first where given).
static void dds_run(const nm_vits *v, const dds *d, float *x, const float *g, int64_t n, float *y, float *z,
                    float *W, nm_pool *pool) {
    const int32_t K = v->dp_k;
    const int64_t chunks = (n + DDS_ROWS - 1) / DDS_ROWS; // (the depthwise convolutions read the layer's x whole)
    dds_job J = {.v = v, .d = d, .x = x, .y = y, .z = z, .g = g, .n = n};
    if (g) on_pool(pool, dds_add_g, &J, chunks);
    int32_t dil = 1;
    for (int32_t l = 0; l < v->dp_layers; l++, dil *= K) {
        J.l = l, J.dil = dil, J.pad = (K * dil - dil) / 2;
        on_pool(pool, dds_before, &J, chunks);
        nm_conv1d_run(&d->pw[l], y, n, 0, 0, 0, NULL, z, W, pool);
        on_pool(pool, dds_after, &J, chunks);
    }
}

// The rational-quadratic spline's inverse (tails linear beyond +-bound) for one value.
static float spline_inverse(float x, const float *uw, const float *uh, const float *ud, int32_t nb, float bound,
                            float sqrt_f) {
    if (x < -bound || x > bound) return x;
    const float minw = 1e-3f, minh = 1e-3f, mind = 1e-3f;
    float w[64], h[64], cw[65], ch[65], d[65];
    float mx = -INFINITY, s = 0;
    for (int32_t i = 0; i < nb; i++) mx = fmaxf(mx, uw[i] / sqrt_f);
    for (int32_t i = 0; i < nb; i++) s += (w[i] = expf(uw[i] / sqrt_f - mx));
    for (int32_t i = 0; i < nb; i++) w[i] = minw + (1 - minw * nb) * (w[i] / s);
    mx = -INFINITY, s = 0;
    for (int32_t i = 0; i < nb; i++) mx = fmaxf(mx, uh[i] / sqrt_f);
    for (int32_t i = 0; i < nb; i++) s += (h[i] = expf(uh[i] / sqrt_f - mx));
    for (int32_t i = 0; i < nb; i++) h[i] = minh + (1 - minh * nb) * (h[i] / s);
    cw[0] = ch[0] = 0;
    for (int32_t i = 0; i < nb; i++) cw[i + 1] = cw[i] + w[i], ch[i + 1] = ch[i] + h[i];
    for (int32_t i = 0; i <= nb; i++) cw[i] = 2 * bound * cw[i] - bound, ch[i] = 2 * bound * ch[i] - bound;
    cw[0] = ch[0] = -bound, cw[nb] = ch[nb] = bound;
    const float tail = logf(expf(1 - mind) - 1); // the linear tails' derivative: 1
    for (int32_t i = 0; i <= nb; i++) {
        const float u = i == 0 || i == nb ? tail : ud[i - 1];
        d[i] = mind + (u > 20 ? u : log1pf(expf(u)));
    }
    int32_t b = 0; // the bin: the heights' edges at or below x (the last edge nudged up by 1e-6)
    for (int32_t i = 0; i <= nb; i++) b += x >= (i == nb ? ch[i] + 1e-6f : ch[i]);
    b = b - 1 < 0 ? 0 : b - 1 > nb - 1 ? nb - 1 : b - 1;
    const float bw = cw[b + 1] - cw[b], bh = ch[b + 1] - ch[b], delta = bh / bw;
    const float d0 = d[b], d1 = d[b + 1], dx = x - ch[b];
    const float a = dx * (d0 + d1 - 2 * delta) + bh * (delta - d0);
    const float bb = bh * d0 - dx * (d0 + d1 - 2 * delta);
    const float c = -delta * dx;
    const float disc = fmaxf(bb * bb - 4 * a * c, 0.0f);
    const float root = (2 * c) / (-bb - sqrtf(disc));
    return root * bw + cw[b];
}

// A standard normal draw (xorshift64* and Box-Muller).
typedef struct rng {
    uint64_t s;
    bool have;
    float spare;
} rng;

// out[0 .. n) = the next n standard normal draws of r, as drawn one at a time (a draw pair's uniforms
// from the generator in order; Box-Muller's cosine, then its sine, which a next call starts with where n
// ends between them), their transcendentals on the pool (u: room for 2 RN_PAIRS doubles).
#define RN_PAIRS 4096
typedef struct rn_job {
    const double *u;
    float *out;
    int64_t pairs;
} rn_job;
static void rn_block(void *arg, int64_t chunk, int ith) {
    const rn_job *J = arg;
    (void)ith;
    const int64_t j1 = (chunk + 1) * 256 < J->pairs ? (chunk + 1) * 256 : J->pairs;
    for (int64_t j = chunk * 256; j < j1; j++) {
        const double m = sqrt(-2.0 * log(J->u[2 * j])), a = 6.283185307179586 * J->u[2 * j + 1];
        J->out[2 * j] = (float)(m * cos(a)), J->out[2 * j + 1] = (float)(m * sin(a));
    }
}
static void randn_fill(rng *r, float *out, int64_t n, double *u, nm_pool *pool) {
    int64_t i = 0;
    if (r->have && n > 0) out[i++] = r->spare, r->have = false;
    float last[2];
    while (i < n) {
        const int64_t pairs = (n - i + 1) / 2 < RN_PAIRS ? (n - i + 1) / 2 : RN_PAIRS;
        for (int64_t j = 0; j < 2 * pairs; j++) {
            r->s ^= r->s >> 12, r->s ^= r->s << 25, r->s ^= r->s >> 27;
            u[j] = ((double)((r->s * 0x2545F4914F6CDD1Dull) >> 11) + 0.5) / 9007199254740992.0;
        }
        const bool odd = i + 2 * pairs > n; // (the last pair's sine is the next call's first draw)
        rn_job J = {.u = u, .out = out + i, .pairs = pairs - odd};
        on_pool(pool, rn_block, &J, (J.pairs + 255) / 256);
        if (odd) {
            J = (rn_job){.u = u + 2 * (pairs - 1), .out = last, .pairs = 1};
            rn_block(&J, 0, 0);
            out[n - 1] = last[0], r->spare = last[1], r->have = true;
        }
        i += 2 * pairs - odd;
    }
}

static rng rng_seeded(uint64_t seed) {
    rng r = {.s = seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull};
    if (!r.s) r.s = 1;
    return r;
}

nm_status nm_vits_normals(uint64_t seed, const int64_t *counts, int n_counts, float *out, nm_pool *pool) {
    double *u = malloc(sizeof(double) * 2 * RN_PAIRS);
    if (!u) return NM_ERR_NOMEM;
    rng r = rng_seeded(seed);
    for (int i = 0; i < n_counts; out += counts[i], i++) randn_fill(&r, out, counts[i], u, pool);
    free(u);
    return NM_OK;
}

// ---- the synthesis ------------------------------------------------------------------------------

// The coupling flow in reverse, in place on z [frames][inter] (buffers 1 .. 4 of cx its own). False: out
// of memory.
// A WaveNet layer's elementwise halves over chunks of WN_ROWS frames on the pool: the gate tanh(a) *
// sigmoid(b) of the input convolution's [frames][2 H] into x0 ([frames][H]); then the residual and skip
// halves of res_skip's output added to hh and out (the last layer's: all skip).
#define WN_ROWS 64
typedef struct wn_job {
    int32_t H;
    const float *xin;
    float *x0, *hh, *out;
    int64_t n;
    const nm_gemm_panel_kernels *pk;
    bool last;
} wn_job;

static void wn_gate(void *arg, int64_t chunk, int ith) {
    const wn_job *J = arg;
    (void)ith;
    const int32_t H = J->H;
    const int64_t t1 = (chunk + 1) * WN_ROWS < J->n ? (chunk + 1) * WN_ROWS : J->n;
    for (int64_t t = chunk * WN_ROWS; t < t1; t++) {
        const float *row = J->xin + t * 2 * H;
        if (J->pk) J->pk->gate(row, row + H, J->x0 + t * H, H);
        else
            for (int32_t ch = 0; ch < H; ch++) J->x0[t * H + ch] = tanhf(row[ch]) * (1.0f / (1.0f + expf(-row[H + ch])));
    }
}

static void wn_sums(void *arg, int64_t chunk, int ith) {
    const wn_job *J = arg;
    (void)ith;
    const int32_t H = J->H;
    const int64_t t1 = (chunk + 1) * WN_ROWS < J->n ? (chunk + 1) * WN_ROWS : J->n;
    for (int64_t t = chunk * WN_ROWS; t < t1; t++)
        for (int32_t ch = 0; ch < H; ch++) {
            if (J->last) {
                J->out[t * H + ch] += J->xin[t * H + ch];
            } else {
                J->hh[t * H + ch] += J->xin[t * 2 * H + ch];
                J->out[t * H + ch] += J->xin[t * 2 * H + H + ch];
            }
        }
}

// The coupling flow in reverse over zf [n_frames][inter], in place; org: zf's first frame's index in the
// sentence (Winograd's tiles placed as the whole sentence's).
static bool flow_rev(const nm_vits *v, nm_vits_ctx *cx, float *zf, int64_t n_frames, int64_t org, float *W) {
    nm_pool *pool = cx->pool;
    const nm_gemm_panel_kernels *pk = nm_gemm_panel_get();
    const int32_t H = v->hidden, I = v->inter;
    float *B[5];
    for (int i = 1; i < 5; i++)
        if (!(B[i] = grow(cx, i, n_frames * 2 * (H > I ? H : I) + 16))) return false;
    const int32_t half = I / 2;
    for (int32_t fl = v->n_coupling - 1; fl >= 0; fl--) {
        for (int64_t t = 0; t < n_frames; t++) // Flip: the channels reversed
            for (int32_t c = 0; c < I / 2; c++) {
                const float a = zf[t * I + c];
                zf[t * I + c] = zf[t * I + I - 1 - c], zf[t * I + I - 1 - c] = a;
            }
        const coupling *c = &v->flow[fl];
        float *x0 = B[1], *hh = B[2], *xin = B[3], *out = B[4];
        for (int64_t t = 0; t < n_frames; t++) memcpy(x0 + t * half, zf + t * I, sizeof(float) * (size_t)half);
        nm_conv1d_run(&c->pre, x0, n_frames, 0, 0, 0, NULL, hh, W, pool);
        memset(out, 0, sizeof(float) * (size_t)(n_frames * H));
        for (int32_t l = 0; l < v->wn_layers; l++) {
            nm_conv1d_run(&c->wn[l].in, hh, n_frames, (v->wn_k - 1) / 2, (v->wn_k - 1) / 2, org, NULL, xin, W, pool);
            wn_job J = {.H = H, .xin = xin, .x0 = x0, .hh = hh, .out = out, .n = n_frames, .pk = pk,
                        .last = l + 1 == v->wn_layers};
            on_pool(pool, wn_gate, &J, (n_frames + WN_ROWS - 1) / WN_ROWS); // tanh(a) * sigmoid(b) into x0
            nm_conv1d_run(&c->wn[l].rs, x0, n_frames, 0, 0, 0, NULL, xin, W, pool);
            on_pool(pool, wn_sums, &J, (n_frames + WN_ROWS - 1) / WN_ROWS);
        }
        nm_conv1d_run(&c->post, out, n_frames, 0, 0, 0, NULL, x0, W, pool); // the mean
        for (int64_t t = 0; t < n_frames; t++)
            for (int32_t ch = 0; ch < half; ch++) zf[t * I + half + ch] -= x0[t * half + ch];
    }
    return true;
}

// HiFi-GAN on `frames` frames of z (zf [frames][inter]) as one op list on the context's backend: the
// samples (tanh's) into cx->buf[0], *n_out of them (frames times the hop); org: zf's first frame's index in
// the sentence (each convolution's first row's: it times the rate so far). Out of memory, or the backend's
// failure: its status, err naming it.
static nm_status decode(const nm_vits *v, nm_vits_ctx *cx, const float *zf, int64_t frames, int64_t org, int64_t *n_out,
                        char *err, size_t err_size) {
    int64_t cap = frames * v->dec_init, len = frames;
    int32_t chs = v->dec_init;
    for (int32_t u = 0; u < v->n_ups; u++) {
        len = (len - 1) * v->ups_rate[u] - 2 * v->ups[u].pad + v->ups_k[u];
        chs /= 2;
        cap = len * chs > cap ? len * chs : cap;
    }
    cap = (cap + 15) & ~(int64_t)15;
    const int64_t din = (frames * v->inter + 15) & ~(int64_t)15;
    if (cap > cx->dcap || din > cx->din) { // (grown to the longest so far)
        if (cx->dbuf) nm_backend_buffer_free(cx->be, cx->dbuf);
        cx->dcap = cap > cx->dcap ? cap : cx->dcap, cx->din = din > cx->din ? din : cx->din;
        if (!(cx->dbuf = nm_backend_buffer_alloc(cx->be, sizeof(float) * (size_t)(6 * cx->dcap + cx->din)))) {
            cx->dcap = cx->din = 0;
            return nm_fail(NM_ERR_NOMEM, err, err_size, "piper: out of memory for HiFi-GAN's activations on %s",
                           nm_backend_name(cx->be));
        }
    }
    float *out = grow(cx, 0, len + 16);
    if (!out) return nm_fail(NM_ERR_NOMEM, err, err_size, "piper: out of memory for the samples");
    // regions (each a tensor's place): cur: a stage's input (then its blocks' mean); nxt: the upsampled x
    // every block starts from; acc: the blocks' sum; P, Q: a block's running x; xt: ResBlock1's inner
    // convolution; in: z
    enum { CUR, NXT, ACC, XT, P, Q, IN };
    nm_tensor reg[7];
    for (int i = 0; i < 7; i++)
        reg[i] = (nm_tensor){.type = NM_TYPE_F32, .ne = {1, 1, 1, 1}, .buf = cx->dbuf, .offs = sizeof(float) * (size_t)(i * cx->dcap)};
    int32_t n_ops = 0;
    nm_tensor *ts = cx->ts;
    int64_t at = org; // (the first row's index in the sentence's, at the stage's rate)
#define DEC(c, from, to, n, a, b, scale) \
    (ts[0] = reg[from], ts[1] = reg[to], ts += 4, dec_op(cx, c, ts - 4, n, at, a, b, scale, &cx->ops[n_ops++]))
    int64_t T = DEC(&v->dec_pre, IN, CUR, frames, NULL, NULL, 1.0f);
    for (int32_t u = 0; u < v->n_ups; u++) {
        T = DEC(&v->ups[u], CUR, NXT, T, NULL, NULL, 1.0f);
        at *= v->ups_rate[u];
        const float inv = 1.0f / (float)v->n_res;
        for (int32_t j = 0; j < v->n_res; j++) {
            int src = NXT;
            for (int32_t d = 0; d < v->n_dil; d++) { // x = x + conv(x) (ResBlock1: conv2(conv1(x))), the sum fused
                const dconv *c = &v->res[u][j][v->resblock == 2 ? d : 2 * d];
                int in = src;
                if (v->resblock == 1) {
                    DEC(c, src, XT, T, NULL, NULL, 1.0f);
                    in = XT, c = &v->res[u][j][2 * d + 1];
                }
                // the block's last step adds into acc (the first block: sets it); the last block's, the mean into cur
                const nm_tensor *b = NULL;
                float scale = 1.0f;
                int to = d % 2 ? Q : P;
                if (d + 1 == v->n_dil) {
                    b = j > 0 ? &reg[ACC] : NULL;
                    to = j + 1 < v->n_res ? ACC : CUR;
                    if (j + 1 == v->n_res) scale = inv; // the blocks' mean
                }
                DEC(c, in, to, T, &reg[src], b, scale);
                src = to;
            }
        }
    }
    T = DEC(&v->dec_post, CUR, Q, T, NULL, NULL, 1.0f);
#undef DEC
    ts[0] = reg[Q];
    ts[0].ne[0] = T;
    cx->ops[n_ops++] = (nm_op){.kind = NM_OP_ACT, .src0 = &ts[0], .dst = &ts[0], .i0 = NM_ACT_TANH};
    nm_status st = nm_backend_tensor_set(cx->be, &reg[IN], 0, zf, sizeof(float) * (size_t)(frames * v->inter));
    if (st == NM_OK) st = nm_backend_submit(cx->be, cx->ops, n_ops);
    if (st == NM_OK) st = nm_backend_tensor_get(cx->be, &reg[Q], 0, out, sizeof(float) * (size_t)T);
    if (st != NM_OK)
        return nm_fail(st, err, err_size, "piper: HiFi-GAN on %s: %s", nm_backend_name(cx->be), nm_backend_last_error(cx->be));
    *n_out = T;
    return NM_OK;
}

static nm_status synth(const nm_vits *v, nm_vits_ctx *cx, const int32_t *ids, int32_t n, const nm_vits_scales *sc,
                       int64_t first_frames, nm_vits_emit_fn emit, void *user, char *err, size_t err_size);

nm_status nm_vits_synth_stream(const nm_vits *v, nm_vits_ctx *cx, const int32_t *ids, int32_t n, const nm_vits_scales *sc,
                               int32_t first_frames, nm_vits_emit_fn emit, void *user, char *err, size_t err_size) {
    if (!v || !ids || !sc || !emit || n <= 0) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "piper: no phoneme ids");
    if (n > MAX_IDS) return nm_fail(NM_ERR_RANGE, err, err_size, "piper: %d phoneme ids (at most %d)", (int)n, MAX_IDS);
    if (!(sc->length_scale >= 0.05f && sc->length_scale <= 20) || !(sc->noise_scale >= 0 && sc->noise_scale <= 5) ||
        !(sc->noise_w >= 0 && sc->noise_w <= 5))
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size,
                       "piper: scales noise %g, length %g, noise_w %g (length 0.05 .. 20, the noises 0 .. 5)",
                       (double)sc->noise_scale, (double)sc->length_scale, (double)sc->noise_w);
    for (int32_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= v->info.n_symbols)
            return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "piper: phoneme id %d at %d (the voice has %d)",
                           (int)ids[i], (int)i, (int)v->info.n_symbols);
    if (cx && cx->v != v) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "piper: a context made for another voice");
    nm_vits_ctx *own_cx = NULL;
    if (!cx) {
        nm_status st = nm_vits_ctx_create(v, NULL, 1, &own_cx, err, err_size);
        if (st != NM_OK) return st;
        cx = own_cx;
    }
    nm_status st = synth(v, cx, ids, n, sc, first_frames, emit, user, err, err_size);
    nm_vits_ctx_free(own_cx);
    return st;
}

typedef struct gather { // nm_vits_synth's samples, collected
    float *pcm;
    int64_t n, cap;
} gather;

static nm_status collect(void *user, const float *pcm, int64_t n, bool last) {
    gather *g = user;
    (void)last;
    if (g->n + n > g->cap) {
        const int64_t cap = g->n + n > 2 * g->cap ? g->n + n : 2 * g->cap;
        float *p = realloc(g->pcm, sizeof(float) * (size_t)(cap > 0 ? cap : 1));
        if (!p) return NM_ERR_NOMEM;
        g->pcm = p, g->cap = cap;
    }
    memcpy(g->pcm + g->n, pcm, sizeof(float) * (size_t)n);
    g->n += n;
    return NM_OK;
}

nm_status nm_vits_synth(const nm_vits *v, nm_vits_ctx *cx, const int32_t *ids, int32_t n, const nm_vits_scales *sc,
                        float **pcm, int64_t *n_pcm, char *err, size_t err_size) {
    if (pcm) *pcm = NULL;
    if (n_pcm) *n_pcm = 0;
    if (!pcm || !n_pcm) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "piper: no place for the samples");
    gather g = {0};
    nm_status st = nm_vits_synth_stream(v, cx, ids, n, sc, 0, collect, &g, err, err_size);
    if (st == NM_ERR_NOMEM) nm_fail(st, err, err_size, "piper: out of memory for the samples"); // (collect's)
    if (st != NM_OK) {
        free(g.pcm);
        return st;
    }
    *pcm = g.pcm, *n_pcm = g.n;
    return NM_OK;
}

// nm_vits_synth_stream's work, its arguments checked.
// flow_rev and decode, their time added to the context's phases.
static bool flow_timed(const nm_vits *v, nm_vits_ctx *cx, float *zf, int64_t n_frames, int64_t org, float *W) {
    const double t = nm_now_s();
    const bool ok = flow_rev(v, cx, zf, n_frames, org, W);
    cx->ph.flow_s += nm_now_s() - t;
    return ok;
}
static nm_status decode_timed(const nm_vits *v, nm_vits_ctx *cx, const float *zf, int64_t frames, int64_t org,
                              int64_t *n_out, char *err, size_t err_size) {
    const double t = nm_now_s();
    const nm_status st = decode(v, cx, zf, frames, org, n_out, err, err_size);
    cx->ph.decoder_s += nm_now_s() - t;
    return st;
}

static nm_status synth(const nm_vits *v, nm_vits_ctx *cx, const int32_t *ids, int32_t n, const nm_vits_scales *sc,
                       int64_t first_frames, nm_vits_emit_fn emit, void *user, char *err, size_t err_size) {
    const int32_t H = v->hidden, I = v->inter, F = v->dp_filt, FF = v->filt;
    rng r = rng_seeded(sc->seed);
    nm_pool *pool = cx->pool;
    double t0 = nm_now_s();
    cx->ph.n++;
    float *W = grow(cx, 6, v->work1 * cx->nth + 16); // the convolutions' tiles, a thread's each
    // ---- the text encoder and the durations: buffers of n steps
    const int64_t wide = FF > 2 * I ? FF : 2 * I;
    int64_t HW = H > F ? H : F; // (the duration predictor's buffers share the encoder's)
    HW = HW > 3 * v->dp_bins ? HW : 3 * v->dp_bins;
    arena A = {.cap = (size_t)(n * (int64_t)(6 * HW + wide + 64) + 4096)};
    A.base = grow(cx, 0, (int64_t)A.cap);
    if (!A.base || !W) return nm_fail(NM_ERR_NOMEM, err, err_size, "piper: out of memory for %d phonemes", (int)n);
    float *x = take(&A, n * HW), *q = take(&A, n * HW), *k = take(&A, n * HW), *val = take(&A, n * HW),
          *y = take(&A, n * HW), *z = take(&A, n * HW), *f = take(&A, n * wide);
    float *kv = grow(cx, 9, v->n_heads * att_kv(v, n) + cx->nth * att_work(v, n) + 16); // the attention's
    if (!kv) goto oom;
    for (int32_t t = 0; t < n; t++) {
        const float *e = v->emb + (int64_t)ids[t] * H;
        for (int32_t c = 0; c < H; c++) x[(int64_t)t * H + c] = e[c] * sqrtf((float)H);
    }
    for (int l = 0; l < v->n_layers; l++) {
        nm_conv1d_run(&v->enc[l].q, x, n, 0, 0, 0, NULL, q, W, pool);
        nm_conv1d_run(&v->enc[l].k, x, n, 0, 0, 0, NULL, k, W, pool);
        nm_conv1d_run(&v->enc[l].v, x, n, 0, 0, 0, NULL, val, W, pool);
        attention(v, l, q, k, val, n, y, kv, kv + v->n_heads * att_kv(v, n), pool);
        nm_conv1d_run(&v->enc[l].o, y, n, 0, 0, 0, NULL, z, W, pool);
        for (int64_t i = 0; i < (int64_t)n * H; i++) x[i] += z[i];
        layer_norm(x, n, H, &v->enc[l].n1);
        nm_conv1d_run(&v->enc[l].f1, x, n, (v->ffn_k - 1) / 2, v->ffn_k / 2, 0, NULL, f, W, pool);
        for (int64_t i = 0; i < (int64_t)n * FF; i++) f[i] = f[i] > 0 ? f[i] : 0;
        nm_conv1d_run(&v->enc[l].f2, f, n, (v->ffn_k - 1) / 2, v->ffn_k / 2, 0, NULL, z, W, pool);
        for (int64_t i = 0; i < (int64_t)n * H; i++) x[i] += z[i];
        layer_norm(x, n, H, &v->enc[l].n2);
    }
    float *stats = f; // [n][2 I]: the prior's mean, then its log-scale
    nm_conv1d_run(&v->proj, x, n, 0, 0, 0, NULL, stats, W, pool);
    cx->ph.encoder_s += nm_now_s() - t0, t0 = nm_now_s();
    // the duration predictor, in reverse: g = proj(DDSConv(pre(x)))
    float *g = q, *h = k, *t1 = val, *t2 = y;
    nm_conv1d_run(&v->dp_pre, x, n, 0, 0, 0, NULL, h, W, pool);
    dds_run(v, &v->dp_convs, h, NULL, n, t1, t2, W, pool);
    nm_conv1d_run(&v->dp_proj, h, n, 0, 0, 0, NULL, g, W, pool);
    float *zz = take(&A, 2 * (int64_t)n); // [n][2]
    if (!zz) goto oom;
    double *U = (double *)(void *)grow(cx, 5, 4 * RN_PAIRS + 16); // the normal draws' uniforms
    if (!U) goto oom;
    randn_fill(&r, zz, 2 * (int64_t)n, U, pool);
    for (int64_t i = 0; i < 2 * (int64_t)n; i++) zz[i] *= sc->noise_w;
    const int32_t nb = v->dp_bins;
    for (int32_t fl = 0; fl < v->dp_flows; fl++) {
        for (int32_t t = 0; t < n; t++) { // Flip
            const float a = zz[2 * t];
            zz[2 * t] = zz[2 * t + 1], zz[2 * t + 1] = a;
        }
        const cflow *c = &v->dp_flow[fl];
        for (int32_t t = 0; t < n; t++)
            for (int32_t ch = 0; ch < F; ch++) h[(int64_t)t * F + ch] = c->pre_w[ch] * zz[2 * t] + c->pre_b[ch];
        dds_run(v, &c->convs, h, g, n, t1, t2, W, pool);
        nm_conv1d_run(&c->proj, h, n, 0, 0, 0, NULL, t1, W, pool); // [n][3 nb - 1]
        for (int32_t t = 0; t < n; t++) {
            const float *u = t1 + (int64_t)t * (3 * nb - 1);
            zz[2 * t + 1] = spline_inverse(zz[2 * t + 1], u, u + nb, u + 2 * nb, nb, 5.0f, sqrtf((float)F));
        }
    }
    for (int32_t t = 0; t < n; t++) { // Flip, then the elementwise affine
        const float a = zz[2 * t];
        zz[2 * t] = zz[2 * t + 1], zz[2 * t + 1] = a;
        for (int c = 0; c < 2; c++) zz[2 * t + c] = (zz[2 * t + c] - v->dp_m[c]) * v->dp_exp_neg_logs[c];
    }
    // the frames of each phoneme: ceil(exp(logw) * length_scale)
    int64_t n_frames = 0;
    int32_t *dur = (int32_t *)(void *)take(&A, n);
    if (!dur) goto oom;
    const int64_t max_frames = (int64_t)600 * v->info.sample_rate / v->info.hop;
    for (int32_t t = 0; t < n; t++) {
        const float w = ceilf(expf(zz[2 * t]) * sc->length_scale);
        dur[t] = w > 0 ? (w > (float)max_frames ? (int32_t)max_frames : (int32_t)w) : 0;
        n_frames += dur[t];
    }
    if (n_frames > max_frames) {
        return nm_fail(NM_ERR_RANGE, err, err_size, "piper: %lld frames: longer than 10 minutes", (long long)n_frames);
    }
    if (n_frames < 1) n_frames = 1; // (VITS's clamp: one frame of zeros)
    // ---- the frames: z = m + noise * exp(logs) * noise_scale, the flow in reverse, HiFi-GAN
    float *zf = grow(cx, 7, (int64_t)n_frames * I + 16); // [frames][I]: the prior's z, then the decoder's input
    if (!zf) goto oom;
    {
        float *els = grow(cx, 9, (int64_t)n * I + 16); // exp(logs) a phoneme (in the attention's buffer, done with)
        if (!els) goto oom;
        for (int32_t t = 0; t < n; t++)
            for (int32_t c = 0; c < I; c++) els[(int64_t)t * I + c] = expf(stats[(int64_t)t * 2 * I + I + c]);
        int64_t fr = 0;
        for (int32_t t = 0; t < n; t++) fr += dur[t];
        fr = fr < n_frames ? fr : n_frames; // (the frames with a phoneme; a clamped one of zeros has none)
        randn_fill(&r, zf, fr * I, U, pool);
        fr = 0;
        for (int32_t t = 0; t < n; t++)
            for (int32_t d = 0; d < dur[t] && fr < n_frames; d++, fr++)
                for (int32_t c = 0; c < I; c++) {
                    const float m = stats[(int64_t)t * 2 * I + c], e = els[(int64_t)t * I + c];
                    zf[fr * I + c] = m + zf[fr * I + c] * e * sc->noise_scale;
                }
        for (; fr < n_frames; fr++) memset(zf + fr * I, 0, sizeof(float) * (size_t)I);
    }
    cx->ph.durations_s += nm_now_s() - t0;
    // The flow and HiFi-GAN: the whole, or (first_frames) the first part, then the rest, each part with the
    // frames the decoder and the flow reach beyond its inner edge (so every sample sent is the whole's)
    const int64_t hop = v->info.hop, Rd = cx->dec_reach, Rf = v->flow_reach;
    if (first_frames <= 0 || n_frames <= first_frames + 2 * Rd) {
        if (!flow_timed(v, cx, zf, n_frames, 0, W)) goto oom;
        int64_t T = 0;
        nm_status st = decode_timed(v, cx, zf, n_frames, 0, &T, err, err_size);
        return st == NM_OK ? emit(user, cx->buf[0], T, true) : st;
    }
    // the first part's flow window (its first first_frames + Rd exact; all of them: the whole's)
    const int64_t m1 = first_frames + Rd + Rf < n_frames ? first_frames + Rd + Rf : n_frames;
    float *za = grow(cx, 8, m1 * I + 16);
    if (!za) goto oom;
    memcpy(za, zf, sizeof(float) * (size_t)(m1 * I));
    if (!flow_timed(v, cx, za, m1, 0, W)) goto oom;
    int64_t T = 0;
    nm_status st = decode_timed(v, cx, za, first_frames + Rd, 0, &T, err, err_size);
    if (st == NM_OK) st = emit(user, cx->buf[0], first_frames * hop, false);
    if (st != NM_OK) return st;
    const int64_t a0 = first_frames > Rd ? first_frames - Rd : 0; // the rest's decoder from its reach back ...
    const int64_t b0 = a0 > Rf ? a0 - Rf : 0;                     // ... and its flow from that one's
    if (!flow_timed(v, cx, zf + b0 * I, n_frames - b0, b0, W)) goto oom;
    if ((st = decode_timed(v, cx, zf + a0 * I, n_frames - a0, a0, &T, err, err_size)) != NM_OK) return st;
    return emit(user, cx->buf[0] + (first_frames - a0) * hop, T - (first_frames - a0) * hop, true);
oom:
    return nm_fail(NM_ERR_NOMEM, err, err_size, "piper: out of memory for %d phonemes", (int)n);
}
