// OpenCL backend: the ICD loader opened at run time (cl_api.h), any OpenCL
// 1.2+ device, kernels (kernels*.cl, embedded as one program) built at creation with a
// program-binary cache under ~/.cache/nanomind/opencl. Weights and other host
// memory are imported: wrapped in place (CL_MEM_USE_HOST_PTR on the page-
// aligned range) where the device shares host memory, uploaded once (and
// counted in the ledger) where it does not. Ops are enqueued in order on one
// in-order queue; submit returns once they are queued. The x8 path (decode
// of repacked q4_0 from activations rounded once) is opencl_x8.c; the state
// both files share, opencl_impl.h.
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/opencl/cl_api.h"
#include "backend/opencl/opencl_impl.h"
#include "backend/registry.h"
#include "core/clock.h"
#include "quant/quant.h"
#include "core/fail.h"

extern const unsigned char nm_cl_kernels_source[];
extern const size_t nm_cl_kernels_source_len;

typedef struct cl_event_wrap {
    nm_event base;
    cl_event ev;
} cl_event_wrap;

nm_status ocl_fail(nm_ocl *o, nm_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    nm_vfail(st, o->err, sizeof o->err, NULL, fmt, ap);
    va_end(ap);
    return st;
}

static const char *type_name(uint32_t t) {
    const nm_type_traits *tr = nm_type_traits_get(t);
    return tr ? tr->name : "?";
}

// ---- devices ---------------------------------------------------------------------------

// The index-th device over all platforms, in order.
static int find_device(const nm_cl_api *api, int index, cl_platform_id *plat, cl_device_id *dev, int *count) {
    cl_platform_id ps[16];
    cl_uint np = 0;
    int n = 0, found = -1;
    if (api->clGetPlatformIDs(16, ps, &np) != CL_SUCCESS) np = 0;
    for (cl_uint i = 0; i < np && i < 16; i++) {
        cl_device_id ds[16];
        cl_uint nd = 0;
        if (api->clGetDeviceIDs(ps[i], CL_DEVICE_TYPE_ALL, 16, ds, &nd) != CL_SUCCESS) continue;
        for (cl_uint j = 0; j < nd && j < 16; j++, n++)
            if (n == index) {
                *plat = ps[i];
                *dev = ds[j];
                found = n;
            }
    }
    if (count) *count = n;
    return found;
}

static void dev_str(const nm_cl_api *api, cl_device_id d, cl_device_info what, char *buf, size_t n) {
    buf[0] = '\0';
    if (api->clGetDeviceInfo(d, what, n, buf, NULL) != CL_SUCCESS) buf[0] = '\0';
    buf[n - 1] = '\0';
}

static cl_ulong dev_ulong(const nm_cl_api *api, cl_device_id d, cl_device_info what) {
    cl_ulong v = 0;
    if (api->clGetDeviceInfo(d, what, sizeof v, &v, NULL) != CL_SUCCESS) return 0;
    return v;
}

static bool dev_bool(const nm_cl_api *api, cl_device_id d, cl_device_info what) {
    cl_bool v = CL_FALSE;
    if (api->clGetDeviceInfo(d, what, sizeof v, &v, NULL) != CL_SUCCESS) return false;
    return v == CL_TRUE;
}

// ---- program: build, binary cache ---------------------------------------------------------

static uint64_t fnv1a(uint64_t h, const void *p, size_t n) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

// ~/.cache/nanomind/opencl/<hash>.bin: the hash covers the source, the build
// options, the device and the driver. Empty if HOME is unset.
static void cache_path(const nm_ocl *o, const char *opts, char *path, size_t n) {
    const char *home = getenv("HOME");
    path[0] = '\0';
    if (!home || !*home) return;
    uint64_t h = 0xcbf29ce484222325ull;
    h = fnv1a(h, nm_cl_kernels_source, nm_cl_kernels_source_len);
    h = fnv1a(h, opts, strlen(opts));
    h = fnv1a(h, o->dev_name, strlen(o->dev_name));
    h = fnv1a(h, o->driver, strlen(o->driver));
    snprintf(path, n, "%s/.cache/nanomind/opencl/%016llx.bin", home, (unsigned long long)h);
}

static void mkdirs(const char *path) { // the directories above the file at path
    char tmp[1024];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') {
            *p = '\0';
            (void)mkdir(tmp, 0755);
            *p = '/';
        }
}

static bool build_log(nm_ocl *o, cl_program prog, char *buf, size_t n) {
    size_t len = 0;
    buf[0] = '\0';
    if (o->api.clGetProgramBuildInfo(prog, o->dev, CL_PROGRAM_BUILD_LOG, n - 1, buf, &len) != CL_SUCCESS) return false;
    buf[len < n ? len : n - 1] = '\0';
    return true;
}

// From the cached binary if there is one that builds, else from source (and
// then the binary is cached). NM_OPENCL_FORCE_BUILD_FAIL=1 makes the source
// fail to compile (tests of the fallback path).
static nm_status build_program(nm_ocl *o) {
    // without PTX mvq_res_q4_0 takes a block of 32 rows a work-group: of 1024 /
    // mvs_rpw items, so more rows a group of 32 where the device runs fewer
    if (!o->ptx) o->geom.mvs_split = 1; // (the split's shares meet through warp sums)
    while (!o->ptx && o->geom.mvs_rpw < 4 && (size_t)(1024 / o->geom.mvs_rpw) > o->max_wg) o->geom.mvs_rpw *= 2;
    char opts[256];
    nm_cl_build_opts(&o->geom, o->ptx, opts, sizeof opts);
    char path[1024];
    cache_path(o, opts, path, sizeof path);
    const bool force_fail = getenv("NM_OPENCL_FORCE_BUILD_FAIL") && atoi(getenv("NM_OPENCL_FORCE_BUILD_FAIL")) == 1;
    cl_int e = CL_SUCCESS;
    if (path[0] && !force_fail) {
        char *cached = NULL;
        size_t len = 0;
        if (nm_infile_read(path, 256u << 20, 0, &cached, &len, NULL, 0) == NM_OK) { // (else: built below)
            unsigned char *bin = (unsigned char *)cached;
            if (len > 0) {
                cl_int bst = CL_SUCCESS;
                const unsigned char *bp = bin;
                cl_program p = o->api.clCreateProgramWithBinary(o->ctx, 1, &o->dev, &len, &bp, &bst, &e);
                if (p && e == CL_SUCCESS && bst == CL_SUCCESS &&
                    o->api.clBuildProgram(p, 1, &o->dev, opts, NULL, NULL) == CL_SUCCESS) {
                    o->prog = p;
                } else if (p) {
                    o->api.clReleaseProgram(p);
                }
            }
            free(bin);
            if (o->prog) return NM_OK;
        }
    }
    static const char broken[] = "#error NM_OPENCL_FORCE_BUILD_FAIL is set\n";
    const char *srcs[2] = {broken, (const char *)nm_cl_kernels_source};
    const size_t lens[2] = {sizeof broken - 1, nm_cl_kernels_source_len};
    cl_program p = o->api.clCreateProgramWithSource(o->ctx, force_fail ? 2 : 1, force_fail ? srcs : srcs + 1,
                                                    force_fail ? lens : lens + 1, &e);
    if (!p || e != CL_SUCCESS) return ocl_fail(o, NM_ERR_UNSUPPORTED, "opencl: cannot create the program: %s", nm_cl_strerror(e));
    if ((e = o->api.clBuildProgram(p, 1, &o->dev, opts, NULL, NULL)) != CL_SUCCESS) {
        char log[768];
        build_log(o, p, log, sizeof log);
        for (char *c = log; *c; c++) // one line: the message goes on after it
            if (*c == '\n' || *c == '\r') *c = ' ';
        o->api.clReleaseProgram(p);
        return ocl_fail(o, NM_ERR_UNSUPPORTED, "opencl: the kernels do not build on %s (%s): %s", o->dev_name,
                        nm_cl_strerror(e), log[0] ? log : "no build log");
    }
    o->prog = p;
    if (!path[0]) return NM_OK;
    // cache the binary (best effort: a failure only costs the next start a build)
    size_t bin_size = 0;
    if (o->api.clGetProgramInfo(p, CL_PROGRAM_BINARY_SIZES, sizeof bin_size, &bin_size, NULL) != CL_SUCCESS || !bin_size)
        return NM_OK;
    unsigned char *bin = malloc(bin_size);
    if (bin && o->api.clGetProgramInfo(p, CL_PROGRAM_BINARIES, sizeof bin, &bin, NULL) == CL_SUCCESS) {
        mkdirs(path);
        char tmp[1100];
        snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid());
        FILE *f = fopen(tmp, "wb");
        if (f) {
            bool ok = fwrite(bin, 1, bin_size, f) == bin_size;
            ok = fclose(f) == 0 && ok;
            if (!ok || rename(tmp, path) != 0) (void)unlink(tmp);
        }
    }
    free(bin);
    return NM_OK;
}

static const uint32_t mm_types[] = {NM_TYPE_F32, NM_TYPE_F16, NM_TYPE_Q4_0, NM_TYPE_Q4_1, NM_TYPE_Q5_0,
                                    NM_TYPE_Q8_0, NM_TYPE_Q4_K, NM_TYPE_Q5_K, NM_TYPE_Q6_K, NM_TYPE_MXFP4};

static nm_status make_kernels(nm_ocl *o) {
    static const char *prefix[K_NKINDS] = {"mv_", "mm_", "get_rows_"};
    cl_int e;
    for (int kind = 0; kind < K_NKINDS; kind++)
        for (size_t i = 0; i < sizeof mm_types / sizeof mm_types[0]; i++) {
            const uint32_t t = mm_types[i];
            char name[64];
            snprintf(name, sizeof name, "%s%s", prefix[kind], type_name(t));
            o->typed.k[kind][t] = o->api.clCreateKernel(o->prog, name, &e);
            if (!o->typed.k[kind][t] || e != CL_SUCCESS)
                return ocl_fail(o, NM_ERR_UNSUPPORTED, "opencl: kernel %s: %s", name, nm_cl_strerror(e));
        }
    struct { cl_kernel *k; const char *name; } named[] = {
        {&o->k_rms_norm, "rms_norm"}, {&o->k_layer_norm, "layer_norm"}, {&o->k_rope, "rope"},
        {&o->k_kv_store, "kv_store"}, {&o->k_attention, "attention"},   {&o->k_glu, "glu"},
        {&o->k_act, "act"},           {&o->k_add, "add"},               {&o->k_scale, "scale"},
        {&o->k_softcap, "softcap"},   {&o->k_attention_full, "attention_full"},
        {&o->k_patches, "patches"},   {&o->k_pixel_shuffle, "pixel_shuffle"},
        {&o->k_conv1d, "conv1d"},     {&o->k_conv_t1d, "conv_t1d"},
        {&o->k_mv_q4_0r, "mv_q4_0r"}, {&o->k_mv_q4_0r8, "mv_q4_0r8"},
        {&o->k_mvq, "mvq_q4_0"},      {&o->k_mvq_glu, "mvq_glu_q4_0"},
        {&o->k_mvq_res, "mvq_res_q4_0"}, {&o->k_rope_kv, "rope_kv"}, {&o->k_short_conv, "short_conv"},
    };
    for (size_t i = 0; i < sizeof named / sizeof named[0]; i++) {
        *named[i].k = o->api.clCreateKernel(o->prog, named[i].name, &e);
        if (!*named[i].k || e != CL_SUCCESS)
            return ocl_fail(o, NM_ERR_UNSUPPORTED, "opencl: kernel %s: %s", named[i].name, nm_cl_strerror(e));
    }
    if (o->ptx) { // built with NM_DP4A_PTX: the decode attention on warps
        o->k_attention_dec = o->api.clCreateKernel(o->prog, "attention_dec", &e);
        if (!o->k_attention_dec || e != CL_SUCCESS)
            return ocl_fail(o, NM_ERR_UNSUPPORTED, "opencl: kernel attention_dec: %s", nm_cl_strerror(e));
    }
    return NM_OK;
}

