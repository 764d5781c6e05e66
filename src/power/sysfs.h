// Small sysfs attribute reads shared by the power modules: one value per file,
// its trailing newline dropped. dir/sub/file, sub may be NULL.
#ifndef NM_POWER_SYSFS_H
#define NM_POWER_SYSFS_H

#include <stddef.h>

#include "nanomind.h"

// The file's first line (up to size - 1 bytes), trailing blanks dropped.
// NM_ERR_IO when it cannot be opened or read (errno kept).
nm_status nm_sysfs_read_str(const char *dir, const char *sub, const char *file, char *buf, size_t size);
// The file as one number (an integer or a decimal); NM_ERR_FORMAT otherwise.
nm_status nm_sysfs_read_num(const char *dir, const char *sub, const char *file, double *out);
// dir/sub/file into buf; false when it does not fit.
bool nm_sysfs_path(char *buf, size_t size, const char *dir, const char *sub, const char *file);

#endif
