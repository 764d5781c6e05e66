// The OpenCL kernels (src/backend/opencl/kernels*.cl, the program the backend embeds) against plain C
// references, on the first device of the first OpenCL platform. Every case is
// a skip where no platform (or no libOpenCL) is there; a kernel file that does
// not build is a failure, with the build log.
//
// Each buffer sits at an odd offset inside a larger cl_mem whose other bytes
// are 0xff (NaN as f32), and the bytes past each output are checked to be
// untouched: the kernels' offset arguments and edge guards are under test too.
//
// Build (from the repo root):
//   gcc -O1 -std=c11 -Wall -Wextra -Isrc -Iinclude tests/unit/test_opencl_kernels.c
//       src/backend/opencl/cl_api.c build/libnanomind.a -lm -ldl -lpthread -o /tmp/test_opencl_kernels
#include <stdint.h>
#include <time.h>

#include "backend/opencl/cl_api.h"
#include "nmtest.h"
#include "quant/quant.h"

// The program as the backend builds it: kernels.cl, kernels_x8.cl and kernels_ops.cl joined at build time
// (cmake/embed.cmake), from the library.
extern const unsigned char nm_cl_kernels_source[];
extern const size_t nm_cl_kernels_source_len;

// ---- random data ------------------------------------------------------------------------

static uint64_t rng = 0x2545f4914f6cdd1dull;
static double urand(void) { // xorshift64*, in (0, 1)
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return ((double)((rng * 2685821657736338717ull) >> 11) + 0.5) / 9007199254740992.0;
}
static float grand(void) { return (float)(sqrt(-2.0 * log(urand())) * cos(6.283185307179586 * urand())); }
static void fill(float *x, size_t n, float s) {
    for (size_t i = 0; i < n; i++) x[i] = grand() * s;
}

// max|a - b| / max|b|; a NaN in a counts as an infinite error.
static double rel_err(const float *a, const double *b, size_t n) {
    double e = 0, m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (d != d) return INFINITY;
        e = d > e ? d : e;
        m = fabs(b[i]) > m ? fabs(b[i]) : m;
    }
    return m > 0 ? e / m : e;
}

#define CHECK_REL(a, b, n, tol, ...)                                                           \
    do {                                                                                       \
        double e_ = rel_err(a, b, n);                                                          \
        if (!(e_ <= (tol))) {                                                                  \
            fprintf(stderr, "  %s:%d: rel err %.3g > %.3g: ", __FILE__, __LINE__, e_, (double)(tol)); \
            fprintf(stderr, __VA_ARGS__);                                                      \
            fprintf(stderr, "\n");                                                             \
            *nmtest_failed = 1;                                                                \
        }                                                                                      \
    } while (0)

// ---- OpenCL set-up, once -----------------------------------------------------------------

static struct {
    int state; // 0 not tried, 1 ready, 2 skip (no platform), 3 failed
    char why[256];
    nm_cl_api api;
    cl_device_id dev;
    cl_context ctx;
    cl_command_queue q;
    cl_program prog;
    bool ptx; // NVIDIA's platform: built with NM_DP4A_PTX (warp kernels such as attention_dec exist)
} cl;

static nm_cl_x8_geom geom; // the x8 matvecs' geometry the program is built with (NM_OPENCL_MVQ, ...)

static int cl_setup(void) {
    if (cl.state) return cl.state;
    cl.state = 2;
    if (nm_cl_api_load(&cl.api, cl.why, sizeof cl.why) != 0) {
        fprintf(stderr, "  (%s)\n", cl.why);
        snprintf(cl.why, sizeof cl.why, "no OpenCL platform");
        return cl.state;
    }
    const nm_cl_api *a = &cl.api;
    // the first platform, or NM_CL_TEST_PLATFORM=N (several installed: PoCL and a GPU's)
    cl_platform_id plats[8], plat = NULL;
    cl_uint np = 0;
    const int pi = getenv("NM_CL_TEST_PLATFORM") ? atoi(getenv("NM_CL_TEST_PLATFORM")) : 0;
    if (a->clGetPlatformIDs(8, plats, &np) == CL_SUCCESS && pi >= 0 && (cl_uint)pi < np) plat = plats[pi];
    if (!plat || a->clGetDeviceIDs(plat, CL_DEVICE_TYPE_ALL, 1, &cl.dev, NULL) != CL_SUCCESS) {
        snprintf(cl.why, sizeof cl.why, "no OpenCL platform");
        return cl.state;
    }
    cl.state = 3;
    char name[256] = "?", ver[256] = "?";
    a->clGetDeviceInfo(cl.dev, CL_DEVICE_NAME, sizeof name, name, NULL);
    a->clGetDeviceInfo(cl.dev, CL_DEVICE_VERSION, sizeof ver, ver, NULL);
    fprintf(stderr, "  device: %s (%s)\n", name, ver);
    cl_int err;
    cl_context_properties props[] = {CL_CONTEXT_PLATFORM, (cl_context_properties)plat, 0};
    cl.ctx = a->clCreateContext(props, 1, &cl.dev, NULL, NULL, &err);
    if (!cl.ctx) return snprintf(cl.why, sizeof cl.why, "clCreateContext: %s", nm_cl_strerror(err)), cl.state;
    cl.q = a->clCreateCommandQueue(cl.ctx, cl.dev, 0, &err);
    if (!cl.q) return snprintf(cl.why, sizeof cl.why, "clCreateCommandQueue: %s", nm_cl_strerror(err)), cl.state;
    const char *srcs[] = {(const char *)nm_cl_kernels_source};
    const size_t lens[] = {nm_cl_kernels_source_len};
    cl.prog = a->clCreateProgramWithSource(cl.ctx, 1, srcs, lens, &err);
    if (!cl.prog) return snprintf(cl.why, sizeof cl.why, "clCreateProgramWithSource: %s", nm_cl_strerror(err)), cl.state;
    // as the backend builds it: with inline PTX (dp4a) on NVIDIA's platform
    char pname[128] = "";
    a->clGetPlatformInfo(plat, CL_PLATFORM_NAME, sizeof pname - 1, pname, NULL);
    const bool ptx = cl.ptx = strstr(pname, "NVIDIA") != NULL;
    if (ptx) fprintf(stderr, "  built with NM_DP4A_PTX (inline PTX dp4a)\n");
    char opts[256];
    geom = nm_cl_x8_geom_get();
    nm_cl_build_opts(&geom, ptx, opts, sizeof opts);
    if (getenv("NM_OPENCL_MVQ") || getenv("NM_OPENCL_MVS") || getenv("NM_OPENCL_MVG")) fprintf(stderr, "  %s\n", opts);
    err = a->clBuildProgram(cl.prog, 1, &cl.dev, opts, NULL, NULL);
    size_t n = 0;
    a->clGetProgramBuildInfo(cl.prog, cl.dev, CL_PROGRAM_BUILD_LOG, 0, NULL, &n);
    char *log = malloc(n + 1);
    if (log && a->clGetProgramBuildInfo(cl.prog, cl.dev, CL_PROGRAM_BUILD_LOG, n, log, NULL) == CL_SUCCESS) {
        log[n] = 0;
        if (err != CL_SUCCESS || getenv("NM_CL_LOG")) fprintf(stderr, "  build log of the kernels:\n%s\n", log);
    }
    free(log);
    if (err != CL_SUCCESS) return snprintf(cl.why, sizeof cl.why, "clBuildProgram: %s", nm_cl_strerror(err)), cl.state;
    return cl.state = 1;
}

// Every case starts with this: skip without a platform, fail if set-up failed.
#define CL_READY()                                                                              \
    do {                                                                                        \
        int s_ = cl_setup();                                                                    \
        if (s_ == 2) NM_SKIP(cl.why);                                                           \
        if (s_ != 1) {                                                                          \
            fprintf(stderr, "  %s:%d: OpenCL set-up: %s\n", __FILE__, __LINE__, cl.why);        \
            *nmtest_failed = 1;                                                                 \
            return;                                                                             \
        }                                                                                       \
    } while (0)

// ---- buffers: data at an offset, guard bytes around it ----------------------------------

#define GUARD 4096 // bytes of 0xff after the data (a row of writes past the end lands in them)

typedef struct dbuf {
    cl_mem m;
    size_t off, bytes;
} dbuf;

// A cl_mem of off + bytes + GUARD bytes: 0xff everywhere, host[0..bytes) at
// off (when host is not NULL).
static dbuf dbuf_new(const void *host, size_t bytes, size_t off) {
    dbuf b = {NULL, off, bytes};
    size_t total = off + bytes + GUARD;
    uint8_t *init = malloc(total);
    memset(init, 0xff, total);
    if (host) memcpy(init + off, host, bytes);
    cl_int err;
    b.m = cl.api.clCreateBuffer(cl.ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, total, init, &err);
    free(init);
    if (!b.m) fprintf(stderr, "  clCreateBuffer(%zu): %s\n", total, nm_cl_strerror(err));
    return b;
}

// Reads the data back into host; returns 0 if the bytes before and after it
// are still 0xff, -1 (with a message) if a kernel wrote outside.
static int dbuf_read(const dbuf *b, void *host) {
    size_t total = b->off + b->bytes + GUARD;
    uint8_t *all = malloc(total);
    cl_int err = cl.api.clEnqueueReadBuffer(cl.q, b->m, CL_TRUE, 0, total, all, 0, NULL, NULL);
    int rc = err == CL_SUCCESS ? 0 : -1;
    if (err != CL_SUCCESS) fprintf(stderr, "  clEnqueueReadBuffer: %s\n", nm_cl_strerror(err));
    if (!rc) memcpy(host, all + b->off, b->bytes);
    for (size_t i = 0; !rc && i < total; i++)
        if ((i < b->off || i >= b->off + b->bytes) && all[i] != 0xff) {
            fprintf(stderr, "  byte %zd relative to the data was written\n", (ptrdiff_t)i - (ptrdiff_t)b->off);
            rc = -1;
        }
    free(all);
    return rc;
}

static void dbuf_free(dbuf *b) {
    if (b->m) cl.api.clReleaseMemObject(b->m);
    b->m = NULL;
}

// ---- kernel calls -------------------------------------------------------------------------

typedef struct kcall {
    cl_kernel k;
    cl_uint n; // next argument index
    cl_int err;
    const char *name;
} kcall;

static kcall kc_begin(const char *name) {
    kcall c = {NULL, 0, CL_SUCCESS, name};
    c.k = cl.api.clCreateKernel(cl.prog, name, &c.err);
    return c;
}
static void kc_arg(kcall *c, size_t size, const void *v) {
    if (c->err == CL_SUCCESS) c->err = cl.api.clSetKernelArg(c->k, c->n, size, v);
    c->n++;
}
// A buffer is two arguments: the cl_mem and the ulong byte offset.
static void kc_buf(kcall *c, const dbuf *b) {
    cl_ulong off = b->off;
    kc_arg(c, sizeof(cl_mem), &b->m);
    kc_arg(c, sizeof off, &off);
}
static void kc_int(kcall *c, int v) {
    cl_int x = v;
    kc_arg(c, sizeof x, &x);
}
static void kc_float(kcall *c, float v) { kc_arg(c, sizeof v, &v); }