// ---- memory ----------------------------------------------------------------------------

// The device buffer and byte offset of t: a buffer of this backend, or host
// memory inside an imported range.
bool ocl_mem_of(nm_ocl *o, const nm_tensor *t, cl_mem *m, cl_ulong *off) {
    if (t->buf && t->buf->owner == o->self) {
        *m = (cl_mem)t->buf->impl;
        *off = t->offs;
        return t->offs + nm_tensor_bytes(t) <= t->buf->size;
    }
    // host memory: the host's own, or another backend's buffer the host addresses
    const uint8_t *p = t->buf ? t->buf->host : (const uint8_t *)(uintptr_t)t->offs;
    if (!p) return false;
    if (t->buf) p += t->offs;
    const size_t n = nm_tensor_bytes(t);
    for (int i = 0; i < o->n_imports; i++) {
        const cl_import *im = &o->imports[i];
        if (p >= im->base && n <= im->size && (size_t)(p - im->base) <= im->size - n) {
            *m = im->mem;
            *off = (cl_ulong)(p - im->base);
            return true;
        }
    }
    return false;
}

static nm_buffer *ocl_buffer_alloc(nm_backend *b, size_t size) {
    nm_ocl *o = b->impl;
    if (size > o->max_alloc) {
        ocl_fail(o, NM_ERR_NOMEM, "opencl: a buffer of %zu bytes is over the device's limit of %llu", size,
                 (unsigned long long)o->max_alloc);
        return NULL;
    }
    nm_buffer *buf = calloc(1, sizeof *buf);
    if (!buf) return NULL;
    cl_int e;
    const size_t n = size ? size : 64;
    cl_mem m = o->api.clCreateBuffer(o->ctx, CL_MEM_READ_WRITE, n, NULL, &e);
    if (!m || e != CL_SUCCESS) {
        if (m) o->api.clReleaseMemObject(m);
        free(buf);
        ocl_fail(o, NM_ERR_NOMEM, "opencl: out of device memory for %zu bytes (%s)", size, nm_cl_strerror(e));
        return NULL;
    }
    buf->owner = b;
    buf->impl = m;
    buf->size = size;
    buf->host = NULL; // reached through tensor_set/tensor_get
    return buf;
}

static void ocl_buffer_free(nm_backend *b, nm_buffer *buf) {
    nm_ocl *o = b->impl;
    if (!buf) return;
    if (buf->impl) o->api.clReleaseMemObject((cl_mem)buf->impl);
    free(buf);
}

static nm_status ocl_buffer_import_host(nm_backend *b, const void *p, size_t size, bool writable) {
    nm_ocl *o = b->impl;
    if (!p || !size) return ocl_fail(o, NM_ERR_INVALID_ARG, "opencl: import of an empty range");
    const long page = sysconf(_SC_PAGESIZE) > 0 ? sysconf(_SC_PAGESIZE) : 4096;
    const uintptr_t lo = (uintptr_t)p / (uintptr_t)page * (uintptr_t)page;
    const uintptr_t hi = ((uintptr_t)p + size + (uintptr_t)page - 1) / (uintptr_t)page * (uintptr_t)page;
    if (writable && !o->unified)
        return ocl_fail(o, NM_ERR_UNSUPPORTED, "opencl: %s has its own memory: host memory it writes cannot be shared",
                        o->dev_name);
    for (int i = 0; i < o->n_imports; i++) // already imported
        if ((uintptr_t)o->imports[i].base <= lo && lo - (uintptr_t)o->imports[i].base + (hi - lo) <= o->imports[i].size) {
            if (writable && !o->imports[i].writable)
                return ocl_fail(o, NM_ERR_INVALID_ARG, "opencl: host memory imported read-only is now wanted writable");
            return NM_OK;
        }
    if (o->n_imports == NM_CL_MAX_IMPORTS) return ocl_fail(o, NM_ERR_RANGE, "opencl: more than %d imported ranges", NM_CL_MAX_IMPORTS);
    if (hi - lo > o->max_alloc)
        return ocl_fail(o, NM_ERR_NOMEM, "opencl: %zu bytes of host memory are over the device's buffer limit of %llu",
                        (size_t)(hi - lo), (unsigned long long)o->max_alloc);
    cl_int e;
    const cl_mem_flags rw = writable ? CL_MEM_READ_WRITE : CL_MEM_READ_ONLY;
    // Unified: the device reads the pages where they are. Discrete: one upload.
    const cl_mem_flags how = o->unified ? CL_MEM_USE_HOST_PTR : CL_MEM_COPY_HOST_PTR;
    cl_mem m = o->api.clCreateBuffer(o->ctx, rw | how, hi - lo, (void *)lo, &e);
    if (!m || e != CL_SUCCESS)
        return ocl_fail(o, NM_ERR_NOMEM, "opencl: cannot import %zu bytes of host memory (%s)", (size_t)(hi - lo),
                        nm_cl_strerror(e));
    // Zero copy is what the driver does, not what the flag asks: a mapping of
    // the buffer must be the host's own pages, else the driver keeps a copy
    // (some do on unified memory), which a shared (writable) range cannot be.
    bool copied = !o->unified;
    if (!copied) {
        void *mp = o->api.clEnqueueMapBuffer(o->q, m, CL_TRUE, CL_MAP_READ, 0, hi - lo, 0, NULL, NULL, &e);
        if (!mp || e != CL_SUCCESS) {
            o->api.clReleaseMemObject(m);
            return ocl_fail(o, NM_ERR_IO, "opencl: cannot map imported host memory (%s)", nm_cl_strerror(e));
        }
        copied = mp != (void *)lo;
        o->api.clEnqueueUnmapMemObject(o->q, m, mp, 0, NULL, NULL);
        o->api.clFinish(o->q);
        if (copied && writable) {
            o->api.clReleaseMemObject(m);
            return ocl_fail(o, NM_ERR_UNSUPPORTED, "opencl: %s copies host memory it is given: it cannot share it",
                            o->dev_name);
        }
    }
    cl_import *im = &o->imports[o->n_imports++];
    im->base = (const uint8_t *)lo;
    im->size = hi - lo;
    im->mem = m;
    im->copied = copied;
    im->writable = writable;
    if (im->copied) {
        o->bytes_uploaded += im->size;
        nm_ledger_count(o->ledger, o->ep_host, o->ep_dev, im->size);
    } else {
        o->bytes_wrapped += im->size;
    }
    return NM_OK;
}

static nm_status ocl_tensor_rw(nm_backend *b, const nm_tensor *t, size_t offs, void *host, size_t n, bool write) {
    nm_ocl *o = b->impl;
    if (!t->buf || (t->buf->owner != b && t->buf->host)) { // host memory: after the queued work
        cl_int e = o->api.clFinish(o->q);
        if (e != CL_SUCCESS) return ocl_fail(o, NM_ERR_IO, "opencl: %s", nm_cl_strerror(e));
        uint8_t *p = (t->buf ? t->buf->host + t->offs : (uint8_t *)(uintptr_t)t->offs) + offs;
        if (write) memcpy(p, host, n);
        else memcpy(host, p, n);
        return NM_OK;
    }
    if (t->buf->owner != b || t->offs > t->buf->size || offs > t->buf->size - t->offs ||
        n > t->buf->size - t->offs - offs)
        return ocl_fail(o, NM_ERR_INVALID_ARG, "opencl: %zu bytes at %zu are outside the tensor's buffer", n, offs);
    cl_mem m = (cl_mem)t->buf->impl;
    cl_int e = write ? o->api.clEnqueueWriteBuffer(o->q, m, CL_TRUE, t->offs + offs, n, host, 0, NULL, NULL)
                     : o->api.clEnqueueReadBuffer(o->q, m, CL_TRUE, t->offs + offs, n, host, 0, NULL, NULL);
    if (e != CL_SUCCESS) return ocl_fail(o, NM_ERR_IO, "opencl: %s %zu bytes: %s", write ? "writing" : "reading", n, nm_cl_strerror(e));
    return NM_OK;
}

static nm_status ocl_tensor_set(nm_backend *b, const nm_tensor *t, size_t offs, const void *src, size_t n) {
    return ocl_tensor_rw(b, t, offs, (void *)src, n, true);
}

static nm_status ocl_tensor_get(nm_backend *b, const nm_tensor *t, size_t offs, void *dst, size_t n) {
    return ocl_tensor_rw(b, t, offs, dst, n, false);
}

// ---- ops -------------------------------------------------------------------------------

static bool f32(const nm_tensor *t) { return t && t->type == NM_TYPE_F32; }

// The convolutions' rules (backend.h), and the ranges of the kernels' int arguments.
static bool conv_ok(const nm_op *op) {
    int64_t k = 0, ic = 0, oc = 0;
    if (!nm_conv_op_ok(op) || !nm_conv_dims(op, &k, &ic, &oc)) return false;
    const int64_t lim = INT32_MAX / 4; // (t + j dil - pad_l, t + pad and the like stay inside int)
    return op->src0->ne[1] <= lim && op->dst->ne[1] <= lim && ic * oc <= INT32_MAX / 64 && k <= lim &&
           op->i0 <= lim / k && op->i1 <= lim && op->i2 <= lim;
}

// Whether pk is the copy prepare_op made of op's weight for its kind, kernel size and channels.
static bool conv_copy_of(const cl_packed *pk, const nm_op *op) {
    int64_t k = 0, ic = 0, oc = 0;
    nm_conv_dims(op, &k, &ic, &oc);
    return pk && pk->conv && pk->conv_kind == (int32_t)op->kind && pk->conv_k == k && pk->K == k * ic && pk->N == oc;
}

