// The error-reporting helper of the modules whose calls take (char *err,
// size_t err_size): a printf-style message into err (when err_size > 0), and
// the status back, so that `return nm_fail(NM_ERR_FORMAT, err, n, "...", ...)`
// reports and fails in one step.
#ifndef NM_CORE_FAIL_H
#define NM_CORE_FAIL_H

#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include "nanomind.h"

nm_status nm_fail(nm_status st, char *err, size_t err_size, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
// The one error setter every module's reporting goes through (nm_fail, and the
// handles' own helpers that add their lock or their name): `prefix` (NULL:
// none) then the message into err (when err_size > 0; cut to fit), st back.
nm_status nm_vfail(nm_status st, char *err, size_t err_size, const char *prefix, const char *fmt, va_list ap)
    __attribute__((format(printf, 5, 0)));

// A handle's last-error text as *_last_error returns it where other threads
// may be failing on the same handle: copied under the lock that guards its
// writes into dst (the function's own _Thread_local buffer of n bytes).
static inline const char *nm_err_snapshot(pthread_mutex_t *lock, const char *err, char *dst, size_t n) {
    pthread_mutex_lock(lock);
    memcpy(dst, err, n);
    pthread_mutex_unlock(lock);
    return dst;
}

#endif
