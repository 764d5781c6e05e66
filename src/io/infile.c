// Input files that never hang and never read more than their cap (infile.h).
#include "io/infile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fail.h"

static const char *kind(mode_t m) {
    return S_ISFIFO(m) ? "a FIFO" : S_ISCHR(m) ? "a character device" : S_ISBLK(m) ? "a block device"
         : S_ISSOCK(m) ? "a socket" : "not a file";
}

nm_status nm_infile_fd(const char *path, uint64_t max_bytes, uint32_t flags, int *fd, int64_t *size, char *err,
                       size_t err_size) {
    if (err && err_size) err[0] = '\0';
    if (fd) *fd = -1;
    if (size) *size = 0;
    if (!path || !fd || !size) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "input file: NULL argument");
    bool stream = flags & NM_INFILE_STREAM;
    int d;
    if ((flags & NM_INFILE_STDIN) && !strcmp(path, "-")) {
        stream = true;
        d = fcntl(0, F_DUPFD_CLOEXEC, 3);
        if (d < 0) return nm_fail(NM_ERR_IO, err, err_size, "stdin: %s", strerror(errno));
        path = "stdin";
    } else {
        // O_NONBLOCK: a FIFO opens at once (no writer needed), and is refused
        // below or read as a stream; nothing changes for a regular file.
        d = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
        if (d < 0) return nm_fail(NM_ERR_IO, err, err_size, "%s: cannot open: %s", path, strerror(errno));
        const int fl = fcntl(d, F_GETFL);
        if (fl >= 0) fcntl(d, F_SETFL, fl & ~O_NONBLOCK); // a stream's reads then wait for its writer
    }
    struct stat sb;
    if (fstat(d, &sb) != 0) {
        const int e = errno;
        close(d);
        return nm_fail(NM_ERR_IO, err, err_size, "%s: cannot stat: %s", path, strerror(e));
    }
    if (S_ISDIR(sb.st_mode)) {
        close(d);
        return nm_fail(NM_ERR_IO, err, err_size, "%s: is a directory", path);
    }
    struct stat in;
    if (!S_ISREG(sb.st_mode) && !stream && (flags & NM_INFILE_STDIN) && fstat(0, &in) == 0)
        stream = in.st_dev == sb.st_dev && in.st_ino == sb.st_ino; // /dev/stdin, /dev/fd/0: our stdin
    if (!S_ISREG(sb.st_mode) && !stream) {
        close(d);
        return nm_fail(NM_ERR_IO, err, err_size, "%s: not a regular file (%s)", path, kind(sb.st_mode));
    }
    if (S_ISREG(sb.st_mode) && (uint64_t)sb.st_size > max_bytes) {
        close(d);
        return nm_fail(NM_ERR_RANGE, err, err_size, "%s: %lld bytes, over the limit of %llu bytes", path,
                       (long long)sb.st_size, (unsigned long long)max_bytes);
    }
    *fd = d;
    *size = S_ISREG(sb.st_mode) ? (int64_t)sb.st_size : -1;
    return NM_OK;
}

nm_status nm_infile_open(const char *path, uint64_t max_bytes, uint32_t flags, FILE **f, int64_t *size, char *err,
                         size_t err_size) {
    if (f) *f = NULL;
    int64_t sz = 0;
    int fd;
    if (!f) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "input file: NULL argument");
    nm_status st = nm_infile_fd(path, max_bytes, flags, &fd, &sz, err, err_size);
    if (st != NM_OK) return st;
    if (!(*f = fdopen(fd, "rb"))) {
        const int e = errno;
        close(fd);
        return nm_fail(NM_ERR_NOMEM, err, err_size, "%s: %s", path, strerror(e));
    }
    if (size) *size = sz;
    return NM_OK;
}

// Reads fd into buf until cap bytes or the end: *n bytes.
static nm_status read_some(int fd, const char *path, uint8_t *buf, size_t cap, size_t *n, char *err, size_t err_size) {
    size_t got = 0;
    while (got < cap) {
        const ssize_t k = read(fd, buf + got, cap - got);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return nm_fail(NM_ERR_IO, err, err_size, "%s: cannot read: %s", path, strerror(errno));
        if (k == 0) break;
        got += (size_t)k;
    }
    *n = got;
    return NM_OK;
}

static nm_status over(const char *path, uint64_t cap, char *err, size_t err_size) {
    return nm_fail(NM_ERR_RANGE, err, err_size, "%s: more than %llu bytes, the limit", path, (unsigned long long)cap);
}

nm_status nm_infile_read(const char *path, uint64_t max_bytes, uint32_t flags, char **data, size_t *n, char *err,
                         size_t err_size) {
    if (data) *data = NULL;
    if (n) *n = 0;
    if (!data) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "input file: NULL argument");
    if (max_bytes > SIZE_MAX - 2) max_bytes = SIZE_MAX - 2;
    int fd;
    int64_t size;
    nm_status st = nm_infile_fd(path, max_bytes, flags, &fd, &size, err, err_size);
    if (st != NM_OK) return st;
    const char *name = strcmp(path, "-") ? path : "stdin";
    // Room for max_bytes + 1: a file with that many is over. A regular file
    // starts at its size + 1 (one that grows meanwhile is read on, to the cap);
    // a stream at 64 KiB, doubling as it comes.
    const size_t most = (size_t)max_bytes + 1;
    size_t cap = size >= 0 ? (size_t)size + 1 : 65536, len = 0;
    if (cap > most) cap = most;
    char *buf = malloc(cap + 1);
    while (buf) {
        size_t got = 0;
        if ((st = read_some(fd, name, (uint8_t *)buf + len, cap - len, &got, err, err_size)) != NM_OK) break;
        len += got;
        if (len > max_bytes) {
            st = over(name, max_bytes, err, err_size);
            break;
        }
        if (len < cap) break; // the end
        const size_t ncap = cap <= most / 2 ? cap * 2 : most;
        char *nb = realloc(buf, ncap + 1);
        if (!nb) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = nb;
        cap = ncap;
    }
    close(fd);
    if (!buf) return nm_fail(NM_ERR_NOMEM, err, err_size, "%s: out of memory", name);
    if (st != NM_OK) {
        free(buf);
        return st;
    }
    buf[len] = '\0';
    *data = buf;
    if (n) *n = len;
    return NM_OK;
}

nm_status nm_infile_read_into(const char *path, uint32_t flags, void *buf, size_t cap, size_t *n, char *err,
                              size_t err_size) {
    if (n) *n = 0;
    if (!buf || !n) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "input file: NULL argument");
    int fd;
    int64_t size;
    nm_status st = nm_infile_fd(path, cap, flags, &fd, &size, err, err_size);
    if (st != NM_OK) return st;
    const char *name = strcmp(path, "-") ? path : "stdin";
    size_t got = 0;
    st = read_some(fd, name, buf, cap, &got, err, err_size);
    uint8_t extra;
    size_t more = 0;
    if (st == NM_OK && got == cap && (st = read_some(fd, name, &extra, 1, &more, err, err_size)) == NM_OK && more)
        st = over(name, cap, err, err_size); // (a file that grew past the cap since its size was checked)
    close(fd);
    if (st == NM_OK) *n = got;
    return st;
}
