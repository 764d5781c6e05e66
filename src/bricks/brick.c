// The brick handle: one interface (nm_brick_i) over the four built-in bricks
// and any other implementation. It owns the last-error text (written by the
// lane that runs the brick through nm_brick_set_error, read by any thread)
// and the run loop.
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bricks/brick_impl.h"
#include "core/fail.h"
#include "quant/quant.h"

struct nm_brick {
    const nm_brick_i *impl;
    void *state;
    nm_brick_kind kind;
    char name[32];
    pthread_mutex_t lock; // guards err and failed
    char err[512];
    struct {
        uint64_t request; // 0: none
        char msg[512];
    } failed[NM_BRICK_ERRORS_KEPT]; // the last failed requests' texts, a ring
    int next_failed;
    bool has_cores;       // nm_brick_params.cores: the lane's cores
    cpu_set_t cores;
    bool stepping;        // in nm_brick_step: waits with no peer to wake them fail (nm_brick_wait_ns)
};

// Binds the calling thread to `set`, the mask it had into *old; false if the OS refused.
static bool bind_to(const cpu_set_t *set, cpu_set_t *old) {
    return pthread_getaffinity_np(pthread_self(), sizeof *old, old) == 0 &&
           pthread_setaffinity_np(pthread_self(), sizeof *set, set) == 0;
}

static const char *kind_str(nm_brick_kind k) {
    switch (k) {
    case NM_BRICK_STT: return "stt";
    case NM_BRICK_VISION: return "vision";
    case NM_BRICK_LLM: return "llm";
    case NM_BRICK_TTS: return "tts";
    }
    return "brick";
}

nm_brick_params nm_brick_default_params(nm_brick_kind kind) {
    nm_brick_params p;
    memset(&p, 0, sizeof p);
    p.kind = kind;
    p.timeout_ns = -1;
    p.n_gpu_layers = -1;
    p.n_ctx = 0;
    p.n_batch = 0;
    p.sampling = nm_sampler_default_params();
    p.llm = (nm_llm_params){.n_predict = 128, .out_batch = 1, .cache_prompt = true};
    p.stt = nm_stt_default_params(NM_STT_BEAM);
    p.stt_max_decoders = 0;
    p.tts = nm_tts_default_params();
    return p;
}

const nm_brick_i *nm_brick_builtin(nm_brick_kind kind) {
    switch (kind) {
    case NM_BRICK_STT: return &nm_brick_stt_i;
    case NM_BRICK_VISION: return &nm_brick_vision_i;
    case NM_BRICK_LLM: return &nm_brick_llm_i;
    case NM_BRICK_TTS: return &nm_brick_tts_i;
    }
    return NULL;
}

nm_status nm_brick_load(const nm_brick_i *impl, const nm_brick_params *p, nm_brick **out, char *err,
                        size_t err_size) {
    if (err && err_size) err[0] = '\0';
    if (!out) return NM_ERR_INVALID_ARG;
    *out = NULL;
    if (!p) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "brick: no parameters");
    if (!impl) impl = nm_brick_builtin(p->kind);
    if (!impl) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "brick: unknown kind %d", (int)p->kind);
    if (impl->version < 1 || !impl->load || !impl->run || !impl->release)
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "brick: implementation '%s' (version %u) lacks load, run "
                       "or release", impl->name ? impl->name : "?", impl->version);
    if (impl->kind != p->kind)
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "brick: implementation '%s' is a %s brick, the parameters "
                       "ask for a %s one", impl->name ? impl->name : "?", kind_str(impl->kind), kind_str(p->kind));
    nm_brick *b = calloc(1, sizeof *b);
    if (!b) return nm_fail(NM_ERR_NOMEM, err, err_size, "brick: out of memory");
    b->impl = impl;
    b->kind = p->kind;
    snprintf(b->name, sizeof b->name, "%s", p->name ? p->name : kind_str(p->kind));
    pthread_mutex_init(&b->lock, NULL);
    cpu_set_t old;
    bool bound = false;
    if (p->cores) {
        // the lane's cores: the pools the brick makes at load take them (their
        // threads inherit the loading thread's mask)
        nm_cpu_topology *t = malloc(sizeof *t);
        int32_t list[NM_MAX_CPUS], n = 0;
        nm_status cs = t ? nm_cpu_topology_read(NULL, t, err, err_size) : NM_ERR_NOMEM;
        if (cs == NM_OK) cs = nm_cores_parse(t, p->cores, list, NM_MAX_CPUS, &n, err, err_size);
        free(t);
        if (cs != NM_OK) {
            pthread_mutex_destroy(&b->lock);
            free(b);
            return cs;
        }
        CPU_ZERO(&b->cores);
        for (int32_t i = 0; i < n; i++) CPU_SET(list[i], &b->cores);
        b->has_cores = true;
        if (!(bound = bind_to(&b->cores, &old))) {
            pthread_mutex_destroy(&b->lock);
            free(b);
            return nm_fail(NM_ERR_UNSUPPORTED, err, err_size, "brick: cannot bind a thread to cores '%s'", p->cores);
        }
    }
    nm_brick_params lp = *p;
    if (b->has_cores && lp.n_threads <= 0) lp.n_threads = CPU_COUNT(&b->cores); // a thread per core of the lane
    nm_status st = impl->load(&lp, &b->state, err, err_size);
    if (bound) pthread_setaffinity_np(pthread_self(), sizeof old, &old);
    if (st != NM_OK) {
        pthread_mutex_destroy(&b->lock);
        free(b);
        return st;
    }
    *out = b;
    return NM_OK;
}

