// Small sysfs attribute reads (power/sysfs.h).
#include "power/sysfs.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool nm_sysfs_path(char *buf, size_t size, const char *dir, const char *sub, const char *file) {
    int n = sub ? snprintf(buf, size, "%s/%s/%s", dir, sub, file) : snprintf(buf, size, "%s/%s", dir, file);
    return n >= 0 && (size_t)n < size;
}

nm_status nm_sysfs_read_str(const char *dir, const char *sub, const char *file, char *buf, size_t size) {
    char path[1024];
    if (size == 0) return NM_ERR_INVALID_ARG;
    buf[0] = 0;
    if (!nm_sysfs_path(path, sizeof path, dir, sub, file)) return NM_ERR_RANGE;
    FILE *f = fopen(path, "r");
    if (!f) return NM_ERR_IO;
    bool ok = fgets(buf, (int)size, f) != NULL;
    int e = errno;
    fclose(f);
    if (!ok) {
        errno = e;
        buf[0] = 0;
        return NM_ERR_IO;
    }
    size_t n = strlen(buf);
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == ' ' || buf[n - 1] == '\t' || buf[n - 1] == '\r')) buf[--n] = 0;
    return NM_OK;
}

nm_status nm_sysfs_read_num(const char *dir, const char *sub, const char *file, double *out) {
    char buf[64], *end;
    nm_status st = nm_sysfs_read_str(dir, sub, file, buf, sizeof buf);
    if (st != NM_OK) return st;
    if (buf[strspn(buf, "0123456789.-+")]) return NM_ERR_FORMAT; // decimal only: no hex, inf, nan
    errno = 0;
    double v = strtod(buf, &end);
    if (end == buf || *end || errno == ERANGE || !isfinite(v)) return NM_ERR_FORMAT;
    *out = v;
    return NM_OK;
}