bool ocl_supports_op(const nm_backend *b, const nm_op *op) {
    const nm_ocl *o = b->impl;
    if (op->flags & NM_OPF_GGML_F16) return false; // ggml's f16 rounding is the CPU's
    if (op->kv_rows) return false;                  // caches with shared rows are the CPU's (Whisper's beams)
    switch (op->kind) {
    case NM_OP_MATMUL: {
        const uint32_t t = op->src0->type;
        const nm_type_traits *tr = nm_type_traits_get(t);
        return t < NM_TYPE_COUNT && o->typed.k[K_MV][t] && tr && op->src0->ne[0] % tr->blck_size == 0 &&
               f32(op->src1) && f32(op->dst) && (!op->src2 || f32(op->src2)) && op->src1->ne[0] == op->src0->ne[0];
    }
    case NM_OP_GET_ROWS: {
        const uint32_t t = op->src0->type;
        return t < NM_TYPE_COUNT && o->typed.k[K_GET_ROWS][t] && op->ids && f32(op->dst);
    }
    case NM_OP_ATTENTION:
        return op->i1 > 0 && op->i0 % op->i1 == 0 && op->i2 > 0 && op->i2 <= NM_CL_MAX_HD && op->kv && op->ids;
    case NM_OP_ATTENTION_FULL: return op->i2 > 0 && op->i2 <= NM_CL_MAX_HD;
    case NM_OP_ROPE:
        return op->i3 <= op->i1 && op->i3 % 2 == 0 && op->ids &&
               (op->i2 == NM_ROPE_NORM || op->i2 == NM_ROPE_NEOX ||
                (op->i2 == NM_ROPE_VISION && op->rope_sections[0] >= 0 && op->rope_sections[0] <= op->i3 / 2 &&
                 op->ids->ne[0] * op->ids->ne[1] >= 2 * op->src0->ne[1])); // (M-RoPE: the CPU)
    case NM_OP_KV_STORE: return op->kv && op->ids && op->src0->ne[1] <= op->n_ctx;
    case NM_OP_SHORT_CONV: return nm_short_conv_ok(op);
    case NM_OP_ACT: return op->i0 >= NM_ACT_SILU && op->i0 <= NM_ACT_TANH;
    case NM_OP_CONV1D:
    case NM_OP_CONV_T1D: return conv_ok(op);
    case NM_OP_GLU: return op->i0 == NM_ACT_SILU || op->i0 == NM_ACT_GELU_TANH;
    case NM_OP_RMS_NORM:
    case NM_OP_NORM:
    case NM_OP_ADD:
    case NM_OP_SCALE:
    case NM_OP_SOFTCAP: return true;
    case NM_OP_COPY: return op->src0->type == op->dst->type && nm_tensor_bytes(op->src0) == nm_tensor_bytes(op->dst);
    case NM_OP_PATCHES: {
        const int64_t W = op->i0, H = op->i2 ? op->i2 : op->i0, p = op->i1;
        return f32(op->src0) && p > 0 && W % p == 0 && H % p == 0 && op->dst->ne[0] == 3 * p * p &&
               op->dst->ne[1] == (W / p) * (H / p) && (op->i3 == 0 || (op->i3 == 2 && (W / p) % 2 == 0 && (H / p) % 2 == 0));
    }
    case NM_OP_PIXEL_SHUFFLE:
        return f32(op->src0) && op->i1 > 0 && op->i0 % op->i1 == 0 && op->src0->ne[1] == (int64_t)op->i0 * op->i0 &&
               op->dst->ne[0] == op->src0->ne[0] * op->i1 * op->i1;
    default: return false;
    }
}

// ---- profile (NM_PROFILE=1) -------------------------------------------------------------

// Sums the finished kernels' times (the queue is idle: after clFinish).
static void prof_collect(nm_ocl *o) {
    cl_prof *p = o->prof;
    for (int i = 0; i < p->n_pend; i++) {
        cl_prof_pend *e = &p->pend[i];
        cl_ulong t0 = 0, t1 = 0;
        if (o->api.clGetEventProfilingInfo(e->ev, CL_PROFILING_COMMAND_START, sizeof t0, &t0, NULL) == CL_SUCCESS &&
            o->api.clGetEventProfilingInfo(e->ev, CL_PROFILING_COMMAND_END, sizeof t1, &t1, NULL) == CL_SUCCESS &&
            t1 >= t0) {
            int key = 0;
            while (key < NM_CL_PROF_KEYS - 1 && p->keys[key] && p->keys[key] != e->what) key++;
            p->keys[key] = e->what;
            p->acc[key][e->type].ns += (double)(t1 - t0);
            p->acc[key][e->type].bytes += e->bytes;
            p->acc[key][e->type].calls++;
            p->busy_ns += (double)(t1 - t0);
        }
        o->api.clReleaseEvent(e->ev);
    }
    p->n_pend = 0;
}

static void prof_push(nm_ocl *o, const char *what, cl_event ev) {
    cl_prof *p = o->prof;
    if (p->n_pend == NM_CL_PROF_PEND) { // full: wait for the queue and sum
        o->api.clFinish(o->q);
        prof_collect(o);
    }
    p->pend[p->n_pend++] = (cl_prof_pend){.what = what, .type = p->cur_type, .bytes = p->cur_bytes, .ev = ev};
}

static void prof_print(nm_ocl *o) {
    cl_prof *p = o->prof;
    if (p->busy_ns <= 0) return;
    fprintf(stderr,
            "opencl profile (NM_PROFILE): %.2f ms in kernels (device time)\n%-15s %-6s %9s %10s %9s %6s %8s\n",
            p->busy_ns * 1e-6, "kernel", "weight", "calls", "ms", "us/call", "share", "GB/s");
    for (;;) {
        int bk = -1, bt = -1;
        for (int k = 0; k < NM_CL_PROF_KEYS && p->keys[k]; k++)
            for (int t = 0; t <= NM_TYPE_COUNT; t++)
                if (p->acc[k][t].calls > 0 && (bk < 0 || p->acc[k][t].ns > p->acc[bk][bt].ns)) {
                    bk = k;
                    bt = t;
                }
        if (bk < 0) break;
        const double ns = p->acc[bk][bt].ns, by = p->acc[bk][bt].bytes;
        const int64_t n = p->acc[bk][bt].calls;
        fprintf(stderr, "%-15s %-6s %9lld %10.3f %9.2f %5.1f%% ", p->keys[bk], bt < NM_TYPE_COUNT ? type_name((uint32_t)bt) : "",
                (long long)n, ns * 1e-6, ns * 1e-3 / (double)n, 100 * ns / p->busy_ns);
        if (by > 0) fprintf(stderr, "%8.1f\n", by / ns);
        else fprintf(stderr, "%8s\n", "");
        p->acc[bk][bt].calls = 0;
    }
}

nm_status ocl_launch(nm_ocl *o, cl_kernel k, const char *what, cl_uint dim, const size_t *global,
                     const size_t *local, const karg *args, int n_args) {
    for (int i = 0; i < n_args; i++) {
        cl_int e = o->api.clSetKernelArg(k, (cl_uint)i, args[i].size, args[i].p);
        if (e != CL_SUCCESS) return ocl_fail(o, NM_ERR_IO, "opencl: %s argument %d: %s", what, i, nm_cl_strerror(e));
    }
    for (cl_uint d = 0; d < dim; d++)
        if (global[d] == 0) return NM_OK; // nothing to do
    cl_event ev = NULL;
    cl_int e = o->api.clEnqueueNDRangeKernel(o->q, k, dim, NULL, global, local, 0, NULL, o->prof ? &ev : NULL);
    if (e != CL_SUCCESS) return ocl_fail(o, NM_ERR_IO, "opencl: %s: %s", what, nm_cl_strerror(e));
    if (o->prof) prof_push(o, what, ev);
    return NM_OK;
}

// ---- repacked weights -------------------------------------------------------------------