void nm_brick_free(nm_brick *b) {
    if (!b) return;
    b->impl->release(b->state);
    pthread_mutex_destroy(&b->lock);
    free(b);
}

const nm_brick_i *nm_brick_impl(const nm_brick *b) { return b ? b->impl : NULL; }
nm_brick_kind nm_brick_get_kind(const nm_brick *b) { return b ? b->kind : (nm_brick_kind)0; }
const char *nm_brick_name(const nm_brick *b) { return b ? b->name : ""; }
const char *nm_brick_device(const nm_brick *b) {
    return b && b->impl->device ? b->impl->device(b->state) : "cpu";
}

nm_status nm_brick_set_params(nm_brick *b, const nm_brick_params *p, char *err, size_t err_size) {
    if (err && err_size) err[0] = '\0';
    if (!b || !p) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "brick: NULL brick or parameters");
    if (!b->impl->set_params)
        return nm_fail(NM_ERR_UNSUPPORTED, err, err_size, "brick: a %s brick takes no parameters after load",
                       kind_str(b->kind));
    return b->impl->set_params(b->state, p, err, err_size);
}

// The last error, and request `request`'s text (0: none) in the ring of failed requests.
static void put_error(nm_brick *b, uint64_t request, const char *msg) {
    pthread_mutex_lock(&b->lock);
    snprintf(b->err, sizeof b->err, "%s", msg);
    if (request) {
        int k = 0; // a request failed again: its entry, else the oldest
        while (k < NM_BRICK_ERRORS_KEPT && b->failed[k].request != request) k++;
        if (k == NM_BRICK_ERRORS_KEPT) k = b->next_failed, b->next_failed = (k + 1) % NM_BRICK_ERRORS_KEPT;
        b->failed[k].request = request;
        snprintf(b->failed[k].msg, sizeof b->failed[k].msg, "%s", msg);
    }
    pthread_mutex_unlock(&b->lock);
}

static void vput_error(nm_brick *b, uint64_t request, const char *fmt, va_list ap) {
    if (!b) return;
    char msg[sizeof b->err];
    nm_vfail(NM_OK, msg, sizeof msg, NULL, fmt, ap);
    put_error(b, request, msg);
}

void nm_brick_set_error(nm_brick *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vput_error(b, 0, fmt, ap);
    va_end(ap);
}

void nm_brick_set_request_error(nm_brick *b, uint64_t request, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vput_error(b, request, fmt, ap);
    va_end(ap);
}

const char *nm_brick_request_error(const nm_brick *b, uint64_t request) {
    static _Thread_local char msg[sizeof b->failed[0].msg];
    msg[0] = '\0';
    if (!b || !request) return msg;
    pthread_mutex_lock((pthread_mutex_t *)&b->lock);
    for (int k = 0; k < NM_BRICK_ERRORS_KEPT; k++)
        if (b->failed[k].request == request) memcpy(msg, b->failed[k].msg, sizeof msg);
    pthread_mutex_unlock((pthread_mutex_t *)&b->lock);
    return msg;
}

