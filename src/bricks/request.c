// What the bricks share about a request beyond its slots: its PARAMS slot
// (a JSON object, read in place) and its cancellation.
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "bricks/brick_impl.h"
#include "core/fail.h"

cJSON *nm_req_parse(const nm_tabm_slot *s, const char *who, char *err, size_t err_size) {
    const nm_tabm_meta *mt = s->meta;
    if (mt->size == 0 || mt->size > s->capacity) {
        nm_fail(NM_ERR_FORMAT, err, err_size, "%s: parameters slot %llu is empty", who, (unsigned long long)mt->seq);
        return NULL;
    }
    const char *end = NULL;
    cJSON *o = cJSON_ParseWithLengthOpts(s->data, (size_t)mt->size, &end, false);
    if (!o) {
        const char *at = end; // where parsing stopped (cJSON's global error pointer is shared by every thread)
        long off = at && at >= (const char *)s->data && at <= (const char *)s->data + mt->size
                       ? (long)(at - (const char *)s->data) : -1;
        nm_fail(NM_ERR_FORMAT, err, err_size, "%s: parameters slot %llu is not JSON (syntax error near byte %ld)", who,
                (unsigned long long)mt->seq, off);
        return NULL;
    }
    if (!cJSON_IsObject(o)) {
        nm_fail(NM_ERR_FORMAT, err, err_size, "%s: parameters slot %llu is JSON but not an object", who,
                (unsigned long long)mt->seq);
        cJSON_Delete(o);
        return NULL;
    }
    // anything but blanks after the object is malformed
    for (const char *p = end; p && p < (const char *)s->data + mt->size; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            nm_fail(NM_ERR_FORMAT, err, err_size, "%s: parameters slot %llu: bytes after the JSON object", who,
                    (unsigned long long)mt->seq);
            cJSON_Delete(o);
            return NULL;
        }
    return o;
}

static const cJSON *field(const cJSON *o, const char *key) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, key);
    return f && !cJSON_IsNull(f) ? f : NULL;
}

int nm_req_number(const cJSON *o, const char *key, double lo, double hi, double *v, char *err, size_t err_size) {
    const cJSON *f = field(o, key);
    if (!f) return 0;
    if (!cJSON_IsNumber(f) || !isfinite(f->valuedouble) || f->valuedouble < lo || f->valuedouble > hi) {
        nm_fail(NM_ERR_FORMAT, err, err_size, "parameter \"%s\" must be a number in [%g, %g]", key, lo, hi);
        return -1;
    }
    *v = f->valuedouble;
    return 1;
}

int nm_req_int(const cJSON *o, const char *key, double lo, double hi, int64_t *v, char *err, size_t err_size) {
    double d = 0;
    int k = nm_req_number(o, key, lo, hi, &d, err, err_size);
    if (k <= 0) return k;
    if (d != floor(d)) {
        nm_fail(NM_ERR_FORMAT, err, err_size, "parameter \"%s\" must be a whole number (got %g)", key, d);
        return -1;
    }
    *v = (int64_t)d;
    return 1;
}

int nm_req_bool(const cJSON *o, const char *key, bool *v, char *err, size_t err_size) {
    const cJSON *f = field(o, key);
    if (!f) return 0;
    if (!cJSON_IsBool(f)) {
        nm_fail(NM_ERR_FORMAT, err, err_size, "parameter \"%s\" must be true or false", key);
        return -1;
    }
    *v = cJSON_IsTrue(f);
    return 1;
}

int nm_req_string(const cJSON *o, const char *key, size_t max_len, const char **v, char *err, size_t err_size) {
    const cJSON *f = field(o, key);
    if (!f) return 0;
    if (!cJSON_IsString(f) || !f->valuestring[0] || strlen(f->valuestring) > max_len) {
        nm_fail(NM_ERR_FORMAT, err, err_size, "parameter \"%s\" must be a non-empty string of at most %zu bytes", key,
                max_len);
        return -1;
    }
    *v = f->valuestring;
    return 1;
}

int nm_req_strings(const cJSON *o, const char *key, int32_t max_n, size_t max_len, const char **v, int32_t *n,
                   char *err, size_t err_size) {
    const cJSON *f = field(o, key);
    if (!f) return 0;
    if (cJSON_IsString(f)) return nm_req_string(o, key, max_len, v, err, err_size) == 1 ? (*n = 1) : -1;
    if (!cJSON_IsArray(f) || cJSON_GetArraySize(f) > max_n) {
        nm_fail(NM_ERR_FORMAT, err, err_size, "parameter \"%s\" must be a string or an array of at most %d strings",
                key, max_n);
        return -1;
    }
    int32_t k = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, f) {
        if (!cJSON_IsString(e) || !e->valuestring[0] || strlen(e->valuestring) > max_len) {
            nm_fail(NM_ERR_FORMAT, err, err_size, "parameter \"%s\": element %d must be a non-empty string of at most "
                    "%zu bytes", key, k, max_len);
            return -1;
        }
        v[k++] = e->valuestring;
    }
    *n = k;
    return 1;
}

void nm_req_free(cJSON *o) { cJSON_Delete(o); }

bool nm_req_cancelled(nm_tabm *in, uint64_t user, uint64_t request) {
    return (user & NM_BRICK_CANCELLED) || nm_tabm_request_cancelled(in, request);
}

static nm_status put_end(nm_tabm *out, uint32_t producer, int64_t timeout_ns, uint32_t kind, uint64_t request,
                         uint64_t flags) {
    // downstream stops too: what this brick already wrote of the request may still be queued there
    if ((flags & NM_BRICK_CANCELLED) && request) nm_tabm_cancel_request(out, request);
    nm_tabm_slot o;
    nm_status st = nm_tabm_acquire_write(out, producer, timeout_ns, &o);
    if (st != NM_OK) return st;
    o.meta->kind = kind;
    o.meta->ndim = 0;
    o.meta->size = 0;
    o.meta->user = flags;
    o.meta->request = request;
    if ((st = nm_tabm_publish(out, &o)) != NM_OK) nm_tabm_cancel(out, &o);
    return st;
}

nm_status nm_brick_drain_request(nm_tabm *in, uint64_t user, int64_t timeout_ns, uint64_t *n_slots) {
    while (user & NM_BRICK_MORE) {
        nm_tabm_slot s;
        nm_status st = nm_tabm_acquire_read(in, timeout_ns, &s);
        if (st != NM_OK) return st;
        user = s.meta->user;
        nm_tabm_release(in, &s);
        if (n_slots) (*n_slots)++;
    }
    return NM_OK;
}

nm_status nm_brick_end_request(nm_tabm *in, uint64_t user, nm_tabm *out, uint32_t producer, int64_t timeout_ns,
                               uint32_t kind, uint64_t request, uint64_t flags, nm_brick_stats *st) {
    const nm_status ds = nm_brick_drain_request(in, user, timeout_ns, &st->n_in_slots);
    const nm_status ps = put_end(out, producer, timeout_ns, kind, request, flags);
    if (ps == NM_OK) st->n_out_slots++;
    return ds != NM_OK ? ds : ps;
}
