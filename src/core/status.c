#include <stdarg.h>
#include <stdio.h>

#include "core/fail.h"
#include "nanomind.h"

const char *nm_status_str(nm_status s) {
    switch (s) {
    case NM_OK: return "ok";
    case NM_ERR_INVALID_ARG: return "invalid argument";
    case NM_ERR_IO: return "i/o error";
    case NM_ERR_FORMAT: return "malformed input";
    case NM_ERR_UNSUPPORTED: return "unsupported";
    case NM_ERR_NOMEM: return "out of memory";
    case NM_ERR_RANGE: return "out of range";
    case NM_ERR_TEMPLATE: return "unknown chat template";
    case NM_ERR_AGAIN: return "nothing available now";
    case NM_ERR_TIMEOUT: return "timed out";
    case NM_ERR_SHUTDOWN: return "shut down";
    case NM_ERR_STATE: return "wrong state";
    case NM_ERR_CANCELLED: return "cancelled";
    }
    return "unknown status";
}

nm_status nm_vfail(nm_status st, char *err, size_t err_size, const char *prefix, const char *fmt, va_list ap) {
    if (!err || !err_size) return st;
    int n = prefix ? snprintf(err, err_size, "%s", prefix) : 0;
    if (n < 0 || (size_t)n >= err_size) n = 0; // (a prefix that fills the buffer: the message alone)
    vsnprintf(err + n, err_size - (size_t)n, fmt, ap);
    return st;
}

nm_status nm_fail(nm_status st, char *err, size_t err_size, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    nm_vfail(st, err, err_size, NULL, fmt, ap);
    va_end(ap);
    return st;
}