// Enqueues over dim dimensions (l NULL: the implementation's choice), waits,
// releases the kernel. Returns 0, or -1 with a message.
static int kc_run(kcall *c, cl_uint dim, const size_t *g, const size_t *l) {
    if (c->err == CL_SUCCESS) c->err = cl.api.clEnqueueNDRangeKernel(cl.q, c->k, dim, NULL, g, l, 0, NULL, NULL);
    if (c->err == CL_SUCCESS) c->err = cl.api.clFinish(cl.q);
    if (c->k) cl.api.clReleaseKernel(c->k);
    if (c->err != CL_SUCCESS) {
        fprintf(stderr, "  %s (arg %u): %s\n", c->name, c->n, nm_cl_strerror(c->err));
        return -1;
    }
    return 0;
}

static size_t round_up(size_t n, size_t m) { return (n + m - 1) / m * m; }

// ---- weight types ---------------------------------------------------------------------------

static const struct {
    uint32_t type;
    const char *name;
} wtypes[] = {
    {NM_TYPE_F32, "f32"},   {NM_TYPE_F16, "f16"},   {NM_TYPE_Q4_0, "q4_0"}, {NM_TYPE_Q4_1, "q4_1"},
    {NM_TYPE_Q5_0, "q5_0"}, {NM_TYPE_Q8_0, "q8_0"}, {NM_TYPE_Q4_K, "q4_K"}, {NM_TYPE_Q5_K, "q5_K"},
    {NM_TYPE_Q6_K, "q6_K"}, {NM_TYPE_MXFP4, "mxfp4"},
};
#define N_WT (sizeof wtypes / sizeof wtypes[0])

// N rows of K random weights quantized to `type`; *deq gets the dequantized
// rows (N * K floats, malloc'd), the return value the raw rows (malloc'd).
static uint8_t *make_weights(uint32_t type, int K, int N, float **deq) {
    const size_t rb = nm_row_size(type, K);
    uint8_t *w = malloc(rb * (size_t)N);
    float *src = malloc(sizeof(float) * (size_t)K);
    *deq = malloc(sizeof(float) * (size_t)K * (size_t)N);
    for (int n = 0; n < N; n++) {
        // rows of different scales, a few outliers: exercises the per-block scales
        fill(src, (size_t)K, 0.5f + (float)urand());
        for (int k = 0; k < K; k += 61) src[k] *= 4.0f;
        nm_quantize_row_ref(type, src, w + rb * (size_t)n, K);
        nm_dequantize_row_ref(type, w + rb * (size_t)n, *deq + (size_t)K * n, K);
    }
    free(src);
    return w;
}

#define MV_ROWS 4  // rows of a work-group of mv_T (kernels.cl NM_MV_ROWS)
#define MVR_ROWS 8 // and of mv_q4_0r (NM_MVR_ROWS)

// ---- mv_ / mm_ / get_rows_ --------------------------------------------------------------------

// mv (T == 0) or mm (T >= 1) of every weight type against a double dot of
// the dequantized rows.
static void check_matmul(int *nmtest_failed, int K, int N, int T, size_t lws, int has_bias) {
    for (size_t ti = 0; ti < N_WT; ti++) {
        const uint32_t type = wtypes[ti].type;
        const size_t rb = nm_row_size(type, K);
        if (!rb) continue; // K not a multiple of the block
        const int nt = T ? T : 1;
        float *deq, *x = malloc(sizeof(float) * (size_t)K * nt), *bias = malloc(sizeof(float) * (size_t)N);
        float *y = malloc(sizeof(float) * (size_t)N * nt);
        double *ref = malloc(sizeof(double) * (size_t)N * nt);
        uint8_t *w = make_weights(type, K, N, &deq);
        fill(x, (size_t)K * nt, 1.0f);
        fill(bias, (size_t)N, 1.0f);
        for (int t = 0; t < nt; t++)
            for (int n = 0; n < N; n++) {
                double s = has_bias ? bias[n] : 0.0;
                for (int k = 0; k < K; k++) s += (double)deq[(size_t)n * K + k] * x[(size_t)t * K + k];
                ref[(size_t)t * N + n] = s;
            }
        dbuf bw = dbuf_new(w, rb * (size_t)N, 96), bx = dbuf_new(x, sizeof(float) * (size_t)K * nt, 20);
        dbuf bb = dbuf_new(bias, sizeof(float) * (size_t)N, 8), by = dbuf_new(NULL, sizeof(float) * (size_t)N * nt, 12);
        char name[32];
        snprintf(name, sizeof name, "%s_%s", T ? "mm" : "mv", wtypes[ti].name);
        kcall c = kc_begin(name);
        kc_buf(&c, &bw), kc_buf(&c, &bx), kc_buf(&c, &by), kc_buf(&c, &bb);
        kc_int(&c, has_bias), kc_int(&c, K), kc_int(&c, N);
        int rc;
        if (T) {
            kc_int(&c, T);
            size_t g[2] = {round_up((size_t)N, 32) / 2, round_up((size_t)T, 32) / 2}, l[2] = {16, 16};
            rc = kc_run(&c, 2, g, l);
        } else {
            size_t g = (size_t)(N + MV_ROWS - 1) / MV_ROWS * lws;
            rc = kc_run(&c, 1, &g, &lws);
        }
        NM_CHECK(rc == 0);
        if (rc == 0) {
            NM_CHECK(dbuf_read(&by, y) == 0);
            CHECK_REL(y, ref, (size_t)N * nt, 1e-5, "%s K=%d N=%d T=%d lws=%zu bias=%d", name, K, N, T, lws, has_bias);
        }
        dbuf_free(&bw), dbuf_free(&bx), dbuf_free(&bb), dbuf_free(&by);
        free(deq), free(x), free(bias), free(y), free(ref), free(w);
    }
}

NM_TEST(mv_all_types) {
    CL_READY();
    check_matmul(nmtest_failed, 256 * 3, 37, 0, 64, 1);
    check_matmul(nmtest_failed, 256 * 3, 37, 0, 256, 0);
    check_matmul(nmtest_failed, 256, 5, 0, 32, 1);    // fewer units than work-items
    check_matmul(nmtest_failed, 4096, 3, 0, 128, 0);  // long rows
    check_matmul(nmtest_failed, 32 * 7, 9, 0, 64, 1); // legacy blocks only
    check_matmul(nmtest_failed, 101, 6, 0, 32, 1);    // f32/f16 with a tail
}

// q4_0 rows as prepare_weight lays them out for mv_q4_0r: quants of every
// block (16 bytes), then the scales.
static uint8_t *repack_q4_0(const uint8_t *w, int K, int N) {
    const size_t nb = (size_t)K / 32;
    uint8_t *r = malloc(nb * 18 * (size_t)N);
    for (size_t i = 0; i < nb * (size_t)N; i++) {
        memcpy(r + i * 16, w + i * 18 + 2, 16);
        memcpy(r + nb * (size_t)N * 16 + i * 2, w + i * 18, 2);
    }
    return r;
}

// kern: mv_q4_0r (f32 activations, within 1e-5 of the f64 sum of the
// dequantized weights) or mv_q4_0r8 (the activations rounded to 8 bits per
// block of 32: against the same sum with x quantized as the kernel does it,
// within 1e-5; and within 2% of the f32 product).
static void check_mv_q4_0r(int *nmtest_failed, const char *kern, int K, int N, size_t lws, int has_bias) {
    float *deq, *x = malloc(sizeof(float) * (size_t)K), *bias = malloc(sizeof(float) * (size_t)N);
    float *y = malloc(sizeof(float) * (size_t)N);
    double *ref = malloc(sizeof(double) * (size_t)N);
    uint8_t *w = make_weights(NM_TYPE_Q4_0, K, N, &deq), *r = repack_q4_0(w, K, N);
    fill(x, (size_t)K, 1.0f);
    fill(bias, (size_t)N, 1.0f);
    const bool q8 = strcmp(kern, "mv_q4_0r8") == 0;
    float *xr = malloc(sizeof(float) * (size_t)K); // x as the kernel rounds it
    for (int b = 0; b < K / 32; b++) {
        float amax = 0.0f;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[32 * b + i]));
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        for (int i = 0; i < 32; i++) xr[32 * b + i] = q8 ? roundf(x[32 * b + i] * id) * d : x[32 * b + i];
    }
    double *exact = malloc(sizeof(double) * (size_t)N);
    for (int n = 0; n < N; n++) {
        double s = has_bias ? bias[n] : 0.0, e = s;
        for (int k = 0; k < K; k++) s += (double)deq[(size_t)n * K + k] * xr[k];
        for (int k = 0; k < K; k++) e += (double)deq[(size_t)n * K + k] * x[k];
        ref[n] = s, exact[n] = e;
    }
    dbuf bw = dbuf_new(r, (size_t)K / 32 * 18 * N, 0), bx = dbuf_new(x, sizeof(float) * (size_t)K, 20);
    dbuf bb = dbuf_new(bias, sizeof(float) * (size_t)N, 8), by = dbuf_new(NULL, sizeof(float) * (size_t)N, 12);
    kcall c = kc_begin(kern);
    kc_buf(&c, &bw), kc_buf(&c, &bx), kc_buf(&c, &by), kc_buf(&c, &bb);
    kc_int(&c, has_bias), kc_int(&c, K), kc_int(&c, N);
    size_t g = (size_t)(N + MVR_ROWS - 1) / MVR_ROWS * lws;
    const int rc = kc_run(&c, 1, &g, &lws);
    NM_CHECK(rc == 0);
    if (rc == 0) {
        NM_CHECK(dbuf_read(&by, y) == 0);
        CHECK_REL(y, ref, (size_t)N, 1e-5, "%s K=%d N=%d lws=%zu bias=%d", kern, K, N, lws, has_bias);
        if (q8) CHECK_REL(y, exact, (size_t)N, 2e-2, "%s against f32 x, K=%d N=%d", kern, K, N);
    }
    dbuf_free(&bw), dbuf_free(&bx), dbuf_free(&bb), dbuf_free(&by);
    free(deq), free(x), free(bias), free(y), free(ref), free(w), free(r), free(xr), free(exact);
}

NM_TEST(mv_q4_0_repacked) {
    CL_READY();
    static const char *const kerns[] = {"mv_q4_0r", "mv_q4_0r8"};
    for (int i = 0; i < 2; i++) {
        check_mv_q4_0r(nmtest_failed, kerns[i], 32 * 7, 37, 64, 1); // rows past the last group's 8
        check_mv_q4_0r(nmtest_failed, kerns[i], 4096, 16, 128, 0);  // 128 blocks: one per item at 128, two steps at 64
        check_mv_q4_0r(nmtest_failed, kerns[i], 32 * 200, 8, 128, 0); // a last step of 72 blocks (items left idle)
        check_mv_q4_0r(nmtest_failed, kerns[i], 4096, 9, 64, 1);
        check_mv_q4_0r(nmtest_failed, kerns[i], 32, 3, 32, 1);      // one block, fewer rows than a group
    }
}

NM_TEST(mm_all_types) {
    CL_READY();
    const int T[] = {1, 5, 33};
    for (int i = 0; i < 3; i++) check_matmul(nmtest_failed, 256 * 3, 37, T[i], 0, i != 1);
    check_matmul(nmtest_failed, 32 * 5, 70, 40, 0, 1); // two tiles each way
    check_matmul(nmtest_failed, 256, 50, 21, 0, 1);    // edges in the second half of a tile (rows lx + 16)
    check_matmul(nmtest_failed, 45, 3, 2, 0, 0);      // f32/f16, K not a multiple of the 32-column step
}