// The index of the first repacked weight at host address >= h.
static int packed_lower(const nm_ocl *o, const uint8_t *h) {
    int lo = 0, hi = o->n_packed;
    while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (o->packed[mid].host < h) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

// The repacked copy of the weight at host address h, or NULL.
const cl_packed *ocl_packed_find(const nm_ocl *o, const uint8_t *h) {
    const int i = packed_lower(o, h);
    return i < o->n_packed && o->packed[i].host == h ? &o->packed[i] : NULL;
}

// On a device with its own memory, where the weights are uploaded anyway,
// (or with NM_OPENCL_REPACK=1) q4_0 weights get a second copy laid out for mv_q4_0r (decode): the 16-byte
// quants of every block first, aligned, then the scales. On shared memory
// nothing is done: the weights are read in place, never copied. A copy that
// does not fit is left out (the plain kernel reads the original).
// e (its copy of `bytes` on the device made) into the list, sorted by host address, counted as uploaded;
// out of memory: e's copy released.
static nm_status packed_add(nm_ocl *o, cl_packed e, size_t bytes) {
    if (o->n_packed == o->cap_packed) {
        const int cap = o->cap_packed ? 2 * o->cap_packed : 64;
        cl_packed *np = realloc(o->packed, sizeof *np * (size_t)cap);
        if (!np) {
            o->api.clReleaseMemObject(e.mem);
            return ocl_fail(o, NM_ERR_NOMEM, "opencl: out of memory");
        }
        o->packed = np;
        o->cap_packed = cap;
    }
    const int at = packed_lower(o, e.host);
    memmove(&o->packed[at + 1], &o->packed[at], sizeof *o->packed * (size_t)(o->n_packed - at));
    o->packed[at] = e;
    o->n_packed++;
    o->bytes_uploaded += bytes;
    nm_ledger_count(o->ledger, o->ep_host, o->ep_dev, bytes);
    return NM_OK;
}

static nm_status ocl_prepare_weight(nm_backend *b, const nm_tensor *w) {
    nm_ocl *o = b->impl;
    const uint8_t *h = nm_tensor_host(w);
    if (!o->repack || w->type != NM_TYPE_Q4_0 || !h || ocl_packed_find(o, h)) return NM_OK;
    const int64_t K = w->ne[0], N = w->ne[1] * w->ne[2] * w->ne[3];
    if (K % 32 != 0 || N <= 0) return NM_OK;
    const size_t nb = (size_t)(K / 32), rb = nb * 18, bytes = (size_t)N * rb;
    if (bytes > o->max_alloc) return NM_OK;
    uint8_t *tmp = malloc(bytes);
    if (!tmp) return ocl_fail(o, NM_ERR_NOMEM, "opencl: out of memory repacking %s", w->name ? w->name : "a weight");
    uint8_t *qs = tmp, *ds = tmp + (size_t)N * nb * 16;
    for (size_t n = 0; n < (size_t)N; n++)
        for (size_t k = 0; k < nb; k++) {
            const uint8_t *blk = h + n * rb + k * 18;
            memcpy(qs + (n * nb + k) * 16, blk + 2, 16);
            memcpy(ds + (n * nb + k) * 2, blk, 2);
        }
    cl_int e;
    cl_mem m = o->api.clCreateBuffer(o->ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, bytes, tmp, &e);
    free(tmp);
    if (!m || e != CL_SUCCESS) {
        if (m) o->api.clReleaseMemObject(m);
        return NM_OK; // no room: the original serves
    }
    return packed_add(o, (cl_packed){.host = h, .K = K, .N = N, .mem = m}, bytes);
}

// A convolution's weights (PyTorch's [oc][ic][k], or [ic][oc][k] transposed) copied to the device as
// [k][ic][oc]: a work-group's neighbouring output channels read neighbouring weights.
static nm_status ocl_prepare_op(nm_backend *b, const nm_op *op, nm_op_prep *p) {
    nm_ocl *o = b->impl; // (each output's sums alone: the direct form's reach, as p came)
    if (op->kind != NM_OP_CONV1D && op->kind != NM_OP_CONV_T1D) return NM_OK;
    const float *h = nm_tensor_host(op->src1);
    if (!ocl_supports_op(b, op) || !h)
        return ocl_fail(o, NM_ERR_UNSUPPORTED, "opencl: convolution (op %d) with these operands is not supported", op->kind);
    const bool t = op->kind == NM_OP_CONV_T1D;
    int64_t k = 0, ic = 0, oc = 0; // (supports_op checked them)
    nm_conv_dims(op, &k, &ic, &oc);
    const cl_packed *have = ocl_packed_find(o, (const uint8_t *)h);
    if (have) {
        if (!conv_copy_of(have, op))
            return ocl_fail(o, NM_ERR_INVALID_ARG, "opencl: the convolution weight at %p was prepared with another shape",
                            (const void *)h);
        p->copied = true;
        return NM_OK;
    }
    const size_t bytes = (size_t)(k * ic * oc) * sizeof(float);
    float *tmp = malloc(bytes), *wide = NULL; // (f16 / q8_0 weights widened to f32 first)
    if (tmp && op->src1->type != NM_TYPE_F32 && (wide = malloc(bytes)))
        nm_kernels_ref()->dequant[op->src1->type](nm_tensor_host(op->src1), wide, k * ic * oc), h = wide;
    if (!tmp || (op->src1->type != NM_TYPE_F32 && !wide)) {
        free(tmp), free(wide);
        return ocl_fail(o, NM_ERR_NOMEM, "opencl: out of memory repacking a convolution's weights");
    }
    for (int64_t j = 0; j < k; j++)
        for (int64_t c = 0; c < ic; c++)
            for (int64_t u = 0; u < oc; u++)
                tmp[(j * ic + c) * oc + u] = t ? h[(c * oc + u) * k + j] : h[(u * ic + c) * k + j];
    cl_int e;
    cl_mem m = o->api.clCreateBuffer(o->ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, bytes, tmp, &e);
    free(tmp), free(wide);
    h = nm_tensor_host(op->src1); // (the key: the caller's weight)
    if (!m || e != CL_SUCCESS) {
        if (m) o->api.clReleaseMemObject(m);
        return ocl_fail(o, NM_ERR_NOMEM, "opencl: no room for a convolution's weights (%zu bytes): %s", bytes, nm_cl_strerror(e));
    }
    nm_status st = packed_add(o, (cl_packed){.host = (const uint8_t *)h, .K = k * ic, .N = oc, .conv = true,
                                             .conv_kind = (int32_t)op->kind, .conv_k = (int32_t)k, .mem = m}, bytes);
    p->copied = st == NM_OK;
    return st;
}

#define NM_CL_CONV_T 8 // conv1d: output frames a work-item sums (NM_CONV_T in kernels_ops.cl)

static nm_status op_conv(nm_ocl *o, const nm_op *op) {
    const cl_packed *pk = ocl_packed_find(o, nm_tensor_host(op->src1));
    if (!conv_copy_of(pk, op))
        return ocl_fail(o, NM_ERR_INVALID_ARG, "opencl: convolution (op %d) weight %s not prepared (prepare_op)%s", op->kind,
                        op->src1->name ? op->src1->name : "", pk ? " for this kernel size and these channels" : "");
    RESOLVE(x, op->src0);
    RESOLVE(bias, op->src2);
    RESOLVE(y, op->dst);
    int64_t k64 = 0, ic64 = 0, oc64 = 0;
    nm_conv_dims(op, &k64, &ic64, &oc64);
    const cl_int n = (cl_int)op->src0->ne[1], ic = (cl_int)op->src0->ne[0], oc = (cl_int)op->dst->ne[0],
                 k = (cl_int)k64, n_out = (cl_int)op->dst->ne[1], has_b = op->src2 != NULL, i0 = op->i0,
                 i1 = op->i1;
    const float slope = op->f0;
    const size_t local[2] = {64, 1};
    if (op->kind == NM_OP_CONV_T1D) {
        const karg args[] = {A(x.m), A(x.off), A(pk->mem), A(bias.m), A(bias.off), A(has_b), A(y.m), A(y.off),
                             A(n), A(ic), A(oc), A(k), A(i0), A(i1), A(n_out), A(slope)};
        const size_t global[2] = {((size_t)oc + 63) / 64 * 64, (size_t)n_out};
        return ocl_launch(o, o->k_conv_t1d, "conv_t1d", 2, global, local, args, 16);
    }
    RESOLVE(a0, op->add[0]);
    RESOLVE(a1, op->add[1]);
    const cl_int has_a0 = op->add[0] != NULL, has_a1 = op->add[1] != NULL; // (pad_r: n_out's)
    const float scale = op->f1;
    const karg args[] = {A(x.m),  A(x.off),  A(pk->mem), A(bias.m), A(bias.off), A(has_b), A(a0.m), A(a0.off),
                         A(has_a0), A(a1.m), A(a1.off), A(has_a1), A(y.m),   A(y.off),   A(n),    A(ic),
                         A(oc),   A(k),      A(i0),      A(i1),     A(n_out),    A(slope),  A(scale)};
    const size_t global[2] = {((size_t)oc + 63) / 64 * 64, ((size_t)n_out + NM_CL_CONV_T - 1) / NM_CL_CONV_T};
    return ocl_launch(o, o->k_conv1d, "conv1d", 2, global, local, args, 23);
}

static nm_status op_matmul(nm_ocl *o, const nm_op *op) {
    RESOLVE(w, op->src0);
    RESOLVE(x, op->src1);
    RESOLVE(y, op->dst);
    RESOLVE(bias, op->src2);
    const cl_int has_bias = op->src2 != NULL, K = (cl_int)op->src0->ne[0], N = (cl_int)op->src0->ne[1];
    const int64_t T = op->src1->ne[1];
    const uint32_t t = op->src0->type;
    if (T == 1 || (op->flags & NM_OPF_ROWWISE)) { // each row as decode computes it
        // the repacked copy where prepare_weight made one, else the weight as it is
        const cl_packed *pk = o->n_packed ? ocl_packed_find(o, nm_tensor_host(op->src0)) : NULL;
        if (pk && (pk->conv || pk->K != K || pk->N != N)) pk = NULL;
        const cl_kernel k = pk ? (o->q8mv ? o->k_mv_q4_0r8 : o->k_mv_q4_0r) : o->typed.k[K_MV][t];
        const cl_mem wm = pk ? pk->mem : w.m;
        const cl_ulong wo = pk ? 0 : w.off;
        const size_t rows = pk ? NM_CL_MVR_ROWS : NM_CL_MV_ROWS, local = pk ? o->mvr_lws : o->mv_lws;
        const size_t global = ((size_t)N + rows - 1) / rows * local;
        for (int64_t r = 0; r < T; r++) {
            const cl_ulong xo = x.off + (cl_ulong)(r * K) * 4, yo = y.off + (cl_ulong)(r * N) * 4;
            const karg args[] = {A(wm), A(wo), A(x.m), A(xo), A(y.m), A(yo), A(bias.m), A(bias.off),
                                 A(has_bias), A(K), A(N)};
            nm_status st = ocl_launch(o, k, "matvec", 1, &global, &local, args, 11);
            if (st != NM_OK) return st;
        }
        return NM_OK;
    }
    const cl_int Tn = (cl_int)T;
    const karg args[] = {A(w.m), A(w.off), A(x.m), A(x.off), A(y.m), A(y.off), A(bias.m), A(bias.off),
                         A(has_bias), A(K), A(N), A(Tn)};
    const size_t local[2] = {NM_CL_MM_LX, NM_CL_MM_LY};
    const size_t global[2] = {((size_t)N + NM_CL_MM_TN - 1) / NM_CL_MM_TN * NM_CL_MM_LX,
                              ((size_t)T + NM_CL_MM_TT - 1) / NM_CL_MM_TT * NM_CL_MM_LY};
    return ocl_launch(o, o->typed.k[K_MM][t], "matmul", 2, global, local, args, 12);
}

// RMS norm of op; with add (NULL: none), the add whose sum op normalizes in
// the same launch (add_norm_pairs); with slot >= 0, also the x8 of its output
// (one row) into that slot of o->x8.
static nm_status op_rms_norm(nm_ocl *o, const nm_op *op, const nm_op *add, int slot) {
    RESOLVE(x, op->src0);
    RESOLVE(w, op->src1);
    RESOLVE(y, op->dst);
    RESOLVE(a, add ? add->src0 : op->src0);
    RESOLVE(bb, add ? add->src1 : op->src0);
    const cl_int has_w = op->src1 != NULL, d = (cl_int)op->src0->ne[0], has_add = add != NULL;
    const float eps = op->f0;
    const size_t rows = (size_t)(op->src0->ne[1] * op->src0->ne[2]), nl = o->lws_norm, global = rows * nl;
    const cl_int has_q8 = slot >= 0;
    const cl_mem q8 = has_q8 ? o->x8 : o->dummy;
    const cl_ulong q8_off = has_q8 ? (cl_ulong)slot * o->x8_slot : 0;
    const karg args[] = {A(x.m), A(x.off), A(w.m), A(w.off), A(has_w), A(y.m), A(y.off), A(d), A(eps),
                         A(a.m), A(a.off), A(bb.m), A(bb.off), A(has_add), A(q8), A(q8_off), A(has_q8)};
    return ocl_launch(o, o->k_rms_norm, add ? "add_rms_norm" : "rms_norm", 1, &global, &nl, args, 17);
}

// An add and the RMS norm of its sum right after it, which one launch can
// do: the norm reads the add's output, elementwise over the same elements.
bool add_norm_pairs(const nm_op *add, const nm_op *norm) {
    if (add->kind != NM_OP_ADD || norm->kind != NM_OP_RMS_NORM) return false;
    const nm_tensor *s = add->dst, *x = norm->src0;
    const int64_t n = s->ne[0] * s->ne[1] * s->ne[2];
    return (x == s || (x->buf == s->buf && x->offs == s->offs)) && n == x->ne[0] * x->ne[1] * x->ne[2] &&
           add->src0->ne[0] * add->src0->ne[1] * add->src0->ne[2] == n &&
           add->src1->ne[0] * add->src1->ne[1] * add->src1->ne[2] == n;
}

// Rope of op, and of op2 (NULL: none) in the same launch: rope_pairs.
static nm_status op_rope(nm_ocl *o, const nm_op *op, const nm_op *op2) {
    RESOLVE(x, op->src0);
    RESOLVE(pos, op->ids);
    RESOLVE(x2, op2 ? op2->src0 : op->src0);
    for (const nm_op *r = op; r; r = r == op ? op2 : NULL)
        if (r->dst != r->src0 && (r->dst->buf != r->src0->buf || r->dst->offs != r->src0->offs))
            return ocl_fail(o, NM_ERR_UNSUPPORTED, "opencl: rope runs in place only");
    const cl_int n_head = op->i0, hd = op->i1, mode = op->i2, n_rot = op->i3, n_head2 = op2 ? op2->i0 : 0;
    const cl_int sec0 = op->rope_sections[0];
    const float base = op->f0, fscale = op->f1;
    const karg args[] = {A(x.m),  A(x.off), A(pos.m),  A(pos.off), A(n_head),  A(hd),   A(n_rot),
                         A(mode), A(base),  A(fscale), A(x2.m),    A(x2.off), A(n_head2), A(sec0)};
    const size_t global[3] = {(size_t)(op->i3 / 2), (size_t)(n_head + n_head2), (size_t)op->src0->ne[1]};
    return ocl_launch(o, o->k_rope, "rope", 3, global, NULL, args, 14);
}

// The same tensor: one object, or the same place, type and shape.
bool ocl_same_tensor(const nm_tensor *a, const nm_tensor *b) {
    return a == b || (a->buf == b->buf && a->offs == b->offs && a->type == b->type && a->ne[0] == b->ne[0] &&
                      a->ne[1] == b->ne[1] && a->ne[2] == b->ne[2]);
}

// Q's and K's ropes (rope_pairs) and the KV store of that K, one launch.
static nm_status op_rope_kv(nm_ocl *o, const nm_op *rq, const nm_op *rk, const nm_op *st) {
    const nm_op *op = rq;
    for (const nm_op *r = rq; r; r = r == rq ? rk : NULL)
        if (r->dst != r->src0 && (r->dst->buf != r->src0->buf || r->dst->offs != r->src0->offs))
            return ocl_fail(o, NM_ERR_UNSUPPORTED, "opencl: rope runs in place only");
    RESOLVE(x, rq->src0);
    RESOLVE(pos, rq->ids);
    RESOLVE(x2, rk->src0);
    RESOLVE(v, st->src1);
    RESOLVE(kc, &st->kv->k);
    RESOLVE(vc, &st->kv->v);
    const cl_int n_head = rq->i0, hd = rq->i1, mode = rq->i2, n_rot = rq->i3, n_kv = rk->i0;
    const float base = rq->f0, fscale = rq->f1;
    const karg args[] = {A(x.m),  A(x.off), A(pos.m), A(pos.off), A(n_head), A(hd),   A(n_rot),
                         A(mode), A(base),  A(fscale), A(x2.m),   A(x2.off), A(n_kv), A(v.m),
                         A(v.off), A(kc.m), A(kc.off), A(vc.m),   A(vc.off)};
    const size_t global[3] = {(size_t)(hd / 2), (size_t)(n_head + 2 * n_kv), (size_t)rq->src0->ne[1]};
    return ocl_launch(o, o->k_rope_kv, "rope_kv", 3, global, NULL, args, 19);
}

// A rope pair (Q, K) and the KV store of that K right after them.
bool rope_kv_joins(const nm_op *rq, const nm_op *rk, const nm_op *st) {
    return st->kind == NM_OP_KV_STORE && rq->i2 != NM_ROPE_VISION && ocl_same_tensor(st->src0, rk->src0) &&
           ocl_same_tensor(st->ids, rq->ids) &&
           st->src0->ne[1] == rq->src0->ne[1] && st->src1->ne[1] == st->src0->ne[1] &&
           (int64_t)rk->i0 * rk->i1 == st->src0->ne[0] && st->src1->ne[0] == st->src0->ne[0] && rq->i1 % 2 == 0 &&
           rq->i3 % 2 == 0 && rq->src0->ne[0] == (int64_t)rq->i0 * rq->i1;
}

// Two ropes in a row that one launch can do (Q's and K's: the same
// positions, head size, rotation and tokens, different tensors).
bool rope_pairs(const nm_op *a, const nm_op *b) {
    return a->kind == NM_OP_ROPE && b->kind == NM_OP_ROPE && a->ids == b->ids && a->i1 == b->i1 && a->i2 == b->i2 &&
           a->i3 == b->i3 && a->f0 == b->f0 && a->f1 == b->f1 && a->src0->ne[1] == b->src0->ne[1] &&
           a->src0 != b->src0 && a->rope_sections[0] == b->rope_sections[0];
}

// attention_dec's work-groups a head: a work-group a compute unit over the
// heads, 1..32 (NM_OPENCL_ATTN_SPLIT=N: N).
static int attn_split(const nm_ocl *o, int n_head) {
    if (o->attn_split > 0) return o->attn_split;
    const int64_t s = n_head > 0 ? (int64_t)o->n_cu / n_head : 1;
    return s < 1 ? 1 : s > 32 ? 32 : (int)s;
}

// attention_dec takes the op: one token, where the program has warps, a head
// size it handles and at most NM_CL_ATT_DEC_KEYS keys a work-group.
static bool attn_dec_ok(const nm_ocl *o, const nm_op *op) {
    return o->k_attention_dec && o->attn_dec && op->src0->ne[1] == 1 && op->i2 % 32 == 0 && op->i2 <= 256 &&
           op->n_ctx <= (int64_t)NM_CL_ATT_DEC_KEYS * attn_split(o, op->i0);
}

// Room for attention_dec's shares (n_head x n_split x (head_dim + 2) floats)
// and its counters (n_head ints, zero between launches).
static nm_status attn_reserve(nm_ocl *o, int n_head, int n_split, int head_dim) {
    const size_t part = (size_t)n_head * (size_t)n_split * (size_t)(head_dim + 2) * sizeof(float);
    cl_int e = CL_SUCCESS;
    if (o->attn_part_bytes < part) {
        cl_mem m = o->api.clCreateBuffer(o->ctx, CL_MEM_READ_WRITE, part, NULL, &e);
        if (!m || e != CL_SUCCESS) return ocl_fail(o, NM_ERR_NOMEM, "opencl: attention_dec shares: %s", nm_cl_strerror(e));
        if (o->attn_part) o->api.clReleaseMemObject(o->attn_part); // queued kernels keep it until they are done
        o->attn_part = m, o->attn_part_bytes = part;
    }
    if (o->attn_cnt_heads < (size_t)n_head) {
        const cl_int zero = 0;
        cl_mem m = o->api.clCreateBuffer(o->ctx, CL_MEM_READ_WRITE, (size_t)n_head * sizeof(cl_int), NULL, &e);
        if (m && e == CL_SUCCESS)
            e = o->api.clEnqueueFillBuffer(o->q, m, &zero, sizeof zero, 0, (size_t)n_head * sizeof(cl_int), 0, NULL, NULL);
        if (!m || e != CL_SUCCESS) {
            if (m) o->api.clReleaseMemObject(m);
            return ocl_fail(o, NM_ERR_NOMEM, "opencl: attention_dec counters: %s", nm_cl_strerror(e));
        }
        if (o->attn_cnt) o->api.clReleaseMemObject(o->attn_cnt);
        o->attn_cnt = m, o->attn_cnt_heads = (size_t)n_head;
    }
    return NM_OK;
}

// The decode attention; with slot >= 0 its output's x8 into that slot.
static nm_status op_attention_dec(nm_ocl *o, const nm_op *op, int slot) {
    RESOLVE(q, op->src0);
    RESOLVE(kc, &op->kv->k);
    RESOLVE(vc, &op->kv->v);
    RESOLVE(pos, op->ids);
    RESOLVE(out, op->dst);
    const cl_int n_head = op->i0, n_kv = op->i1, hd = op->i2, kvw = op->i1 * op->i2, window = op->i3;
    const float scale = op->f0, softcap = op->f1;
    const cl_int has_x8 = slot >= 0;
    const cl_mem x8 = has_x8 ? o->x8 : o->dummy;
    const cl_ulong x8_off = has_x8 ? (cl_ulong)slot * o->x8_slot : 0;
    const int n_split = attn_split(o, n_head);
    nm_status st = n_split > 1 ? attn_reserve(o, n_head, n_split, hd) : NM_OK;
    if (st != NM_OK) return st;
    const cl_mem part = n_split > 1 ? o->attn_part : o->dummy, cnt = n_split > 1 ? o->attn_cnt : o->dummy;
    const karg args[] = {A(q.m),  A(q.off), A(kc.m),   A(kc.off), A(vc.m),    A(vc.off), A(pos.m),
                         A(pos.off), A(out.m), A(out.off), A(n_head), A(n_kv),  A(hd),     A(kvw),
                         A(window), A(scale), A(softcap), A(x8),     A(x8_off), A(has_x8), A(part), A(cnt)};
    const size_t local[2] = {256, 1}, global[2] = {(size_t)n_head * 256, (size_t)n_split};
    return ocl_launch(o, o->k_attention_dec, "attention_dec", 2, global, local, args, 22);
}

static nm_status op_run(nm_ocl *o, const nm_op *op) {
    if (o->prof) {
        const bool w = op->kind == NM_OP_MATMUL || op->kind == NM_OP_GET_ROWS;
        o->prof->cur_type = w && op->src0->type < NM_TYPE_COUNT ? op->src0->type : NM_TYPE_COUNT;
        o->prof->cur_bytes = op->kind == NM_OP_MATMUL ? (double)nm_tensor_bytes(op->src0) : 0;
    }
    switch (op->kind) {
    case NM_OP_MATMUL: return op_matmul(o, op);
    case NM_OP_GET_ROWS: {
        RESOLVE(w, op->src0);
        RESOLVE(ids, op->ids);
        RESOLVE(y, op->dst);
        const cl_int K = (cl_int)op->src0->ne[0];
        const karg args[] = {A(w.m), A(w.off), A(ids.m), A(ids.off), A(y.m), A(y.off), A(K)};
        const size_t global[2] = {(((size_t)K + 3) / 4 + 63) / 64 * 64, (size_t)op->dst->ne[1]}, local[2] = {64, 1};
        return ocl_launch(o, o->typed.k[K_GET_ROWS][op->src0->type], "get_rows", 2, global, local, args, 7);
    }
    case NM_OP_RMS_NORM: return op_rms_norm(o, op, NULL, -1);
    case NM_OP_NORM: {
        RESOLVE(x, op->src0);
        RESOLVE(w, op->src1);
        RESOLVE(bb, op->src2);
        RESOLVE(y, op->dst);
        const cl_int has_w = op->src1 != NULL, has_b = op->src2 != NULL, d = (cl_int)op->src0->ne[0];
        const float eps = op->f0;
        const size_t rows = (size_t)(op->src0->ne[1] * op->src0->ne[2]), nl = o->lws_norm, global = rows * nl;
        const karg args[] = {A(x.m), A(x.off), A(w.m), A(w.off), A(has_w), A(bb.m), A(bb.off), A(has_b),
                             A(y.m), A(y.off), A(d), A(eps)};
        return ocl_launch(o, o->k_layer_norm, "layer_norm", 1, &global, &nl, args, 12);
    }
    case NM_OP_ROPE: return op_rope(o, op, NULL);
    case NM_OP_KV_STORE: {
        RESOLVE(k, op->src0);
        RESOLVE(v, op->src1);
        RESOLVE(kc, &op->kv->k);
        RESOLVE(vc, &op->kv->v);
        RESOLVE(pos, op->ids);
        const cl_int width = (cl_int)op->src0->ne[0];
        const size_t global[3] = {(size_t)width, (size_t)op->src0->ne[1], 2};
        const karg args[] = {A(k.m), A(k.off), A(kc.m), A(kc.off), A(v.m), A(v.off), A(vc.m), A(vc.off),
                             A(pos.m), A(pos.off), A(width)};
        return ocl_launch(o, o->k_kv_store, "kv_store", 3, global, NULL, args, 11);
    }
    case NM_OP_SHORT_CONV: {
        RESOLVE(x, op->src0);
        RESOLVE(w, op->src1);
        RESOLVE(y, op->dst);
        RESOLVE(st, op->state);
        RESOLVE(ids, op->ids);
        const cl_int d = (cl_int)op->dst->ne[0], T = (cl_int)op->src0->ne[1], L = op->i0, W = op->i1, R = op->i2,
                     S = op->i3, n_ctx = op->n_ctx;
        const size_t global = (size_t)d;
        const karg args[] = {A(x.m),  A(x.off),   A(w.m), A(w.off), A(y.m), A(y.off), A(st.m), A(st.off), A(ids.m),
                             A(ids.off), A(d), A(T), A(L), A(W), A(R), A(S), A(n_ctx)};
        return ocl_launch(o, o->k_short_conv, "short_conv", 1, &global, NULL, args, 17);
    }
    case NM_OP_ATTENTION: {
        if (attn_dec_ok(o, op)) return op_attention_dec(o, op, -1);
        RESOLVE(q, op->src0);
        RESOLVE(kc, &op->kv->k);
        RESOLVE(vc, &op->kv->v);
        RESOLVE(pos, op->ids);
        RESOLVE(out, op->dst);
        const int64_t T = op->src0->ne[1];
        const cl_int n_head = op->i0, n_kv = op->i1, hd = op->i2, kvw = op->i1 * op->i2, window = op->i3;
        // scores of up to 1024 keys per (head, query) at a time: longer ranges go in chunks (online softmax)
        const cl_int max_keys = op->n_ctx < 1024 ? op->n_ctx : 1024;
        const float scale = op->f0, softcap = op->f1;
        const karg args[] = {A(q.m), A(q.off), A(kc.m), A(kc.off), A(vc.m), A(vc.off), A(pos.m), A(pos.off),
                             A(out.m), A(out.off), A(n_head), A(n_kv), A(hd), A(kvw), A(window), A(scale),
                             A(softcap), A(max_keys)};
        const size_t global[2] = {(size_t)n_head * o->lws_attn, (size_t)T}, local[2] = {o->lws_attn, 1};
        return ocl_launch(o, o->k_attention, "attention", 2, global, local, args, 18);
    }
    case NM_OP_ATTENTION_FULL: {
        RESOLVE(q, op->src0);
        RESOLVE(k, op->src1);
        RESOLVE(v, op->src2);
        RESOLVE(out, op->dst);
        const int64_t T = op->src0->ne[1];
        const cl_int n_tok = (cl_int)T, n_head = op->i0, hd = op->i2;
        const float scale = op->f0;
        const karg args[] = {A(q.m), A(q.off), A(k.m), A(k.off), A(v.m), A(v.off), A(out.m), A(out.off),
                             A(n_tok), A(n_head), A(hd), A(scale)};
        const size_t global[2] = {(size_t)n_head * o->lws_attn, (size_t)T}, local[2] = {o->lws_attn, 1};
        return ocl_launch(o, o->k_attention_full, "attention_full", 2, global, local, args, 12);
    }
    case NM_OP_GLU:
    case NM_OP_ADD:
    case NM_OP_SCALE:
    case NM_OP_SOFTCAP:
    case NM_OP_ACT: {
        RESOLVE(a, op->src0);
        RESOLVE(bb, op->src1);
        RESOLVE(y, op->dst);
        const cl_int n = (cl_int)(op->dst->ne[0] * op->dst->ne[1] * op->dst->ne[2]), act = op->i0;
        const float f = op->f0;
        const size_t global = (size_t)n;
        if (op->kind == NM_OP_GLU) {
            const karg args[] = {A(a.m), A(a.off), A(bb.m), A(bb.off), A(y.m), A(y.off), A(n), A(act)};
            return ocl_launch(o, o->k_glu, "glu", 1, &global, NULL, args, 8);
        }
        if (op->kind == NM_OP_ADD) {
            const karg args[] = {A(a.m), A(a.off), A(bb.m), A(bb.off), A(y.m), A(y.off), A(n)};
            return ocl_launch(o, o->k_add, "add", 1, &global, NULL, args, 7);
        }
        if (op->kind == NM_OP_ACT) {
            const karg args[] = {A(a.m), A(a.off), A(y.m), A(y.off), A(n), A(act)};
            return ocl_launch(o, o->k_act, "act", 1, &global, NULL, args, 6);
        }
        const karg args[] = {A(a.m), A(a.off), A(y.m), A(y.off), A(n), A(f)};
        return ocl_launch(o, op->kind == NM_OP_SCALE ? o->k_scale : o->k_softcap, op->kind == NM_OP_SCALE ? "scale" : "softcap",
                          1, &global, NULL, args, 6);
    }
    case NM_OP_COPY: {
        RESOLVE(a, op->src0);
        RESOLVE(y, op->dst);
        cl_int e = o->api.clEnqueueCopyBuffer(o->q, a.m, y.m, a.off, y.off, nm_tensor_bytes(op->src0), 0, NULL, NULL);
        return e == CL_SUCCESS ? NM_OK : ocl_fail(o, NM_ERR_IO, "opencl: copy: %s", nm_cl_strerror(e));
    }
    case NM_OP_PATCHES: {
        RESOLVE(a, op->src0);
        RESOLVE(y, op->dst);
        const cl_int W = op->i0, p = op->i1, H = op->i2 ? op->i2 : op->i0, group = op->i3;
        const karg args[] = {A(a.m), A(a.off), A(y.m), A(y.off), A(W), A(p), A(H), A(group)};
        const size_t global[2] = {(size_t)(3 * p * p), (size_t)op->dst->ne[1]};
        return ocl_launch(o, o->k_patches, "patches", 2, global, NULL, args, 8);
    }
    case NM_OP_PIXEL_SHUFFLE: {
        RESOLVE(a, op->src0);
        RESOLVE(y, op->dst);
        const cl_int d = (cl_int)op->src0->ne[0], side = op->i0, s = op->i1;
        const karg args[] = {A(a.m), A(a.off), A(y.m), A(y.off), A(d), A(side), A(s)};
        const size_t global[2] = {(size_t)(d * s * s), (size_t)op->dst->ne[1]};
        return ocl_launch(o, o->k_pixel_shuffle, "pixel_shuffle", 2, global, NULL, args, 7);
    }
    case NM_OP_CONV1D:
    case NM_OP_CONV_T1D: return op_conv(o, op);
    default: return ocl_fail(o, NM_ERR_UNSUPPORTED, "opencl: op %d is not supported", op->kind);
    }
}

static nm_status ocl_submit(nm_backend *b, const nm_op *ops, int n_ops) {
    nm_ocl *o = b->impl;
    int x8_at = -1; // the op at x8_at reads x8_of from the x8 input cur
    x8_src cur = {0, 0, 0.0f};
    const nm_tensor *x8_of = NULL;
    for (int i = 0; i < n_ops; i++) {
        if (!ocl_supports_op(b, &ops[i]))
            return ocl_fail(o, NM_ERR_UNSUPPORTED, "opencl: op %d (%s) not supported with these operands", ops[i].kind,
                            ops[i].src0 ? type_name(ops[i].src0->type) : "-");
        nm_status st;
        const cl_packed *pk[3];
        const bool x8_in = i == x8_at && x8_weight(o, &ops[i]) && ocl_same_tensor(ops[i].src1, x8_of);
        int slot;
        if (x8_in && glu_fusable(o, ops, i, n_ops, x8_of, pk)) {
            st = op_mvq_glu(o, &ops[i], pk, cur); // gate, up, GLU; h's x8 for the down projection
            x8_at = i + 3, cur = (x8_src){1 - cur.slot, 0, 0.0f}, x8_of = ops[i + 2].dst;
            i += 2;
        } else if (x8_in) {
            const int n = mvq_join(o, ops, i, n_ops, x8_of, pk);
            if (n == 1 && res_fusable(o, ops, i, n_ops, pk[0], cur)) {
                st = op_mvq_res(o, &ops[i], pk[0], cur); // the matvec, the residual add, the norm but its factor
                x8_at = i + 3, x8_of = ops[i + 2].dst;
                cur = (x8_src){1 - cur.slot, (cl_int)(pk[0]->N / NM_CL_MVS_ROWS), ops[i + 2].f0};
                i += 2;
            } else {
                const bool rope = n == 3 && rope_fusable(o, ops, i, n_ops, pk);
                st = op_mvq(o, &ops[i], pk, n, cur, rope ? &ops[i + 3] : NULL); // with Q's and K's ropes, the KV store
                i += n - 1 + (rope ? 3 : 0);
            }
        } else if (i + 2 < n_ops && rope_pairs(&ops[i], &ops[i + 1]) && rope_kv_joins(&ops[i], &ops[i + 1], &ops[i + 2]) &&
                   ocl_supports_op(b, &ops[i + 1]) && ocl_supports_op(b, &ops[i + 2])) {
            if (o->prof) o->prof->cur_type = NM_TYPE_COUNT, o->prof->cur_bytes = 0;
            st = op_rope_kv(o, &ops[i], &ops[i + 1], &ops[i + 2]); // Q's and K's ropes and the KV store
            i += 2;
        } else if (i + 1 < n_ops && rope_pairs(&ops[i], &ops[i + 1]) && ocl_supports_op(b, &ops[i + 1])) {
            if (o->prof) o->prof->cur_type = NM_TYPE_COUNT, o->prof->cur_bytes = 0;
            st = op_rope(o, &ops[i], &ops[i + 1]); // Q and K in one launch
            i++;
        } else if (i + 1 < n_ops && add_norm_pairs(&ops[i], &ops[i + 1]) && ocl_supports_op(b, &ops[i + 1])) {
            if (o->prof) o->prof->cur_type = NM_TYPE_COUNT, o->prof->cur_bytes = 0;
            slot = x8_producer(o, ops, i + 1, n_ops);
            st = op_rms_norm(o, &ops[i + 1], &ops[i], slot); // the residual add and the next norm
            if (slot >= 0) x8_at = i + 2, cur = (x8_src){slot, 0, 0.0f}, x8_of = ops[i + 1].dst;
            i++;
        } else if (ops[i].kind == NM_OP_ATTENTION && attn_dec_ok(o, &ops[i]) &&
                   (slot = x8_producer(o, ops, i, n_ops)) >= 0) {
            if (o->prof) o->prof->cur_type = NM_TYPE_COUNT, o->prof->cur_bytes = 0;
            st = op_attention_dec(o, &ops[i], slot); // and the x8 of its output for the O projection
            x8_at = i + 1, cur = (x8_src){slot, 0, 0.0f}, x8_of = ops[i].dst;
        } else if (ops[i].kind == NM_OP_RMS_NORM && (slot = x8_producer(o, ops, i, n_ops)) >= 0) {
            if (o->prof) o->prof->cur_type = NM_TYPE_COUNT, o->prof->cur_bytes = 0;
            st = op_rms_norm(o, &ops[i], NULL, slot);
            x8_at = i + 1, cur = (x8_src){slot, 0, 0.0f}, x8_of = ops[i].dst;
        } else {
            st = op_run(o, &ops[i]);
        }
        if (st != NM_OK) return st;
        // the device starts on the first ops while the host queues the rest
        if (i % 32 == 31 && o->api.clFlush(o->q) != CL_SUCCESS) return ocl_fail(o, NM_ERR_IO, "opencl: flush failed");
    }
    cl_int e = o->api.clFlush(o->q);
    return e == CL_SUCCESS ? NM_OK : ocl_fail(o, NM_ERR_IO, "opencl: %s", nm_cl_strerror(e));
}

static nm_status ocl_synchronize(nm_backend *b) {
    nm_ocl *o = b->impl;
    cl_int e = o->api.clFinish(o->q);
    if (o->prof && e == CL_SUCCESS) prof_collect(o);
    return e == CL_SUCCESS ? NM_OK : ocl_fail(o, NM_ERR_IO, "opencl: %s", nm_cl_strerror(e));
}

static nm_event *ocl_event_record(nm_backend *b) {
    nm_ocl *o = b->impl;
    cl_event_wrap *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    w->base.owner = b;
    if (o->api.clEnqueueMarkerWithWaitList(o->q, 0, NULL, &w->ev) != CL_SUCCESS) {
        free(w);
        ocl_fail(o, NM_ERR_IO, "opencl: cannot record an event");
        return NULL;
    }
    o->api.clFlush(o->q);
    return &w->base;
}

static nm_status ocl_event_sync(nm_backend *b, nm_event *ev) {
    nm_ocl *o = b->impl;
    if (!ev) return NM_OK;
    if (ev->owner != b) return nm_backend_event_sync(ev->owner, ev);
    cl_event_wrap *w = (cl_event_wrap *)ev;
    cl_int e = o->api.clWaitForEvents(1, &w->ev);
    return e == CL_SUCCESS ? NM_OK : ocl_fail(o, NM_ERR_IO, "opencl: waiting for an event: %s", nm_cl_strerror(e));
}

// An event of this queue is already ordered (in-order queue); another
// backend's event is waited for on the host before later work is queued.
static nm_status ocl_event_wait(nm_backend *b, nm_event *ev) {
    if (!ev || ev->owner == b) return NM_OK;
    return nm_backend_event_sync(ev->owner, ev);
}

static void ocl_event_free(nm_backend *b, nm_event *ev) {
    nm_ocl *o = b->impl;
    if (!ev) return;
    cl_event_wrap *w = (cl_event_wrap *)ev;
    if (w->ev) o->api.clReleaseEvent(w->ev);
    free(w);
}

static void ocl_get_caps(const nm_backend *b, nm_backend_caps *caps) {
    const nm_ocl *o = b->impl;
    memset(caps, 0, sizeof *caps);
    caps->unified_memory = o->unified;
    caps->async = true;
    caps->host_memory = false;
    caps->mem_bytes = o->mem_bytes;
    for (size_t i = 0; i < sizeof mm_types / sizeof mm_types[0]; i++) caps->weight_types |= 1ull << mm_types[i];
}

static void ocl_get_stats(const nm_backend *b, nm_backend_stats *s) {
    const nm_ocl *o = b->impl;
    s->bytes_wrapped = o->bytes_wrapped;
    s->bytes_uploaded = o->bytes_uploaded;
    snprintf(s->device, sizeof s->device, "%s", o->dev_name);
}

static const char *ocl_last_error(const nm_backend *b) { return ((const nm_ocl *)b->impl)->err; }

static void ocl_release(nm_ocl *o) {
    if (!o->api.lib) return;
    if (o->q) o->api.clFinish(o->q);
    if (o->prof) {
        prof_collect(o);
        prof_print(o);
        free(o->prof);
        o->prof = NULL;
    }
    for (int kind = 0; kind < K_NKINDS; kind++)
        for (int t = 0; t < NM_TYPE_COUNT; t++)
            if (o->typed.k[kind][t]) o->api.clReleaseKernel(o->typed.k[kind][t]);
    cl_kernel named[] = {o->k_rms_norm, o->k_layer_norm, o->k_rope, o->k_kv_store, o->k_attention, o->k_glu,
                         o->k_act, o->k_add, o->k_scale, o->k_softcap, o->k_attention_full, o->k_patches,
                         o->k_pixel_shuffle, o->k_conv1d, o->k_conv_t1d, o->k_mv_q4_0r, o->k_mv_q4_0r8, o->k_mvq, o->k_mvq_glu,
                         o->k_mvq_res, o->k_attention_dec, o->k_rope_kv, o->k_short_conv};
    for (size_t i = 0; i < sizeof named / sizeof named[0]; i++)
        if (named[i]) o->api.clReleaseKernel(named[i]);
    for (int i = 0; i < o->n_imports; i++) o->api.clReleaseMemObject(o->imports[i].mem);
    for (int i = 0; i < o->n_packed; i++) o->api.clReleaseMemObject(o->packed[i].mem);
    free(o->packed);
    if (o->dummy) o->api.clReleaseMemObject(o->dummy);
    if (o->x8) o->api.clReleaseMemObject(o->x8);
    if (o->x8_part) o->api.clReleaseMemObject(o->x8_part);
    if (o->attn_part) o->api.clReleaseMemObject(o->attn_part);
    if (o->attn_cnt) o->api.clReleaseMemObject(o->attn_cnt);
    if (o->prog) o->api.clReleaseProgram(o->prog);
    if (o->q) o->api.clReleaseCommandQueue(o->q);
    if (o->ctx) o->api.clReleaseContext(o->ctx);
    nm_cl_api_unload(&o->api);
}

static void ocl_free(nm_backend *b) {
    nm_ocl *o = b->impl;
    ocl_release(o);
    free(o);
    free(b);
}

static const nm_backend_i ocl_iface = {
    .version = NM_BACKEND_IFACE_VERSION,
    .name = "opencl",
    .get_caps = ocl_get_caps,
    .buffer_alloc = ocl_buffer_alloc,
    .buffer_free = ocl_buffer_free,
    .buffer_import_host = ocl_buffer_import_host,
    .tensor_set = ocl_tensor_set,
    .tensor_get = ocl_tensor_get,
    .supports_op = ocl_supports_op,
    .submit = ocl_submit,
    .event_record = ocl_event_record,
    .event_wait = ocl_event_wait,
    .event_sync = ocl_event_sync,
    .event_free = ocl_event_free,
    .synchronize = ocl_synchronize,
    .prepare_weight = ocl_prepare_weight,
    .prepare_op = ocl_prepare_op,
    .last_error = ocl_last_error,
    .free = ocl_free,
    .get_stats = ocl_get_stats,
};

// What each kernel allows on this device (registers limit some below the
// device's maximum): the matvec's work-group is clamped to it, the prefill
// matmul needs its 16 x 16.
static size_t kernel_wg(nm_ocl *o, cl_kernel k) {
    size_t wg = 0;
    if (o->api.clGetKernelWorkGroupInfo(k, o->dev, CL_KERNEL_WORK_GROUP_SIZE, sizeof wg, &wg, NULL) != CL_SUCCESS) wg = 0;
    return wg ? wg : o->max_wg;
}

// The largest power of two <= 256 that kernels a and b both run in (at least 32).
static size_t fit_lws(nm_ocl *o, cl_kernel a, cl_kernel b) {
    size_t lws = 256;
    const size_t wa = kernel_wg(o, a), wb = kernel_wg(o, b);
    while (lws > 32 && (lws > wa || lws > wb || lws > o->max_wg)) lws /= 2;
    return lws;
}

static nm_status fit_work_groups(nm_ocl *o) {
    o->lws_norm = fit_lws(o, o->k_rms_norm, o->k_layer_norm);
    o->lws_attn = fit_lws(o, o->k_attention, o->k_attention_full);
    while ((o->mvr_lws > kernel_wg(o, o->k_mv_q4_0r) || o->mvr_lws > kernel_wg(o, o->k_mv_q4_0r8)) && o->mvr_lws > 32)
        o->mvr_lws /= 2;
    o->x8_ok = kernel_wg(o, o->k_mvq) >= (size_t)o->geom.mvq_lws && kernel_wg(o, o->k_mvq_glu) >= 256 && o->max_wg >= 256;
    // mvq_res_q4_0: a block of 32 rows a work-group, or with PTX (its fence)
    // geom.mvs_lws items (fewer rows: the block's work-groups count themselves)
    o->mvs_lws = o->ptx ? (size_t)o->geom.mvs_lws : (size_t)(1024 / o->geom.mvs_rpw);
    if (o->mvs_lws * (size_t)o->geom.mvs_rpw > 1024) o->mvs_lws = (size_t)(1024 / o->geom.mvs_rpw);
    o->x8_res = o->x8_ok && kernel_wg(o, o->k_mvq_res) >= o->mvs_lws && o->max_wg >= o->mvs_lws &&
                o->mvs_lws / 32 >= (size_t)o->geom.mvs_split;
    o->x8_rope = o->x8_ok;
    if (o->k_attention_dec && (kernel_wg(o, o->k_attention_dec) < 256 || o->max_wg < 256)) {
        o->api.clReleaseKernel(o->k_attention_dec);
        o->k_attention_dec = NULL;
    }
    for (size_t i = 0; i < sizeof mm_types / sizeof mm_types[0]; i++) {
        size_t wg = 0;
        const uint32_t t = mm_types[i];
        if (o->api.clGetKernelWorkGroupInfo(o->typed.k[K_MV][t], o->dev, CL_KERNEL_WORK_GROUP_SIZE, sizeof wg, &wg,
                                            NULL) == CL_SUCCESS)
            while (o->mv_lws > wg && o->mv_lws > 32) o->mv_lws /= 2;
        if (o->api.clGetKernelWorkGroupInfo(o->typed.k[K_MM][t], o->dev, CL_KERNEL_WORK_GROUP_SIZE, sizeof wg, &wg,
                                            NULL) == CL_SUCCESS &&
            wg < NM_CL_MM_LX * NM_CL_MM_LY)
            return ocl_fail(o, NM_ERR_UNSUPPORTED, "opencl: %s runs mm_%s in work-groups of %zu items (%d needed)",
                            o->dev_name, type_name(t), wg, NM_CL_MM_LX * NM_CL_MM_LY);
    }
    return NM_OK;
}

static nm_status opencl_create(int32_t index, const nm_backend_params *p, nm_backend **out, char *err, size_t err_size) {
    *out = NULL;
    nm_ocl *o = calloc(1, sizeof *o);
    nm_backend *b = calloc(1, sizeof *b);
    nm_status st = NM_ERR_NOMEM;
    if (!o || !b) {
        snprintf(err, err_size, "opencl: out of memory");
        goto fail;
    }
    if (nm_cl_api_load(&o->api, o->err, sizeof o->err) != 0) {
        st = NM_ERR_UNSUPPORTED;
        snprintf(err, err_size, "opencl: no OpenCL runtime here (%s)", o->err);
        goto fail;
    }
    int count = 0;
    if (find_device(&o->api, index, &o->platform, &o->dev, &count) < 0) {
        st = NM_ERR_UNSUPPORTED;
        if (count == 0) snprintf(err, err_size, "opencl: no OpenCL device (no platform is installed, or none has a device)");
        else snprintf(err, err_size, "opencl: no device opencl:%d (%d device%s: opencl:0..%d)", index, count,
                      count == 1 ? "" : "s", count - 1);
        goto fail;
    }
    dev_str(&o->api, o->dev, CL_DEVICE_NAME, o->dev_name, sizeof o->dev_name);
    dev_str(&o->api, o->dev, CL_DRIVER_VERSION, o->driver, sizeof o->driver);
    o->unified = dev_bool(&o->api, o->dev, CL_DEVICE_HOST_UNIFIED_MEMORY);
    // NM_OPENCL_REPACK=0: never; =1: on shared memory too (a copy there: for tests)
    const char *rp = getenv("NM_OPENCL_REPACK");
    o->repack = rp && (!strcmp(rp, "0") || !strcmp(rp, "1")) ? rp[0] == '1' : !o->unified;
    o->mem_bytes = dev_ulong(&o->api, o->dev, CL_DEVICE_GLOBAL_MEM_SIZE);
    o->max_alloc = dev_ulong(&o->api, o->dev, CL_DEVICE_MAX_MEM_ALLOC_SIZE);
    if (getenv("NM_OPENCL_MAX_ALLOC")) o->max_alloc = strtoull(getenv("NM_OPENCL_MAX_ALLOC"), NULL, 10);
    if (o->api.clGetDeviceInfo(o->dev, CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeof o->max_wg, &o->max_wg, NULL) != CL_SUCCESS)
        o->max_wg = 0;
    if (o->max_wg < NM_CL_LWS || o->max_wg < NM_CL_MM_LX * NM_CL_MM_LY) {
        st = NM_ERR_UNSUPPORTED;
        snprintf(err, err_size, "opencl: %s runs work-groups of at most %zu items (%d needed)", o->dev_name, o->max_wg,
                 NM_CL_MM_LX * NM_CL_MM_LY > NM_CL_LWS ? NM_CL_MM_LX * NM_CL_MM_LY : NM_CL_LWS);
        goto fail;
    }
    o->mv_lws = o->max_wg >= 256 ? 256 : NM_CL_LWS; // 256: best on the H200 (docs/benchmarks.md)
    o->mvr_lws = 128;
    if (getenv("NM_OPENCL_MVR_LWS")) {
        const long v = atol(getenv("NM_OPENCL_MVR_LWS"));
        if (v >= 32 && v <= 128 && (v & (v - 1)) == 0) o->mvr_lws = (size_t)v;
    }
    if (getenv("NM_OPENCL_MV_LWS")) {
        const long v = atol(getenv("NM_OPENCL_MV_LWS"));
        if (v >= 32 && v <= 256 && (v & (v - 1)) == 0 && (size_t)v <= o->max_wg) o->mv_lws = (size_t)v;
    }
    cl_int e;
    const cl_context_properties props[] = {CL_CONTEXT_PLATFORM, (cl_context_properties)o->platform, 0};
    o->ctx = o->api.clCreateContext(props, 1, &o->dev, NULL, NULL, &e);
    if (!o->ctx || e != CL_SUCCESS) {
        st = NM_ERR_UNSUPPORTED;
        snprintf(err, err_size, "opencl: cannot open %s: %s", o->dev_name, nm_cl_strerror(e));
        goto fail;
    }
    if (getenv("NM_PROFILE") && getenv("NM_PROFILE")[0] == '1' && !(o->prof = calloc(1, sizeof *o->prof))) {
        snprintf(err, err_size, "opencl: out of memory");
        goto fail;
    }
    o->q = o->api.clCreateCommandQueue(o->ctx, o->dev, o->prof ? CL_QUEUE_PROFILING_ENABLE : 0, &e);
    if (!o->q || e != CL_SUCCESS) {
        st = NM_ERR_UNSUPPORTED;
        snprintf(err, err_size, "opencl: no queue on %s: %s", o->dev_name, nm_cl_strerror(e));
        goto fail;
    }
    o->dummy = o->api.clCreateBuffer(o->ctx, CL_MEM_READ_WRITE, 64, NULL, &e);
    if (!o->dummy || e != CL_SUCCESS) {
        st = NM_ERR_NOMEM;
        snprintf(err, err_size, "opencl: no memory on %s: %s", o->dev_name, nm_cl_strerror(e));
        goto fail;
    }
    // NVIDIA's platform compiles OpenCL C to PTX and takes inline PTX: the
    // 8-bit decode matvec uses dp4a there (NM_OPENCL_PTX=0: not); if the
    // program does not build that way, it is built without.
    char plat[128] = "";
    if (o->api.clGetPlatformInfo(o->platform, CL_PLATFORM_NAME, sizeof plat - 1, plat, NULL) != CL_SUCCESS) plat[0] = 0;
    const char *px = getenv("NM_OPENCL_PTX");
    o->ptx = strstr(plat, "NVIDIA") != NULL && !(px && !strcmp(px, "0"));
    o->geom = nm_cl_x8_geom_get();
    if ((st = build_program(o)) != NM_OK && o->ptx) {
        o->ptx = false;
        st = build_program(o);
    }
    const char *q8 = getenv("NM_OPENCL_Q8MV"); // 1: the 8-bit decode matvec anywhere (tests); 0: never
    o->q8mv = q8 && (!strcmp(q8, "0") || !strcmp(q8, "1")) ? q8[0] == '1' : o->ptx;
    if (st != NM_OK || (st = make_kernels(o)) != NM_OK || (st = fit_work_groups(o)) != NM_OK) {
        snprintf(err, err_size, "%s", o->err);
        goto fail;
    }
    const char *x8 = getenv("NM_OPENCL_X8"); // 0: no x8 path (the matvecs round in each work-group)
    if (x8 && !strcmp(x8, "0")) o->x8_ok = false;
    const char *xr = getenv("NM_OPENCL_X8_RES"); // 0: the residual add and the norm in a launch of their own
    if (xr && !strcmp(xr, "0")) o->x8_res = false;
    const char *xo = getenv("NM_OPENCL_X8_ROPE"); // 0: the ropes and the KV store in a launch of their own
    if (xo && !strcmp(xo, "0")) o->x8_rope = false;
    const char *ad = getenv("NM_OPENCL_ATTN_DEC"); // 0: the general attention kernel for decode too
    o->attn_dec = !(ad && !strcmp(ad, "0"));
    const char *as = getenv("NM_OPENCL_ATTN_SPLIT"); // N: attention_dec's work-groups a head (1: no split)
    o->attn_split = as ? atoi(as) : 0;
    if (o->attn_split < 0 || o->attn_split > 32) o->attn_split = 0;
    o->n_cu = dev_ulong(&o->api, o->dev, CL_DEVICE_MAX_COMPUTE_UNITS) & 0xffffffffu;
    o->max_row = p->max_row;
    o->max_tokens = p->max_tokens;
    o->ledger = p->ledger;
    o->ep_host = o->ep_dev = -1;
    if (o->ledger) {
        o->ep_host = nm_ledger_endpoint(o->ledger, "host");
        o->ep_dev = nm_ledger_endpoint(o->ledger, "opencl");
    }
    b->iface = &ocl_iface;
    b->impl = o;
    o->self = b;
    *out = b;
    return NM_OK;
fail:
    if (o) ocl_release(o);
    free(o);
    free(b);
    return st;
}

static int32_t opencl_list(nm_device_info *out, int32_t n) {
    nm_cl_api api;
    char e[256];
    if (nm_cl_api_load(&api, e, sizeof e) != 0) return 0;
    int count = 0;
    cl_platform_id plat;
    cl_device_id dev;
    find_device(&api, -1, &plat, &dev, &count);
    for (int i = 0; i < count && i < n; i++) {
        if (find_device(&api, i, &plat, &dev, NULL) < 0) break;
        nm_device_info *d = &out[i];
        memset(d, 0, sizeof *d);
        snprintf(d->name, sizeof d->name, "opencl:%d", i);
        dev_str(&api, dev, CL_DEVICE_NAME, d->desc, sizeof d->desc);
        char ver[128], drv[128];
        dev_str(&api, dev, CL_DEVICE_VERSION, ver, sizeof ver);
        dev_str(&api, dev, CL_DRIVER_VERSION, drv, sizeof drv);
        snprintf(d->driver, sizeof d->driver, "%s, driver %s", ver, drv);
        d->mem_bytes = dev_ulong(&api, dev, CL_DEVICE_GLOBAL_MEM_SIZE);
        const cl_ulong ty = dev_ulong(&api, dev, CL_DEVICE_TYPE);
        snprintf(d->type, sizeof d->type, "%s", ty & CL_DEVICE_TYPE_GPU ? "gpu" : ty & CL_DEVICE_TYPE_ACCELERATOR ? "accelerator"
                                               : ty & CL_DEVICE_TYPE_CPU ? "cpu" : "other");
        d->unified = dev_bool(&api, dev, CL_DEVICE_HOST_UNIFIED_MEMORY);
    }
    nm_cl_api_unload(&api);
    return count;
}

// A float4 sum over 256 MiB, best of 5 (after one warm-up run).
static const char bw_source[] =
    "__kernel void bw_read(__global const float4 *a, __global float *out, int n) {\n"
    "    int i = get_global_id(0), s = get_global_size(0);\n"
    "    float4 acc = (float4)(0.0f);\n"
    "    for (int j = i; j < n; j += s) acc += a[j];\n"
    "    out[i] = acc.x + acc.y + acc.z + acc.w;\n"
    "}\n";

static double opencl_read_gbps(int index) {
    nm_cl_api api;
    char e[256];
    if (nm_cl_api_load(&api, e, sizeof e) != 0) return 0.0;
    cl_platform_id plat;
    cl_device_id dev;
    double best = 0.0;
    cl_context ctx = NULL;
    cl_command_queue q = NULL;
    cl_program prog = NULL;
    cl_kernel k = NULL;
    cl_mem a = NULL, out = NULL;
    cl_int err;
    if (find_device(&api, index, &plat, &dev, NULL) < 0) goto done;
    const cl_context_properties props[] = {CL_CONTEXT_PLATFORM, (cl_context_properties)plat, 0};
    if (!(ctx = api.clCreateContext(props, 1, &dev, NULL, NULL, &err)) ||
        !(q = api.clCreateCommandQueue(ctx, dev, 0, &err)))
        goto done;
    const char *src = bw_source;
    if (!(prog = api.clCreateProgramWithSource(ctx, 1, &src, NULL, &err)) ||
        api.clBuildProgram(prog, 1, &dev, "-cl-std=CL1.2", NULL, NULL) != CL_SUCCESS ||
        !(k = api.clCreateKernel(prog, "bw_read", &err)))
        goto done;
    size_t bytes = (size_t)256 << 20;
    const cl_ulong max_alloc = dev_ulong(&api, dev, CL_DEVICE_MAX_MEM_ALLOC_SIZE);
    if (max_alloc && bytes > max_alloc / 2) bytes = (size_t)(max_alloc / 2) / 16 * 16;
    const cl_int n = (cl_int)(bytes / 16);
    const cl_ulong cu = dev_ulong(&api, dev, CL_DEVICE_MAX_COMPUTE_UNITS) & 0xffffffffu;
    const size_t global = (size_t)(cu ? cu : 1) * 2048, local = 64;
    if (!(a = api.clCreateBuffer(ctx, CL_MEM_READ_WRITE, bytes, NULL, &err)) ||
        !(out = api.clCreateBuffer(ctx, CL_MEM_READ_WRITE, global * sizeof(float), NULL, &err)))
        goto done;
    const float one = 1.0f;
    if (api.clEnqueueFillBuffer(q, a, &one, sizeof one, 0, bytes, 0, NULL, NULL) != CL_SUCCESS ||
        api.clSetKernelArg(k, 0, sizeof a, &a) != CL_SUCCESS || api.clSetKernelArg(k, 1, sizeof out, &out) != CL_SUCCESS ||
        api.clSetKernelArg(k, 2, sizeof n, &n) != CL_SUCCESS || api.clFinish(q) != CL_SUCCESS)
        goto done;
    for (int r = 0; r < 6; r++) {
        const double t0 = nm_now_s();
        if (api.clEnqueueNDRangeKernel(q, k, 1, NULL, &global, &local, 0, NULL, NULL) != CL_SUCCESS ||
            api.clFinish(q) != CL_SUCCESS)
            goto done;
        const double dt = nm_now_s() - t0;
        if (r > 0 && dt > 0 && bytes / dt / 1e9 > best) best = bytes / dt / 1e9;
    }
done:
    if (a) api.clReleaseMemObject(a);
    if (out) api.clReleaseMemObject(out);
    if (k) api.clReleaseKernel(k);
    if (prog) api.clReleaseProgram(prog);
    if (q) api.clReleaseCommandQueue(q);
    if (ctx) api.clReleaseContext(ctx);
    nm_cl_api_unload(&api);
    return best;
}

// ---- the registry's entry --------------------------------------------------------------------

static int32_t opencl_devices(nm_device_info *out, int32_t n, bool measure) {
    const int32_t count = opencl_list(out, n);
    for (int32_t i = 0; measure && out && i < n && i < count; i++) out[i].read_gbps = opencl_read_gbps(i);
    return count;
}

// opencl:auto: the first OpenCL GPU or accelerator: an OpenCL device on the CPU (PoCL) competes with the
// CPU backend for the same cores (NM_OPENCL_AUTO_CPU=1 takes it too, for tests).
static int32_t opencl_pick_auto(char *err, size_t err_size) {
    nm_device_info d[16];
    const int32_t n = opencl_list(d, 16);
    const bool cpu_ok = getenv("NM_OPENCL_AUTO_CPU") && atoi(getenv("NM_OPENCL_AUTO_CPU")) == 1;
    for (int32_t i = 0; i < n && i < 16; i++)
        if (cpu_ok || strcmp(d[i].type, "cpu") != 0) return i;
    if (n == 0) return 0; // (opencl:0 says there is no device)
    snprintf(err, err_size, "opencl: no OpenCL GPU or accelerator (%s is a CPU device: the CPU backend is faster there)",
             d[0].desc);
    return -1;
}

const nm_backend_reg nm_backend_opencl_reg = {.version = NM_BACKEND_IFACE_VERSION, .name = "opencl",
                                              .devices = opencl_devices, .create = opencl_create,
                                              .pick_auto = opencl_pick_auto};
