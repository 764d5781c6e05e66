// The error-reporting helper of the modules whose calls take (char *err,
// size_t err_size): a printf-style message into err (when err_size > 0), and
// the status back, so that `return nm_fail(NM_ERR_FORMAT, err, n, "...", ...)`
// reports and fails in one step.
#ifndef NM_CORE_FAIL_H
#define NM_CORE_FAIL_H

#include <stddef.h>

#include "nanomind.h"

nm_status nm_fail(nm_status st, char *err, size_t err_size, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

#endif