NM_TEST(get_rows_all_types) {
    CL_READY();
    const int Ks[] = {256 * 3, 256, 32 * 3, 37};
    for (int ki = 0; ki < 4; ki++) {
        const int K = Ks[ki], N = 11, n_ids = 6;
        const int ids[6] = {3, 0, 10, 3, 7, 1};
        for (size_t ti = 0; ti < N_WT; ti++) {
            const uint32_t type = wtypes[ti].type;
            const size_t rb = nm_row_size(type, K);
            if (!rb) continue;
            float *deq, *y = malloc(sizeof(float) * (size_t)K * n_ids);
            double *ref = malloc(sizeof(double) * (size_t)K * n_ids);
            uint8_t *w = make_weights(type, K, N, &deq);
            for (int i = 0; i < n_ids; i++)
                for (int k = 0; k < K; k++) ref[(size_t)i * K + k] = deq[(size_t)ids[i] * K + k];
            dbuf bw = dbuf_new(w, rb * (size_t)N, 32), bi = dbuf_new(ids, sizeof ids, 4);
            dbuf by = dbuf_new(NULL, sizeof(float) * (size_t)K * n_ids, 36);
            char name[32];
            snprintf(name, sizeof name, "get_rows_%s", wtypes[ti].name);
            kcall c = kc_begin(name);
            kc_buf(&c, &bw), kc_buf(&c, &bi), kc_buf(&c, &by), kc_int(&c, K);
            size_t g[2] = {round_up(((size_t)K + 3) / 4, 64), (size_t)n_ids}, l[2] = {64, 1};
            int rc = kc_run(&c, 2, g, l);
            NM_CHECK(rc == 0);
            if (rc == 0) {
                NM_CHECK(dbuf_read(&by, y) == 0);
                CHECK_REL(y, ref, (size_t)K * n_ids, 1e-6, "%s K=%d", name, K);
            }
            dbuf_free(&bw), dbuf_free(&bi), dbuf_free(&by);
            free(deq), free(y), free(ref), free(w);
        }
    }
}

static double act_ref(double x, int act) {
    if (act == 0) return x / (1 + exp(-x));
    if (act == 1) return 0.5 * x * (1 + tanh(sqrt(2 / 3.141592653589793) * (x + 0.044715 * x * x * x)));
    return x / (1 + exp(-1.702 * x));
}

// ---- the x8 path: matvecs from activations rounded once -------------------------------------

// x8 of K values as the kernels lay it out: K int8, then (d, sum q) per block.
static uint8_t *make_x8(const float *x, int K, float *xr) {
    uint8_t *x8 = malloc((size_t)K + (size_t)K / 32 * 8);
    for (int b = 0; b < K / 32; b++) {
        float amax = 0.0f;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[32 * b + i]));
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        int sum = 0;
        for (int i = 0; i < 32; i++) {
            const int q = (int)roundf(x[32 * b + i] * id);
            x8[32 * b + i] = (uint8_t)(int8_t)q, sum += q, xr[32 * b + i] = (float)q * d;
        }
        const float ds[2] = {d, (float)sum};
        memcpy(x8 + K + 8 * b, ds, 8);
    }
    return x8;
}

// The x8 a kernel wrote for the values v: each block's scale max|v| / 127
// (within an ulp: a device may divide in approximation), each q = round(v / d)
// give or take 1 where v / d lies within 1e-4 of a half, the sums exact.
// Returns the number of values off.
static int check_x8(const float *v, const uint8_t *x8, int K) {
    int bad = 0;
    for (int b = 0; b < K / 32; b++) {
        float amax = 0.0f, ds[2];
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(v[32 * b + i]));
        memcpy(ds, x8 + K + 8 * b, 8);
        const float d = amax / 127.0f;
        if (fabsf(ds[0] - d) > 2e-7f * d) bad++;
        int sum = 0;
        for (int i = 0; i < 32; i++) {
            const int q = (int8_t)x8[32 * b + i];
            const double t = d != 0.0f ? v[32 * b + i] / (double)d : 0.0;
            const bool tie = fabs(fabs(t - floor(t)) - 0.5) < 1e-4;
            if (q != (int)lround(t) && !(tie && abs(q - (int)lround(t)) <= 1)) bad++;
            sum += q;
        }
        if ((float)sum != ds[1]) bad++;
    }
    return bad;
}

// mvq_q4_0's local size: want, or the most the program was built for.
static size_t mvq_lws(size_t want) { return want < (size_t)geom.mvq_lws ? want : (size_t)geom.mvq_lws; }

// mvq_q4_0's rope arguments when it has none (any buffer where one is due).
static void kc_no_rope(kcall *c, const dbuf *any) {
    kc_int(c, 0), kc_buf(c, any), kc_int(c, 0), kc_int(c, 0), kc_float(c, 0.0f), kc_float(c, 0.0f);
    kc_buf(c, any), kc_buf(c, any);
}

// A buffer of n_part pieces of a sum of squares (n_part > 0; else 1 unused
// float) and the norm factor 1 / sqrt(sum / K + eps) they give.
static dbuf norm_parts(int n_part, int K, float eps, double *factor) {
    float *p = malloc(sizeof(float) * (size_t)(n_part > 0 ? n_part : 1));
    double sum = 0;
    for (int i = 0; i < (n_part > 0 ? n_part : 1); i++) p[i] = 0.5f + (float)(i % 7) * 0.75f, sum += p[i];
    *factor = n_part > 0 ? 1 / sqrt(sum / K + eps) : 1.0;
    dbuf b = dbuf_new(p, sizeof(float) * (size_t)(n_part > 0 ? n_part : 1), 0);
    free(p);
    return b;
}

// mvq_q4_0 over n_mat matrices (rows Ns[m]) of one x8 input, one launch:
// each output within 1e-5 of the f64 sum of the dequantized weights times x
// as rounded; with n_part > 0 times the norm factor of n_part pieces.
static void check_mvq(int *nmtest_failed, int K, const int *Ns, int n_mat, size_t lws, int n_part) {
    float *x = malloc(sizeof(float) * (size_t)K), *xr = malloc(sizeof(float) * (size_t)K);
    fill(x, (size_t)K, 1.0f);
    uint8_t *x8 = make_x8(x, K, xr);
    dbuf bq = dbuf_new(x8, (size_t)K + (size_t)K / 32 * 8, 64), bw[3], by[3];
    float *deq[3] = {NULL, NULL, NULL};
    uint8_t *w[3] = {NULL, NULL, NULL}, *r[3] = {NULL, NULL, NULL};
    double factor;
    dbuf bp = norm_parts(n_part, K, 1e-5f, &factor);
    kcall c = kc_begin("mvq_q4_0");
    size_t groups = 0;
    for (int m = 0; m < 3; m++) {
        const int N = m < n_mat ? Ns[m] : 0;
        if (m < n_mat) {
            w[m] = make_weights(NM_TYPE_Q4_0, K, N, &deq[m]), r[m] = repack_q4_0(w[m], K, N);
            bw[m] = dbuf_new(r[m], (size_t)K / 32 * 18 * N, 0), by[m] = dbuf_new(NULL, sizeof(float) * (size_t)N, 4 * m);
        }
        groups += (size_t)(N + geom.mvq_rows - 1) / geom.mvq_rows;
    }
    lws = mvq_lws(lws);
    for (int m = 0; m < 3; m++) kc_arg(&c, sizeof(cl_mem), &bw[m < n_mat ? m : 0].m);
    for (int m = 0; m < 3; m++) kc_int(&c, m < n_mat ? Ns[m] : 0);
    kc_buf(&c, &bq);
    for (int m = 0; m < 3; m++) kc_buf(&c, &by[m < n_mat ? m : 0]);
    kc_int(&c, K);
    kc_arg(&c, sizeof(cl_mem), &bp.m), kc_int(&c, n_part), kc_float(&c, 1e-5f);
    kc_no_rope(&c, &bp);
    size_t g = groups * lws;
    const int rc = kc_run(&c, 1, &g, &lws);
    NM_CHECK(rc == 0);
    for (int m = 0; m < n_mat; m++) {
        const int N = Ns[m];
        float *y = malloc(sizeof(float) * (size_t)N);
        double *ref = malloc(sizeof(double) * (size_t)N);
        for (int n = 0; n < N; n++) {
            double sacc = 0;
            for (int k = 0; k < K; k++) sacc += (double)deq[m][(size_t)n * K + k] * xr[k];
            ref[n] = sacc * factor;
        }
        if (rc == 0) {
            NM_CHECK(dbuf_read(&by[m], y) == 0);
            CHECK_REL(y, ref, (size_t)N, 1e-5, "mvq_q4_0 matrix %d of %d, K=%d N=%d lws=%zu n_part=%d", m, n_mat, K, N,
                      lws, n_part);
        }
        free(y), free(ref);
        dbuf_free(&bw[m]), dbuf_free(&by[m]);
        free(deq[m]), free(w[m]), free(r[m]);
    }
    dbuf_free(&bq), dbuf_free(&bp);
    free(x), free(xr), free(x8);
}

// mvq_glu_q4_0: h = act(W_g x) (W_u x) within 1e-5 of the f64 reference, and
// h's own x8 (check_x8); with n_part > 0 both sums times the norm factor.
static void check_mvq_glu(int *nmtest_failed, int K, int N, int act, int n_part) {
    float *x = malloc(sizeof(float) * (size_t)K), *xr = malloc(sizeof(float) * (size_t)K), *dg, *du;
    fill(x, (size_t)K, 1.0f);
    uint8_t *x8 = make_x8(x, K, xr);
    uint8_t *wg = make_weights(NM_TYPE_Q4_0, K, N, &dg), *wu = make_weights(NM_TYPE_Q4_0, K, N, &du);
    uint8_t *rg = repack_q4_0(wg, K, N), *ru = repack_q4_0(wu, K, N);
    dbuf bq = dbuf_new(x8, (size_t)K + (size_t)K / 32 * 8, 64), bo = dbuf_new(NULL, (size_t)N + (size_t)N / 32 * 8, 32);
    dbuf bg = dbuf_new(rg, (size_t)K / 32 * 18 * N, 0), bu = dbuf_new(ru, (size_t)K / 32 * 18 * N, 0);
    dbuf by = dbuf_new(NULL, sizeof(float) * (size_t)N, 12);
    double factor;
    dbuf bp = norm_parts(n_part, K, 1e-6f, &factor);
    kcall c = kc_begin("mvq_glu_q4_0");
    kc_arg(&c, sizeof(cl_mem), &bg.m), kc_arg(&c, sizeof(cl_mem), &bu.m), kc_int(&c, N);
    kc_buf(&c, &bq), kc_buf(&c, &by), kc_buf(&c, &bo), kc_int(&c, K), kc_int(&c, act);
    kc_arg(&c, sizeof(cl_mem), &bp.m), kc_int(&c, n_part), kc_float(&c, 1e-6f);
    size_t lws = 256, g = (size_t)N / 32 * lws;
    const int rc = kc_run(&c, 1, &g, &lws);
    NM_CHECK(rc == 0);
    float *y = malloc(sizeof(float) * (size_t)N);
    double *ref = malloc(sizeof(double) * (size_t)N);
    for (int n = 0; n < N; n++) {
        double a = 0, u = 0;
        for (int k = 0; k < K; k++) a += (double)dg[(size_t)n * K + k] * xr[k], u += (double)du[(size_t)n * K + k] * xr[k];
        ref[n] = act_ref(a * factor, act) * (u * factor);
    }
    if (rc == 0) {
        NM_CHECK(dbuf_read(&by, y) == 0);
        CHECK_REL(y, ref, (size_t)N, 1e-5, "mvq_glu_q4_0 K=%d N=%d act=%d n_part=%d", K, N, act, n_part);
        uint8_t *o8 = malloc((size_t)N + (size_t)N / 32 * 8);
        NM_CHECK(dbuf_read(&bo, o8) == 0);
        const int bad = check_x8(y, o8, N);
        if (bad) fprintf(stderr, "  mvq_glu_q4_0 K=%d N=%d: %d values of h's x8 off\n", K, N, bad);
        NM_CHECK(bad == 0);
        free(o8);
    }
    dbuf_free(&bq), dbuf_free(&bo), dbuf_free(&bg), dbuf_free(&bu), dbuf_free(&by), dbuf_free(&bp);
    free(x), free(xr), free(x8), free(dg), free(du), free(wg), free(wu), free(rg), free(ru), free(y), free(ref);
}