int64_t nm_brick_wait_ns(const nm_brick *self, int64_t timeout_ns) {
    return self && self->stepping && timeout_ns < 0 ? NM_TABM_WAIT_PEER : timeout_ns;
}

nm_status nm_brick_step(nm_brick *b, nm_tabm *in, nm_tabm *out) {
    if (!b || !in || !out) return NM_ERR_INVALID_ARG;
    cpu_set_t old;
    const bool bound = b->has_cores && bind_to(&b->cores, &old); // the serving thread on the lane's cores
    b->stepping = true;
    nm_status st = b->impl->run(b->state, b, in, out);
    b->stepping = false;
    if (bound) pthread_setaffinity_np(pthread_self(), sizeof old, &old);
    if (st == NM_ERR_AGAIN) { // a wait that only this thread could have ended (nm_brick_wait_ns)
        const nm_tabm_stats os = nm_tabm_get_stats(out);
        if (os.occupancy == os.n_slots)
            nm_brick_set_error(b, "%s brick: its output ring is full (%u slot%s) and no other thread reads it: the "
                               "request's output does not fit while the caller steps the brick (read the ring from "
                               "another thread, or give it more slots); the step returns without finishing it",
                               b->name, os.n_slots, os.n_slots == 1 ? "" : "s");
        else
            nm_brick_set_error(b, "%s brick: its input ring has nothing more to read (no request, or a request "
                               "whose last slot never came: the one it holds says NM_BRICK_MORE) and no other thread "
                               "writes it; the step returns without finishing it", b->name);
    }
    return st;
}

nm_status nm_brick_run(nm_brick *b, nm_tabm *in, nm_tabm *out) {
    if (!b || !in || !out) return NM_ERR_INVALID_ARG;
    cpu_set_t old;
    if (b->has_cores) (void)bind_to(&b->cores, &old); // the lane's thread: bound for good (a pool may pin it further)
    nm_status st;
    while ((st = b->impl->run(b->state, b, in, out)) == NM_OK) {
    }
    // whichever side ended it, both neighbours wake and end
    nm_tabm_shutdown(in);
    nm_tabm_shutdown(out);
    return st;
}

size_t nm_brick_in_slot_bytes(const nm_brick *b) {
    return b && b->impl->slot_bytes ? b->impl->slot_bytes(b->state, false) : 0;
}
size_t nm_brick_out_slot_bytes(const nm_brick *b) {
    return b && b->impl->slot_bytes ? b->impl->slot_bytes(b->state, true) : 0;
}

nm_status nm_brick_estimate(const nm_brick *b, const nm_brick_input *in, nm_brick_cost *out) {
    if (!b || !in || !out) return NM_ERR_INVALID_ARG;
    memset(out, 0, sizeof *out);
    if (!b->impl->estimate) return NM_ERR_UNSUPPORTED;
    return b->impl->estimate(b->state, in, out);
}

const char *nm_brick_last_error(const nm_brick *b) {
    static _Thread_local char msg[sizeof b->err];
    if (!b) return "";
    return nm_err_snapshot((pthread_mutex_t *)&b->lock, b->err, msg, sizeof msg);
}

nm_brick_stats nm_brick_get_stats(const nm_brick *b) {
    nm_brick_stats s;
    memset(&s, 0, sizeof s);
    if (b && b->impl->stats) b->impl->stats(b->state, &s);
    return s;
}

void *nm_brick_state_of(const nm_brick *b, const nm_brick_i *impl) { return b && b->impl == impl ? b->state : NULL; }

// ---- helpers of the implementations ------------------------------------------------------------
double nm_cost_matmul(nm_brick_cost *e, const nm_tensor *w, double rows, double passes) {
    if (!nm_tensor_is_set(w)) return 0;
    const double f = 2.0 * (double)w->ne[0] * (double)w->ne[1] * rows;
    e->flops += f;
    e->flops_by_type[w->type < NM_EST_TYPES ? w->type : 0] += f;
    const double bytes = (double)nm_row_size(w->type, w->ne[0]) * (double)w->ne[1];
    e->weight_bytes_read += bytes * passes;
    return bytes;
}