// The largest work-group the device runs a kernel in (its registers may allow
// less than the device's maximum).
static size_t kernel_max_wg(const char *name) {
    cl_int e;
    cl_kernel k = cl.api.clCreateKernel(cl.prog, name, &e);
    size_t n = 0;
    if (k && e == CL_SUCCESS) cl.api.clGetKernelWorkGroupInfo(k, cl.dev, CL_KERNEL_WORK_GROUP_SIZE, sizeof n, &n, NULL);
    if (k) cl.api.clReleaseKernel(k);
    return n;
}

// mvq_res_q4_0, then mvq_q4_0 on what it leaves (the residual add and an RMS
// norm between two matvecs, with no launch of their own): y = W x within
// 1e-5 of the f64 sum, s = a + y bit for bit (in place: S is A), the x8 of
// s w (check_x8), the pieces summing to sum s^2, and the next matvec equal
// to W2 (s w / sqrt(mean s^2 + eps)) as rounded to 8 bits, within 1e-5.
// The counters of work-groups a block (R < 32 rows a work-group) end at 0.
static void check_mvq_res(int *nmtest_failed, int K, int N, int has_w, size_t lws) {
    const float eps = 1e-5f;
    float *x = malloc(sizeof(float) * (size_t)K), *xr = malloc(sizeof(float) * (size_t)K), *dw, *d2;
    float *a = malloc(sizeof(float) * (size_t)N), *wn = malloc(sizeof(float) * (size_t)N);
    fill(x, (size_t)K, 1.0f), fill(a, (size_t)N, 2.0f), fill(wn, (size_t)N, 1.5f);
    uint8_t *x8 = make_x8(x, K, xr);
    const int N2 = 40; // the next matvec's rows
    uint8_t *w = make_weights(NM_TYPE_Q4_0, K, N, &dw), *r = repack_q4_0(w, K, N);
    uint8_t *w2 = make_weights(NM_TYPE_Q4_0, N, N2, &d2), *r2 = repack_q4_0(w2, N, N2);
    const size_t x8n = (size_t)N + (size_t)N / 32 * 8;
    dbuf bq = dbuf_new(x8, (size_t)K + (size_t)K / 32 * 8, 64), bo = dbuf_new(NULL, x8n, 32);
    dbuf bw = dbuf_new(r, (size_t)K / 32 * 18 * N, 0), bw2 = dbuf_new(r2, (size_t)N / 32 * 18 * N2, 0);
    dbuf by = dbuf_new(NULL, sizeof(float) * (size_t)N, 8), ba = dbuf_new(a, sizeof(float) * (size_t)N, 4);
    const int n_part = N / 32;
    float *zeros = calloc(2 * (size_t)n_part, sizeof(float)); // the pieces, then the counters at 0
    dbuf bn = dbuf_new(wn, sizeof(float) * (size_t)N, 0), bp = dbuf_new(zeros, sizeof(float) * 2 * (size_t)n_part, 0);
    dbuf by2 = dbuf_new(NULL, sizeof(float) * (size_t)N2, 0);
    kcall c = kc_begin("mvq_res_q4_0");
    kc_arg(&c, sizeof(cl_mem), &bw.m), kc_int(&c, N), kc_buf(&c, &bq), kc_buf(&c, &by), kc_buf(&c, &ba);
    kc_buf(&c, &ba), kc_buf(&c, &bn), kc_int(&c, has_w), kc_buf(&c, &bo), kc_arg(&c, sizeof(cl_mem), &bp.m);
    kc_int(&c, n_part), kc_int(&c, K);
    const int split = cl.ptx ? geom.mvs_split : 1;
    size_t g = (size_t)N / ((size_t)geom.mvs_rpw * lws / 32 / (size_t)split) * lws; // R rows a work-group
    int rc = kc_run(&c, 1, &g, &lws);
    NM_CHECK(rc == 0);
    kcall c2 = kc_begin("mvq_q4_0");
    kc_arg(&c2, sizeof(cl_mem), &bw2.m), kc_arg(&c2, sizeof(cl_mem), &bw2.m), kc_arg(&c2, sizeof(cl_mem), &bw2.m);
    kc_int(&c2, N2), kc_int(&c2, 0), kc_int(&c2, 0), kc_buf(&c2, &bo);
    kc_buf(&c2, &by2), kc_buf(&c2, &by2), kc_buf(&c2, &by2), kc_int(&c2, N);
    kc_arg(&c2, sizeof(cl_mem), &bp.m), kc_int(&c2, n_part), kc_float(&c2, eps);
    kc_no_rope(&c2, &bp);
    size_t lws2 = mvq_lws(128), g2 = (size_t)(N2 + geom.mvq_rows - 1) / geom.mvq_rows * lws2;
    if (rc == 0) rc = kc_run(&c2, 1, &g2, &lws2);
    NM_CHECK(rc == 0);
    if (rc == 0) {
        float *y = malloc(sizeof(float) * (size_t)N), *sd = malloc(sizeof(float) * (size_t)N);
        float *h = malloc(sizeof(float) * (size_t)N), *hr = malloc(sizeof(float) * (size_t)N);
        float *parts = malloc(sizeof(float) * 2 * (size_t)n_part), *y2 = malloc(sizeof(float) * (size_t)N2);
        double *ref = malloc(sizeof(double) * (size_t)N), *ref2 = malloc(sizeof(double) * (size_t)N2);
        uint8_t *o8 = malloc(x8n);
        NM_CHECK(dbuf_read(&by, y) == 0 && dbuf_read(&ba, sd) == 0 && dbuf_read(&bo, o8) == 0 &&
                 dbuf_read(&bp, parts) == 0 && dbuf_read(&by2, y2) == 0);
        for (int n = 0; n < N; n++) {
            double t = 0;
            for (int k = 0; k < K; k++) t += (double)dw[(size_t)n * K + k] * xr[k];
            ref[n] = t;
        }
        CHECK_REL(y, ref, (size_t)N, 1e-5, "mvq_res_q4_0 K=%d N=%d lws=%zu: y", K, N, lws);
        int bad_s = 0;
        double ss = 0, sp = 0;
        for (int n = 0; n < N; n++) {
            bad_s += sd[n] != a[n] + y[n];
            ss += (double)sd[n] * sd[n];
            h[n] = has_w ? sd[n] * wn[n] : sd[n];
        }
        for (int i = 0; i < n_part; i++) sp += parts[i];
        if (bad_s) fprintf(stderr, "  mvq_res_q4_0 K=%d N=%d: %d sums a + y off\n", K, N, bad_s);
        NM_CHECK(bad_s == 0);
        int counted = 0; // the counters of work-groups a block, back at 0 for the next launch
        for (int i = 0; i < n_part; i++) {
            int32_t v;
            memcpy(&v, &parts[n_part + i], 4);
            counted += v != 0;
        }
        if (counted) fprintf(stderr, "  mvq_res_q4_0 K=%d N=%d lws=%zu: %d counters not back at 0\n", K, N, lws, counted);
        NM_CHECK(counted == 0);
        NM_CHECK(fabs(sp - ss) <= 1e-5 * ss);
        const int bad = check_x8(h, o8, N);
        if (bad) fprintf(stderr, "  mvq_res_q4_0 K=%d N=%d: %d values of the norm's x8 off\n", K, N, bad);
        NM_CHECK(bad == 0);
        for (int b = 0; b < N / 32; b++) { // the next matvec's input: the rounding as the kernel wrote it
            float ds[2];
            memcpy(ds, o8 + N + 8 * b, 8);
            for (int i = 0; i < 32; i++) hr[32 * b + i] = (float)(int8_t)o8[32 * b + i] * ds[0];
        }
        const double factor = 1 / sqrt((double)(float)sp / N + eps);
        for (int n = 0; n < N2; n++) {
            double t = 0;
            for (int k = 0; k < N; k++) t += (double)d2[(size_t)n * N + k] * hr[k];
            ref2[n] = t * factor;
        }
        CHECK_REL(y2, ref2, (size_t)N2, 1e-5, "mvq_q4_0 after mvq_res_q4_0 K=%d N=%d", K, N);
        free(y), free(sd), free(h), free(hr), free(parts), free(y2), free(ref), free(ref2), free(o8);
    }
    dbuf_free(&bq), dbuf_free(&bo), dbuf_free(&bw), dbuf_free(&bw2), dbuf_free(&by), dbuf_free(&ba);
    dbuf_free(&bn), dbuf_free(&bp), dbuf_free(&by2);
    free(zeros), free(x), free(xr), free(a), free(wn), free(x8), free(dw), free(d2), free(w), free(r), free(w2), free(r2);
}

NM_TEST(mvq_x8_matvecs) {
    CL_READY();
    const int qkv[3] = {64, 16, 16}, odd[3] = {37, 5, 1}, one[1] = {96};
    check_mvq(nmtest_failed, 4096, qkv, 3, 128, 0); // Q, K and V shaped: three matrices in one launch
    check_mvq(nmtest_failed, 32 * 7, odd, 3, 32, 0); // odd rows: a group's second row past the matrix
    check_mvq(nmtest_failed, 32 * 300, one, 1, 64, 0); // blocks past a step's last (items left idle)
    check_mvq(nmtest_failed, 32 * 7, odd, 2, 128, 0);
    check_mvq(nmtest_failed, 4096, qkv, 3, 128, 4096 / 32); // after mvq_res_q4_0: the norm's factor
    check_mvq(nmtest_failed, 32 * 300, one, 1, 64, 300);     // more pieces than items
    check_mvq_glu(nmtest_failed, 4096, 64, 0, 0);   // SiLU
    check_mvq_glu(nmtest_failed, 32 * 7, 96, 1, 0); // GELU (tanh); 7 blocks: items idle, a partial step
    check_mvq_glu(nmtest_failed, 32 * 300, 64, 0, 300); // the norm's factor, more pieces than items
    // A block of 32 rows a work-group (lws = 1024 / rpw), or with PTX fewer: the
    // block's work-groups count themselves and the last one finishes it.
    for (size_t lws = 32; lws * (size_t)geom.mvs_rpw <= 1024; lws *= 2) {
        if ((lws * (size_t)geom.mvs_rpw < 1024 && !cl.ptx) || (cl.ptx && lws / 32 < (size_t)geom.mvs_split)) continue;
        if (lws > kernel_max_wg("mvq_res_q4_0")) {
            fprintf(stderr, "  mvq_res_q4_0 in work-groups of %zu: more than the kernel allows here\n", lws);
            break;
        }
        check_mvq_res(nmtest_failed, 4096, 256, 1, lws);
        check_mvq_res(nmtest_failed, 32 * 7, 96, 0, lws); // no norm weight; 7 blocks: items idle
    }
}

// ---- norms --------------------------------------------------------------------------------

// rms_norm (layer = 0) or layer_norm (layer = 1) of rows x d, in place or not.
// add (rms_norm only): x = xa + xb is computed by the kernel and written to
// X (the fused residual add), bit-exact, before the norm of it.
static int check_x8(const float *v, const uint8_t *x8, int K);

// q8 (rms_norm, one row): the x8 of the output too (check_x8).
static void check_norm(int *nmtest_failed, int layer, int rows, int d, size_t lws, int has_w, int has_b,
                       int in_place, int add, int q8) {
    const size_t n = (size_t)rows * d;
    float *x = malloc(sizeof(float) * n), *w = malloc(sizeof(float) * d), *b = malloc(sizeof(float) * d);
    float *y = malloc(sizeof(float) * n), *xa = malloc(sizeof(float) * n), *xb = malloc(sizeof(float) * n);
    double *ref = malloc(sizeof(double) * n);
    fill(x, n, 2.0f), fill(w, (size_t)d, 1.0f), fill(b, (size_t)d, 1.0f);
    for (int i = 0; i < d; i++) x[i] += 3.0f; // a row with a mean far from 0
    fill(xa, n, 1.0f);
    for (size_t i = 0; i < n; i++) xb[i] = x[i] - xa[i], x[i] = add ? xa[i] + xb[i] : x[i];
    const float eps = 1e-5f;
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * d;
        double mean = 0, ss = 0;
        if (layer)
            for (int i = 0; i < d; i++) mean += xr[i] / (double)d;
        for (int i = 0; i < d; i++) ss += (xr[i] - mean) * (xr[i] - mean);
        const double sc = 1.0 / sqrt(ss / d + eps);
        for (int i = 0; i < d; i++)
            ref[(size_t)r * d + i] = (xr[i] - mean) * sc * (has_w ? w[i] : 1.0) + (has_b ? b[i] : 0.0);
    }
    dbuf bx = dbuf_new(add ? NULL : x, sizeof(float) * n, 16), bw = dbuf_new(w, sizeof(float) * d, 4);
    dbuf bb = dbuf_new(b, sizeof(float) * d, 8), by = in_place ? bx : dbuf_new(NULL, sizeof(float) * n, 28);
    dbuf ba = dbuf_new(xa, sizeof(float) * n, 12), bb2 = dbuf_new(xb, sizeof(float) * n, 20);
    dbuf bq = dbuf_new(NULL, (size_t)d + (size_t)d / 32 * 8, 32);
    kcall c = kc_begin(layer ? "layer_norm" : "rms_norm");
    kc_buf(&c, &bx), kc_buf(&c, &bw), kc_int(&c, has_w);
    if (layer) kc_buf(&c, &bb), kc_int(&c, has_b);
    kc_buf(&c, &by), kc_int(&c, d), kc_float(&c, eps);
    if (!layer) kc_buf(&c, &ba), kc_buf(&c, &bb2), kc_int(&c, add), kc_buf(&c, &bq), kc_int(&c, q8);
    size_t g = (size_t)rows * lws;
    int rc = kc_run(&c, 1, &g, &lws);
    NM_CHECK(rc == 0);
    if (rc == 0) {
        NM_CHECK(dbuf_read(&by, y) == 0);
        CHECK_REL(y, ref, n, 1e-5, "%s d=%d lws=%zu w=%d b=%d in_place=%d add=%d", layer ? "layer_norm" : "rms_norm",
                  d, lws, has_w, has_b, in_place, add);
        if (q8) { // y as 8-bit blocks, read before the sum overwrites y below
            uint8_t *x8 = malloc((size_t)d + (size_t)d / 32 * 8);
            NM_CHECK(dbuf_read(&bq, x8) == 0);
            const int bad = check_x8(y, x8, d);
            if (bad) fprintf(stderr, "  rms_norm d=%d: %d values of the x8 off\n", d, bad);
            NM_CHECK(bad == 0);
            free(x8);
        }
        if (add && !in_place) { // the sum itself, as the add op writes it
            NM_CHECK(dbuf_read(&bx, y) == 0);
            NM_CHECK(memcmp(y, x, sizeof(float) * n) == 0);
        }
    }
    dbuf_free(&bx), dbuf_free(&bw), dbuf_free(&bb), dbuf_free(&ba), dbuf_free(&bb2), dbuf_free(&bq);
    if (!in_place) dbuf_free(&by);
    free(x), free(w), free(b), free(y), free(ref), free(xa), free(xb);
}

NM_TEST(rms_norm) {
    CL_READY();
    check_norm(nmtest_failed, 0, 3, 768, 64, 1, 0, 0, 0, 0);
    check_norm(nmtest_failed, 0, 3, 768, 256, 1, 0, 1, 0, 0);
    check_norm(nmtest_failed, 0, 4, 100, 32, 0, 0, 1, 0, 0);
    check_norm(nmtest_failed, 0, 1, 4096, 128, 1, 0, 0, 0, 0);
    check_norm(nmtest_failed, 0, 2, 101, 64, 1, 0, 0, 0, 0); // not whole float4s: the scalar tail
    // with the residual add before it (the backend fuses an add and the norm of its sum)
    check_norm(nmtest_failed, 0, 3, 768, 64, 1, 0, 0, 1, 0);
    check_norm(nmtest_failed, 0, 2, 101, 64, 1, 0, 0, 1, 0);
    check_norm(nmtest_failed, 0, 4, 4096, 256, 0, 0, 1, 1, 0);
    // one row, also rounded to 8 bits for the matvecs after it (the x8 path)
    check_norm(nmtest_failed, 0, 1, 4096, 256, 1, 0, 0, 1, 1);
    check_norm(nmtest_failed, 0, 1, 96, 32, 1, 0, 1, 0, 1);
}

NM_TEST(layer_norm) {
    CL_READY();
    check_norm(nmtest_failed, 1, 3, 768, 64, 1, 1, 0, 0, 0);
    check_norm(nmtest_failed, 1, 3, 768, 256, 1, 1, 1, 0, 0);
    check_norm(nmtest_failed, 1, 2, 100, 32, 0, 1, 1, 0, 0);
    check_norm(nmtest_failed, 1, 2, 1000, 128, 1, 0, 0, 0, 0);
    check_norm(nmtest_failed, 1, 2, 64, 64, 0, 0, 0, 0, 0);
}

// ---- rope ---------------------------------------------------------------------------------

// The CPU backend's op_rope on x [n_tok, nh, hd]: float angles, powf/cosf/sinf.
static void rope_ref(const float *x, double *ref, int n_tok, int nh, int hd, const int *pos, int mode, int n_rot,
                     float base, float fscale) {
    for (size_t i = 0; i < (size_t)n_tok * nh * hd; i++) ref[i] = x[i];
    for (int t = 0; t < n_tok; t++) {
        const float p = (float)pos[t] * fscale;
        for (int h = 0; h < nh; h++)
            for (int i = 0; i < n_rot / 2; i++) {
                const float theta = p * powf(base, -2.0f * (float)i / (float)n_rot);
                const double c = cosf(theta), s = sinf(theta);
                const size_t o = ((size_t)t * nh + h) * hd;
                const int a = mode == 2 ? i : 2 * i, b = mode == 2 ? i + n_rot / 2 : 2 * i + 1;
                ref[o + a] = x[o + a] * c - x[o + b] * s;
                ref[o + b] = x[o + a] * s + x[o + b] * c;
            }
    }
}

// mvq_q4_0 with rope = 1: one token's Q (4 heads), K and V (2 heads each) of
// one x8 input in one launch, Q's and K's pairs turned as rope_ref turns the
// f64 products (within 1e-5 of the largest), K and V at row Pos[0] of the
// caches as the f16 rounding of what the kernel wrote to Y1 and Y2 (every
// other cache byte untouched); all of head_dim turned and only its first half.
NM_TEST(mvq_with_rope_and_kv_store) {
    CL_READY();
    const int K = 256, hd = 64, nq = 4, nkv = 2, pos = 37, n_ctx = 48, Ns[3] = {nq * hd, nkv * hd, nkv * hd};
    for (int n_rot = hd; n_rot >= hd / 2; n_rot /= 2) {
        float *x = malloc(sizeof(float) * K), *xr = malloc(sizeof(float) * K), *deq[3];
        fill(x, (size_t)K, 1.0f);
        uint8_t *x8 = make_x8(x, K, xr), *w[3], *r[3];
        dbuf bq = dbuf_new(x8, (size_t)K + (size_t)K / 32 * 8, 64), bw[3], by[3];
        for (int m = 0; m < 3; m++) {
            w[m] = make_weights(NM_TYPE_Q4_0, K, Ns[m], &deq[m]), r[m] = repack_q4_0(w[m], K, Ns[m]);
            bw[m] = dbuf_new(r[m], (size_t)K / 32 * 18 * Ns[m], 0), by[m] = dbuf_new(NULL, sizeof(float) * Ns[m], 4 * m);
        }
        const size_t cache = (size_t)n_ctx * nkv * hd;
        uint16_t *ones = malloc(2 * cache);
        memset(ones, 0xff, 2 * cache);
        dbuf bk = dbuf_new(ones, 2 * cache, 0), bv = dbuf_new(ones, 2 * cache, 0), bpos = dbuf_new(&pos, 4, 8);
        kcall c = kc_begin("mvq_q4_0");
        for (int m = 0; m < 3; m++) kc_arg(&c, sizeof(cl_mem), &bw[m].m);
        for (int m = 0; m < 3; m++) kc_int(&c, Ns[m]);
        kc_buf(&c, &bq);
        for (int m = 0; m < 3; m++) kc_buf(&c, &by[m]);
        kc_int(&c, K), kc_arg(&c, sizeof(cl_mem), &bq.m), kc_int(&c, 0), kc_float(&c, 0.0f);
        kc_int(&c, 1), kc_buf(&c, &bpos), kc_int(&c, hd), kc_int(&c, n_rot), kc_float(&c, 10000.0f), kc_float(&c, 1.0f);
        kc_buf(&c, &bk), kc_buf(&c, &bv);
        size_t lws = mvq_lws(128), g = (size_t)(Ns[0] + Ns[1] + Ns[2]) / geom.mvq_rows * lws;
        const int rc = kc_run(&c, 1, &g, &lws);
        NM_CHECK(rc == 0);
        if (rc == 0) {
            float *y[3];
            uint16_t *kc = malloc(2 * cache), *vc = malloc(2 * cache);
            for (int m = 0; m < 3; m++) {
                y[m] = malloc(sizeof(float) * Ns[m]);
                NM_CHECK(dbuf_read(&by[m], y[m]) == 0);
                float *prod = malloc(sizeof(float) * Ns[m]);
                double *ref = malloc(sizeof(double) * Ns[m]);
                for (int n = 0; n < Ns[m]; n++) {
                    double t = 0;
                    for (int k = 0; k < K; k++) t += (double)deq[m][(size_t)n * K + k] * xr[k];
                    prod[n] = (float)t;
                }
                if (m < 2) rope_ref(prod, ref, 1, Ns[m] / hd, hd, &pos, 0, n_rot, 10000.0f, 1.0f);
                else
                    for (int n = 0; n < Ns[m]; n++) ref[n] = prod[n];
                CHECK_REL(y[m], ref, (size_t)Ns[m], 1e-5, "mvq_q4_0 with rope, matrix %d, n_rot %d", m, n_rot);
                free(prod), free(ref);
            }
            NM_CHECK(dbuf_read(&bk, kc) == 0 && dbuf_read(&bv, vc) == 0);
            int bad = 0;
            for (size_t i = 0; i < cache; i++) {
                const bool row = i / (size_t)(nkv * hd) == (size_t)pos;
                const size_t e = i % (size_t)(nkv * hd);
                bad += kc[i] != (row ? nm_fp32_to_fp16(y[1][e]) : 0xffff);
                bad += vc[i] != (row ? nm_fp32_to_fp16(y[2][e]) : 0xffff);
            }
            if (bad) fprintf(stderr, "  mvq_q4_0 with rope, n_rot %d: %d cache values off\n", n_rot, bad);
            NM_CHECK(bad == 0);
            for (int m = 0; m < 3; m++) free(y[m]);
            free(kc), free(vc);
        }
        for (int m = 0; m < 3; m++) dbuf_free(&bw[m]), dbuf_free(&by[m]), free(w[m]), free(r[m]), free(deq[m]);
        dbuf_free(&bq), dbuf_free(&bk), dbuf_free(&bv), dbuf_free(&bpos);
        free(x), free(xr), free(x8), free(ones);
    }
}

// Q (3 heads) and K (2 heads) rotated in one launch, as the backend pairs them.
NM_TEST(rope_two_tensors_in_one_launch) {
    CL_READY();
    const int n_tok = 3, hd = 64, nq = 3, nk = 2, n_rot = 48, pos[3] = {1, 9, 40};
    const size_t n1 = (size_t)n_tok * nq * hd, n2 = (size_t)n_tok * nk * hd;
    float *q = malloc(sizeof(float) * n1), *k = malloc(sizeof(float) * n2), *y = malloc(sizeof(float) * n1);
    double *r1 = malloc(sizeof(double) * n1), *r2 = malloc(sizeof(double) * n2);
    for (int mode = 0; mode <= 2; mode += 2) {
        fill(q, n1, 1.0f), fill(k, n2, 2.0f);
        rope_ref(q, r1, n_tok, nq, hd, pos, mode, n_rot, 10000.0f, 1.0f);
        rope_ref(k, r2, n_tok, nk, hd, pos, mode, n_rot, 10000.0f, 1.0f);
        dbuf bq = dbuf_new(q, sizeof(float) * n1, 20), bk = dbuf_new(k, sizeof(float) * n2, 36);
        dbuf bp = dbuf_new(pos, sizeof pos, 12);
        kcall c = kc_begin("rope");
        kc_buf(&c, &bq), kc_buf(&c, &bp), kc_int(&c, nq), kc_int(&c, hd), kc_int(&c, n_rot), kc_int(&c, mode);
        kc_float(&c, 10000.0f), kc_float(&c, 1.0f);
        kc_buf(&c, &bk), kc_int(&c, nk), kc_int(&c, 0);
        size_t g[3] = {round_up((size_t)n_rot / 2, 8), (size_t)(nq + nk), (size_t)n_tok};
        int rc = kc_run(&c, 3, g, NULL);
        NM_CHECK(rc == 0);
        if (rc == 0) {
            NM_CHECK(dbuf_read(&bq, y) == 0);
            CHECK_REL(y, r1, n1, 1e-5, "Q, mode %d", mode);
            NM_CHECK(dbuf_read(&bk, y) == 0);
            CHECK_REL(y, r2, n2, 1e-5, "K, mode %d", mode);
        }
        dbuf_free(&bq), dbuf_free(&bk), dbuf_free(&bp);
    }
    free(q), free(k), free(y), free(r1), free(r2);
}

// Q's and K's ropes and the KV store in one launch (rope_kv): Q and K
// within 1e-5 of the reference rotation (elements past n_rot untouched), the
// cache rows at the positions the f16 rounding (to nearest even) of the K it
// wrote and of V, every other row untouched; partial rotation, both modes.
NM_TEST(rope_and_kv_store_in_one_launch) {
    CL_READY();
    const int n_tok = 3, hd = 64, nq = 4, nk = 2, n_ctx = 48, pos[3] = {1, 9, 40}, width = nk * hd;
    const size_t n1 = (size_t)n_tok * nq * hd, n2 = (size_t)n_tok * width, nc = (size_t)n_ctx * width;
    float *q = malloc(sizeof(float) * n1), *k = malloc(sizeof(float) * n2), *v = malloc(sizeof(float) * n2);
    float *y = malloc(sizeof(float) * n1), *ky = malloc(sizeof(float) * n2);
    uint16_t *kc = malloc(2 * nc), *vc = malloc(2 * nc);
    double *r1 = malloc(sizeof(double) * n1), *r2 = malloc(sizeof(double) * n2);
    for (int ci = 0; ci < 3; ci++) {
        const int mode = ci == 1 ? 2 : 0, n_rot = ci == 2 ? 48 : 64;
        fill(q, n1, 1.0f), fill(k, n2, 2.0f), fill(v, n2, 1.5f);
        rope_ref(q, r1, n_tok, nq, hd, pos, mode, n_rot, 10000.0f, 1.0f);
        rope_ref(k, r2, n_tok, nk, hd, pos, mode, n_rot, 10000.0f, 1.0f);
        dbuf bq = dbuf_new(q, sizeof(float) * n1, 20), bk = dbuf_new(k, sizeof(float) * n2, 36);
        dbuf bv = dbuf_new(v, sizeof(float) * n2, 4), bp = dbuf_new(pos, sizeof pos, 12);
        dbuf bkc = dbuf_new(NULL, 2 * nc, 64), bvc = dbuf_new(NULL, 2 * nc, 96);
        kcall c = kc_begin("rope_kv");
        kc_buf(&c, &bq), kc_buf(&c, &bp), kc_int(&c, nq), kc_int(&c, hd), kc_int(&c, n_rot), kc_int(&c, mode);
        kc_float(&c, 10000.0f), kc_float(&c, 1.0f);
        kc_buf(&c, &bk), kc_int(&c, nk), kc_buf(&c, &bv), kc_buf(&c, &bkc), kc_buf(&c, &bvc);
        size_t g[3] = {round_up((size_t)hd / 2, 8), (size_t)(nq + 2 * nk), (size_t)n_tok};
        int rc = kc_run(&c, 3, g, NULL);
        NM_CHECK(rc == 0);
        if (rc == 0) {
            NM_CHECK(dbuf_read(&bq, y) == 0);
            CHECK_REL(y, r1, n1, 1e-5, "rope_kv Q, mode %d n_rot %d", mode, n_rot);
            NM_CHECK(dbuf_read(&bk, ky) == 0);
            CHECK_REL(ky, r2, n2, 1e-5, "rope_kv K, mode %d n_rot %d", mode, n_rot);
            int untouched = 1, cache_ok = 1;
            for (int r = 0; r < n_tok * nq; r++)
                for (int i = n_rot; i < hd; i++) untouched &= y[(size_t)r * hd + i] == q[(size_t)r * hd + i];
            NM_CHECK(dbuf_read(&bkc, kc) == 0 && dbuf_read(&bvc, vc) == 0);
            for (int row = 0; row < n_ctx; row++) {
                int t = -1;
                for (int u = 0; u < n_tok; u++) t = pos[u] == row ? u : t;
                for (int i = 0; i < width; i++) {
                    const size_t e = (size_t)row * width + i;
                    if (t < 0) cache_ok &= kc[e] == 0xffff && vc[e] == 0xffff; // dbuf_new's fill: not written
                    else cache_ok &= kc[e] == nm_fp32_to_fp16(ky[(size_t)t * width + i]) &&
                                     vc[e] == nm_fp32_to_fp16(v[(size_t)t * width + i]);
                }
            }
            if (!cache_ok) fprintf(stderr, "  rope_kv mode %d n_rot %d: the cache rows differ\n", mode, n_rot);
            NM_CHECK(untouched && cache_ok);
        }
        dbuf_free(&bq), dbuf_free(&bk), dbuf_free(&bv), dbuf_free(&bp), dbuf_free(&bkc), dbuf_free(&bvc);
    }
    free(q), free(k), free(v), free(y), free(ky), free(kc), free(vc), free(r1), free(r2);
}

NM_TEST(rope_norm_and_neox) {
    CL_READY();
    const int n_tok = 4, n_head = 3, hd = 64, pos[4] = {0, 5, 17, 300};
    const size_t n = (size_t)n_tok * n_head * hd;
    float *x = malloc(sizeof(float) * n), *y = malloc(sizeof(float) * n);
    double *ref = malloc(sizeof(double) * n);
    const struct { int mode, n_rot; float base, fscale; } cases[] = {
        {0, 32, 10000.0f, 1.0f}, {2, 32, 10000.0f, 1.0f}, {0, 64, 500000.0f, 0.25f}, {2, 48, 1000000.0f, 1.0f}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int mode = cases[ci].mode, n_rot = cases[ci].n_rot;
        fill(x, n, 1.0f);
        rope_ref(x, ref, n_tok, n_head, hd, pos, mode, n_rot, cases[ci].base, cases[ci].fscale);
        dbuf bx = dbuf_new(x, sizeof(float) * n, 44), bp = dbuf_new(pos, sizeof pos, 12);
        kcall c = kc_begin("rope");
        kc_buf(&c, &bx), kc_buf(&c, &bp), kc_int(&c, n_head), kc_int(&c, hd), kc_int(&c, n_rot), kc_int(&c, mode);
        kc_float(&c, cases[ci].base), kc_float(&c, cases[ci].fscale);
        kc_buf(&c, &bx), kc_int(&c, 0), kc_int(&c, 0); // no second tensor; sec0 (mode 24 only)
        size_t g[3] = {round_up((size_t)n_rot / 2, 8), (size_t)n_head, (size_t)n_tok};
        int rc = kc_run(&c, 3, g, NULL);
        NM_CHECK(rc == 0);
        if (rc == 0) {
            NM_CHECK(dbuf_read(&bx, y) == 0);
            CHECK_REL(y, ref, n, 1e-5, "mode %d n_rot %d", mode, n_rot);
            int untouched = 1; // elements >= n_rot: bit-exact
            for (int r = 0; r < n_tok * n_head; r++)
                for (int i = n_rot; i < hd; i++) untouched &= y[(size_t)r * hd + i] == x[(size_t)r * hd + i];
            NM_CHECK(untouched);
        }
        dbuf_free(&bx), dbuf_free(&bp);
    }
    free(x), free(y), free(ref);
}

// ---- KV cache store -----------------------------------------------------------------------

NM_TEST(kv_store_rounds_to_nearest_even) {
    CL_READY();
    const int width = 96, n_tok = 3, n_ctx = 8, pos[3] = {2, 0, 5};
    const size_t nc = (size_t)width * n_ctx;
    float *src = malloc(sizeof(float) * width * n_tok), *vsrc = malloc(sizeof(float) * width * n_tok);
    fill(src, (size_t)width * n_tok, 3.0f);
    // ties: 1 + 2^-11 -> 1 (even), 1 + 3 * 2^-11 -> 1 + 2^-9 (even), subnormal and overflow edges
    src[0] = 1.0f + ldexpf(1.0f, -11), src[1] = 1.0f + 3.0f * ldexpf(1.0f, -11), src[2] = -1.0f - ldexpf(1.0f, -11);
    src[3] = ldexpf(1.0f, -25) * 3.0f, src[4] = 65519.0f, src[5] = 65520.0f, src[6] = -0.0f, src[7] = 1e-9f;
    for (int i = 0; i < width * n_tok; i++) vsrc[i] = -src[width * n_tok - 1 - i]; // V: other values
    // K's cache then V's, each n_ctx rows; rows not stored keep their bytes
    uint16_t *cache = malloc(sizeof(uint16_t) * 2 * nc), *want = malloc(sizeof(uint16_t) * 2 * nc);
    for (size_t i = 0; i < 2 * nc; i++) cache[i] = want[i] = (uint16_t)(0x1234 + i);
    for (int t = 0; t < n_tok; t++)
        for (int i = 0; i < width; i++) {
            want[pos[t] * width + i] = nm_fp32_to_fp16(src[t * width + i]);
            want[nc + (size_t)pos[t] * width + i] = nm_fp32_to_fp16(vsrc[t * width + i]);
        }
    dbuf bs = dbuf_new(src, sizeof(float) * width * n_tok, 8), bc = dbuf_new(cache, sizeof(uint16_t) * nc, 64);
    dbuf bvs = dbuf_new(vsrc, sizeof(float) * width * n_tok, 4), bvc = dbuf_new(cache + nc, sizeof(uint16_t) * nc, 32);
    dbuf bp = dbuf_new(pos, sizeof pos, 4);
    kcall c = kc_begin("kv_store");
    kc_buf(&c, &bs), kc_buf(&c, &bc), kc_buf(&c, &bvs), kc_buf(&c, &bvc), kc_buf(&c, &bp), kc_int(&c, width);
    size_t g[3] = {round_up((size_t)width, 64), (size_t)n_tok, 2};
    int rc = kc_run(&c, 3, g, NULL);
    NM_CHECK(rc == 0);
    if (rc == 0) {
        NM_CHECK(dbuf_read(&bc, cache) == 0);
        NM_CHECK(dbuf_read(&bvc, cache + nc) == 0);
        int bad = 0;
        for (size_t i = 0; i < 2 * nc; i++)
            if (cache[i] != want[i] && bad++ < 4)
                fprintf(stderr, "  %s cache[%zu] = 0x%04x, want 0x%04x\n", i < nc ? "K" : "V", i % nc, cache[i], want[i]);
        NM_CHECK(bad == 0);
    }
    dbuf_free(&bs), dbuf_free(&bc), dbuf_free(&bvs), dbuf_free(&bvc), dbuf_free(&bp);
    free(src), free(vsrc), free(cache), free(want);
}

// ---- attention ----------------------------------------------------------------------------

// The causal attention of n_tok queries at pos[] over an f16 cache (16 rows,
// or up to the last position), against a double reference. dec > 0: the
// decode kernel attention_dec (one token; NVIDIA's platform) instead, its keys
// split over dec work-groups a head, with the x8 of its output (check_x8) and
// its counters back at 0 after it.
static void check_attention_k(int *nmtest_failed, int dec, int n_head, int n_kv, int hd, int n_tok, const int *pos,
                              int window, float softcap, int max_keys, size_t lws) {
    int n_ctx = 16;
    for (int t = 0; t < n_tok; t++) n_ctx = pos[t] + 1 > n_ctx ? pos[t] + 1 : n_ctx;
    const int kvw = n_kv * hd, qw = n_head * hd;
    const float scale = 1.0f / sqrtf((float)hd);
    float *q = malloc(sizeof(float) * qw * n_tok), *o = malloc(sizeof(float) * qw * n_tok);
    float *kf = malloc(sizeof(float) * kvw * n_ctx), *vf = malloc(sizeof(float) * kvw * n_ctx);
    uint16_t *kh = malloc(sizeof(uint16_t) * kvw * n_ctx), *vh = malloc(sizeof(uint16_t) * kvw * n_ctx);
    double *ref = malloc(sizeof(double) * qw * n_tok), *p = malloc(sizeof(double) * n_ctx);
    fill(q, (size_t)qw * n_tok, 1.0f);
    fill(kf, (size_t)kvw * n_ctx, 1.5f), fill(vf, (size_t)kvw * n_ctx, 1.0f);
    for (int i = 0; i < kvw * n_ctx; i++) {
        kh[i] = nm_fp32_to_fp16(kf[i]), kf[i] = nm_fp16_to_fp32(kh[i]);
        vh[i] = nm_fp32_to_fp16(vf[i]), vf[i] = nm_fp16_to_fp32(vh[i]);
    }
    for (int t = 0; t < n_tok; t++)
        for (int h = 0; h < n_head; h++) {
            const int kvh = h / (n_head / n_kv), lo = window > 0 && pos[t] - window + 1 > 0 ? pos[t] - window + 1 : 0;
            const float *qr = q + (size_t)t * qw + (size_t)h * hd;
            double m = -INFINITY, l = 0;
            for (int j = lo; j <= pos[t]; j++) {
                double s = 0;
                for (int d = 0; d < hd; d++) s += (double)qr[d] * kf[(size_t)j * kvw + kvh * hd + d];
                s *= scale;
                if (softcap > 0) s = softcap * tanh(s / softcap);
                p[j] = s, m = s > m ? s : m;
            }
            for (int j = lo; j <= pos[t]; j++) l += (p[j] = exp(p[j] - m));
            for (int d = 0; d < hd; d++) {
                double a = 0;
                for (int j = lo; j <= pos[t]; j++) a += p[j] * vf[(size_t)j * kvw + kvh * hd + d];
                ref[(size_t)t * qw + h * hd + d] = a / l;
            }
        }
    dbuf bq = dbuf_new(q, sizeof(float) * qw * n_tok, 4), bk = dbuf_new(kh, sizeof(uint16_t) * kvw * n_ctx, 32);
    dbuf bv = dbuf_new(vh, sizeof(uint16_t) * kvw * n_ctx, 96), bp = dbuf_new(pos, sizeof(int) * n_tok, 8);
    dbuf bo = dbuf_new(NULL, sizeof(float) * qw * n_tok, 20), b8 = dbuf_new(NULL, (size_t)qw + (size_t)qw / 32 * 8, 48);
    kcall c = kc_begin(dec ? "attention_dec" : "attention");
    kc_buf(&c, &bq), kc_buf(&c, &bk), kc_buf(&c, &bv), kc_buf(&c, &bp), kc_buf(&c, &bo);
    kc_int(&c, n_head), kc_int(&c, n_kv), kc_int(&c, hd), kc_int(&c, kvw), kc_int(&c, window);
    kc_float(&c, scale), kc_float(&c, softcap);
    cl_mem part = NULL, cnt = NULL;
    int *counts = calloc((size_t)n_head, sizeof(int));
    if (dec) {
        cl_int e1, e2;
        part = cl.api.clCreateBuffer(cl.ctx, CL_MEM_READ_WRITE, sizeof(float) * n_head * dec * (hd + 2), NULL, &e1);
        cnt = cl.api.clCreateBuffer(cl.ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof(int) * n_head, counts, &e2);
        NM_CHECK(e1 == CL_SUCCESS && e2 == CL_SUCCESS);
        kc_buf(&c, &b8), kc_int(&c, 1);
        kc_arg(&c, sizeof(cl_mem), &part), kc_arg(&c, sizeof(cl_mem), &cnt);
    } else {
        kc_int(&c, max_keys);
    }
    size_t g[2] = {(size_t)n_head * lws, dec ? (size_t)dec : (size_t)n_tok}, l[2] = {lws, 1};
    int rc = kc_run(&c, 2, g, l);
    NM_CHECK(rc == 0);
    if (rc == 0 && dec) {
        for (int h = 0; h < n_head; h++) counts[h] = -1;
        NM_CHECK(cl.api.clEnqueueReadBuffer(cl.q, cnt, CL_TRUE, 0, sizeof(int) * n_head, counts, 0, NULL, NULL) ==
                 CL_SUCCESS);
        int left = 0;
        for (int h = 0; h < n_head; h++) left += counts[h] != 0;
        if (left) fprintf(stderr, "  attention_dec split %d: %d counters not back at 0\n", dec, left);
        NM_CHECK(left == 0);
    }
    if (part) cl.api.clReleaseMemObject(part);
    if (cnt) cl.api.clReleaseMemObject(cnt);
    free(counts);
    if (rc == 0) {
        NM_CHECK(dbuf_read(&bo, o) == 0);
        CHECK_REL(o, ref, (size_t)qw * n_tok, 1e-5,
                  "%s heads %d/%d hd %d n_tok %d window %d softcap %g max_keys %d lws %zu split %d",
                  dec ? "attention_dec" : "attention", n_head, n_kv, hd, n_tok, window, softcap, max_keys, lws, dec);
        if (dec) {
            uint8_t *x8 = malloc((size_t)qw + (size_t)qw / 32 * 8);
            NM_CHECK(dbuf_read(&b8, x8) == 0);
            const int bad = check_x8(o, x8, qw);
            if (bad) fprintf(stderr, "  attention_dec hd %d: %d values of the x8 off\n", hd, bad);
            NM_CHECK(bad == 0);
            free(x8);
        }
    }
    dbuf_free(&bq), dbuf_free(&bk), dbuf_free(&bv), dbuf_free(&bp), dbuf_free(&bo), dbuf_free(&b8);
    free(q), free(o), free(kf), free(vf), free(kh), free(vh), free(ref), free(p);
}

static void check_attention(int *nmtest_failed, int n_head, int n_kv, int hd, int n_tok, const int *pos, int window,
                            float softcap, int max_keys, size_t lws) {
    check_attention_k(nmtest_failed, 0, n_head, n_kv, hd, n_tok, pos, window, softcap, max_keys, lws);
}

// The decode attention on warps (NVIDIA's platform only: the kernel needs
// its shuffles): one token, against the same reference.
NM_TEST(attention_decode_on_warps) {
    CL_READY();
    if (!cl.ptx) NM_SKIP("attention_dec is built for NVIDIA's platform only (warp shuffles)");
    const int p1[1] = {12}, p300[1] = {300}, p0[1] = {0};
    // the keys of a head in one work-group, and split over several (the last to finish merging)
    static const int splits[] = {1, 3, 8, 32};
    for (size_t i = 0; i < sizeof splits / sizeof splits[0]; i++) {
        const int sp = splits[i];
        check_attention_k(nmtest_failed, sp, 32, 8, 128, 1, p300, 0, 0.0f, 0, 256); // Llama-3-8B's heads, 301 keys
        check_attention_k(nmtest_failed, sp, 4, 2, 64, 1, p1, 0, 0.0f, 0, 256);     // 2 a lane (13 keys: empty shares at 32)
        check_attention_k(nmtest_failed, sp, 4, 1, 256, 1, p300, 100, 1.5f, 0, 256); // window, softcap, 8 per lane
        check_attention_k(nmtest_failed, sp, 4, 4, 32, 1, p0, 0, 0.0f, 0, 256);      // one key, one element a lane
    }
}

NM_TEST(attention_gqa_window_softcap) {
    CL_READY();
    const int p7[7] = {0, 1, 2, 9, 10, 11, 15}, p1[1] = {12};
    check_attention(nmtest_failed, 4, 1, 64, 7, p7, 0, 0.0f, 16, 64);
    check_attention(nmtest_failed, 4, 2, 64, 7, p7, 3, 0.0f, 16, 32);
    check_attention(nmtest_failed, 4, 2, 256, 7, p7, 0, 0.0f, 16, 128);
    check_attention(nmtest_failed, 4, 1, 256, 7, p7, 3, 1.5f, 16, 256);
    check_attention(nmtest_failed, 4, 2, 64, 7, p7, 1, 0.0f, 16, 64); // every query sees one key
    check_attention(nmtest_failed, 4, 1, 64, 1, p1, 0, 2.0f, 16, 64);
    check_attention(nmtest_failed, 4, 2, 256, 1, p1, 5, 0.0f, 16, 64);
    check_attention(nmtest_failed, 4, 2, 64, 7, p7, 0, 1.0f, 3, 32);  // chunks of 3 keys
    check_attention(nmtest_failed, 4, 1, 256, 7, p7, 6, 0.0f, 4, 64); // chunks, window
    check_attention(nmtest_failed, 4, 4, 36, 7, p7, 0, 0.0f, 16, 32); // no GQA, head_dim not a multiple of 8
    // work-groups of 2+ head_dim items: p V in key groups (4; 3 with items left idle), also in chunks
    check_attention(nmtest_failed, 4, 1, 64, 7, p7, 0, 0.0f, 16, 256);
    check_attention(nmtest_failed, 4, 4, 36, 7, p7, 2, 1.0f, 16, 128);
    check_attention(nmtest_failed, 4, 2, 64, 7, p7, 0, 0.0f, 3, 256);
}

static void check_attention_full(int *nmtest_failed, int n_tok, int n_head, int hd, size_t lws) {
    const int w = n_head * hd;
    const size_t n = (size_t)n_tok * w;
    const float scale = 1.0f / sqrtf((float)hd);
    float *q = malloc(sizeof(float) * n), *k = malloc(sizeof(float) * n), *v = malloc(sizeof(float) * n);
    float *o = malloc(sizeof(float) * n);
    double *ref = malloc(sizeof(double) * n), *p = malloc(sizeof(double) * n_tok);
    fill(q, n, 1.0f), fill(k, n, 1.5f), fill(v, n, 1.0f);
    for (int t = 0; t < n_tok; t++)
        for (int h = 0; h < n_head; h++) {
            double m = -INFINITY, l = 0;
            for (int j = 0; j < n_tok; j++) {
                double s = 0;
                for (int d = 0; d < hd; d++) s += (double)q[(size_t)t * w + h * hd + d] * k[(size_t)j * w + h * hd + d];
                p[j] = s * scale, m = p[j] > m ? p[j] : m;
            }
            for (int j = 0; j < n_tok; j++) l += (p[j] = exp(p[j] - m));
            for (int d = 0; d < hd; d++) {
                double a = 0;
                for (int j = 0; j < n_tok; j++) a += p[j] * v[(size_t)j * w + h * hd + d];
                ref[(size_t)t * w + h * hd + d] = a / l;
            }
        }
    dbuf bq = dbuf_new(q, sizeof(float) * n, 4), bk = dbuf_new(k, sizeof(float) * n, 8);
    dbuf bv = dbuf_new(v, sizeof(float) * n, 12), bo = dbuf_new(NULL, sizeof(float) * n, 16);
    kcall c = kc_begin("attention_full");
    kc_buf(&c, &bq), kc_buf(&c, &bk), kc_buf(&c, &bv), kc_buf(&c, &bo);
    kc_int(&c, n_tok), kc_int(&c, n_head), kc_int(&c, hd), kc_float(&c, scale);
    size_t g[2] = {(size_t)n_head * lws, (size_t)n_tok}, l[2] = {lws, 1};
    int rc = kc_run(&c, 2, g, l);
    NM_CHECK(rc == 0);
    if (rc == 0) {
        NM_CHECK(dbuf_read(&bo, o) == 0);
        CHECK_REL(o, ref, n, 1e-5, "n_tok %d heads %d hd %d lws %zu", n_tok, n_head, hd, lws);
    }
    dbuf_free(&bq), dbuf_free(&bk), dbuf_free(&bv), dbuf_free(&bo);
    free(q), free(k), free(v), free(o), free(ref), free(p);
}

NM_TEST(attention_full) {
    CL_READY();
    check_attention_full(nmtest_failed, 7, 3, 64, 64);
    check_attention_full(nmtest_failed, 40, 2, 72, 32);
    check_attention_full(nmtest_failed, 1, 2, 64, 32);
    check_attention_full(nmtest_failed, 300, 2, 64, 256); // more keys than work-items
    check_attention_full(nmtest_failed, 40, 2, 72, 256);  // p V in 3 key groups
    check_attention_full(nmtest_failed, 1100, 1, 32, 64); // keys in two chunks (NM_ATT_CHUNK 1024)
}

// ---- element-wise -------------------------------------------------------------------------

// One element-wise kernel over n floats: op 0 glu, 1 act, 2 add, 3 scale, 4 softcap.
static void check_ew(int *nmtest_failed, int op, int act, int n, int in_place) {
    static const char *names[] = {"glu", "act", "add", "scale", "softcap"};
    float *a = malloc(sizeof(float) * n), *b = malloc(sizeof(float) * n), *y = malloc(sizeof(float) * n);
    double *ref = malloc(sizeof(double) * n);
    fill(a, (size_t)n, 4.0f), fill(b, (size_t)n, 1.0f);
    a[0] = -100.0f, a[1] = 100.0f, a[2] = 0.0f; // saturated ends
    const float f = 0.37f, cap = 5.0f;
    for (int i = 0; i < n; i++)
        ref[i] = op == 0   ? act_ref(a[i], act) * b[i]
                 : op == 1 ? act_ref(a[i], act)
                 : op == 2 ? (double)a[i] + b[i]
                 : op == 3 ? (double)a[i] * f
                           : cap * tanh(a[i] / (double)cap);
    dbuf ba = dbuf_new(a, sizeof(float) * n, 4), bb = dbuf_new(b, sizeof(float) * n, 8);
    dbuf by = in_place ? ba : dbuf_new(NULL, sizeof(float) * n, 12);
    kcall c = kc_begin(names[op]);
    kc_buf(&c, &ba);
    if (op == 0 || op == 2) kc_buf(&c, &bb);
    kc_buf(&c, &by), kc_int(&c, n);
    if (op <= 1) kc_int(&c, act);
    if (op == 3) kc_float(&c, f);
    if (op == 4) kc_float(&c, cap);
    size_t g = round_up((size_t)n, 64);
    int rc = kc_run(&c, 1, &g, NULL);
    NM_CHECK(rc == 0);
    if (rc == 0) {
        NM_CHECK(dbuf_read(&by, y) == 0);
        CHECK_REL(y, ref, (size_t)n, 1e-5, "%s act %d n %d in_place %d", names[op], act, n, in_place);
    }
    dbuf_free(&ba), dbuf_free(&bb);
    if (!in_place) dbuf_free(&by);
    free(a), free(b), free(y), free(ref);
}

NM_TEST(glu_and_act) {
    CL_READY();
    for (int act = 0; act < 2; act++) check_ew(nmtest_failed, 0, act, 1000, act);
    for (int act = 0; act < 3; act++) check_ew(nmtest_failed, 1, act, 777, act & 1);
}

NM_TEST(add_scale_softcap) {
    CL_READY();
    check_ew(nmtest_failed, 2, 0, 1000, 0);
    check_ew(nmtest_failed, 2, 0, 65, 1);
    check_ew(nmtest_failed, 3, 0, 1000, 1);
    check_ew(nmtest_failed, 4, 0, 513, 0);
}

// ---- bench (opt-in: NM_CL_BENCH=1) ---------------------------------------------------------

static double now_s(void) {
    struct timespec ts;
    timespec_get(&ts, TIME_UTC); // C11: no POSIX clock under -std=c11
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// One line of the bench: kernel `name` over weights bw (rows rows per
// work-group) at each local size from lo to hi, as time and GB/s of `bytes`.
static void bench_row(const char *name, dbuf *bw, dbuf *bx, dbuf *by, int K, int N, int rows, size_t lo, size_t hi,
                      size_t bytes, int iters) {
    printf("  %-9s %6.1f MB:", name, (double)bytes / 1e6);
    for (size_t lws = lo; lws <= hi; lws *= 2) {
        kcall c = kc_begin(name);
        kc_buf(&c, bw), kc_buf(&c, bx), kc_buf(&c, by), kc_buf(&c, by);
        kc_int(&c, 0), kc_int(&c, K), kc_int(&c, N);
        size_t g = (size_t)(N + rows - 1) / rows * lws;
        double t0 = 0;
        for (int it = 0; it <= iters && c.err == CL_SUCCESS; it++) {
            if (it == 1) cl.api.clFinish(cl.q), t0 = now_s(); // the first launch warms up
            c.err = cl.api.clEnqueueNDRangeKernel(cl.q, c.k, 1, NULL, &g, &lws, 0, NULL, NULL);
        }
        if (c.err == CL_SUCCESS) c.err = cl.api.clFinish(cl.q);
        const double dt = (now_s() - t0) / iters;
        cl.api.clReleaseKernel(c.k);
        if (c.err != CL_SUCCESS) printf("  lws %zu: %s", lws, nm_cl_strerror(c.err));
        else printf("  lws %zu: %7.1f us %6.0f GB/s", lws, dt * 1e6, (double)bytes / dt / 1e9);
    }
    printf("\n");
}

// Decode matvec bandwidth: a 4096 x 14336 weight of each type, as GB/s of
// weight bytes read, for local sizes 64, 128 and 256.
NM_TEST_OPTIN(bench_mv, "NM_CL_BENCH") {
    CL_READY();
    const int K = 4096, N = 14336, iters = 50;
    float *x = malloc(sizeof(float) * K);
    fill(x, (size_t)K, 1.0f);
    for (size_t ti = 0; ti < N_WT; ti++) {
        const size_t rb = nm_row_size(wtypes[ti].type, K), bytes = rb * (size_t)N;
        uint8_t *w = malloc(bytes);
        for (size_t i = 0; i < bytes; i++) w[i] = (uint8_t)(urand() * 256);
        for (size_t i = 0; i < bytes / 2; i += 64) w[i] = 0; // keep some f16/f32 values small
        dbuf bw = dbuf_new(w, bytes, 0), bx = dbuf_new(x, sizeof(float) * K, 0), by = dbuf_new(NULL, sizeof(float) * N, 0);
        char name[32];
        snprintf(name, sizeof name, "mv_%s", wtypes[ti].name);
        bench_row(name, &bw, &bx, &by, K, N, MV_ROWS, 64, 256, bytes, iters);
        if (wtypes[ti].type == NM_TYPE_Q4_0) { // and repacked
            uint8_t *r = repack_q4_0(w, K, N);
            dbuf br = dbuf_new(r, bytes, 0);
            bench_row("mv_q4_0r", &br, &bx, &by, K, N, MVR_ROWS, 32, 128, bytes, iters);
            bench_row("mv_q4_0r8", &br, &bx, &by, K, N, MVR_ROWS, 32, 128, bytes, iters);
            dbuf_free(&br);
            free(r);
        }
        dbuf_free(&bw), dbuf_free(&bx), dbuf_free(&by);
        free(w);
    }
    free(x);
}

NM_TEST_MAIN()
