// Output files that never damage what is already on disk (outfile.h).
#include "core/outfile.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fail.h"

static void reset(nm_outfile *o) {
    free(o->path);
    free(o->final);
    free(o->tmp);
    memset(o, 0, sizeof *o);
}

static nm_status fail_errno(nm_outfile *o, int e, char *err, size_t err_size, const char *what) {
    nm_status st = nm_fail(NM_ERR_IO, err, err_size, "%s: %s: %s", o->path ? o->path : "?", what, strerror(e));
    nm_outfile_abort(o);
    return st;
}

nm_status nm_outfile_open(nm_outfile *o, const char *path, char *err, size_t err_size) {
    memset(o, 0, sizeof *o);
    if (err && err_size) err[0] = '\0';
    if (!path || !*path) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "no output path");
    if (!(o->path = strdup(path))) return nm_fail(NM_ERR_NOMEM, err, err_size, "out of memory");
    if (!strcmp(path, "-")) {
        o->f = stdout;
        o->is_stdout = true;
        return NM_OK;
    }
    // Follow a symlink to what it names: that is the file to replace.
    struct stat st;
    char *target = NULL;
    if (lstat(path, &st) == 0 && S_ISLNK(st.st_mode)) {
        if (!(target = realpath(path, NULL))) return fail_errno(o, errno, err, err_size, "cannot follow the link");
    } else if (!(target = strdup(path))) {
        reset(o);
        return nm_fail(NM_ERR_NOMEM, err, err_size, "out of memory");
    }
    const bool exists = stat(target, &st) == 0;
    if (!exists && errno != ENOENT) {
        int e = errno;
        free(target);
        return fail_errno(o, e, err, err_size, "cannot write");
    }
    if (exists && S_ISDIR(st.st_mode)) {
        free(target);
        return fail_errno(o, EISDIR, err, err_size, "cannot write");
    }
    if (exists && !S_ISREG(st.st_mode)) {
        // A device, FIFO or socket: in place. O_NONBLOCK so that a FIFO without
        // a reader fails (ENXIO) instead of blocking; blocking writes after.
        free(target);
        int fd = open(path, O_WRONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
        if (fd < 0) {
            int e = errno;
            return fail_errno(o, e, err, err_size, e == ENXIO ? "a FIFO with no reader" : "cannot open");
        }
        int fl = fcntl(fd, F_GETFL);
        if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
        if (!(o->f = fdopen(fd, "wb"))) {
            int e = errno;
            close(fd);
            return fail_errno(o, e, err, err_size, "cannot open");
        }
        return NM_OK;
    }
    // A read-only file stays as it is, as `>` would leave it: the rename below
    // needs only the folder's write permission, so ask about the file itself.
    if (exists && access(target, W_OK) != 0) {
        int e = errno;
        free(target);
        return fail_errno(o, e, err, err_size, "cannot write");
    }
    // A regular file or a new one: a temporary beside it.
    const char *slash = strrchr(target, '/');
    const size_t dlen = slash ? (size_t)(slash - target) + 1 : 0;
    const char *base = slash ? slash + 1 : target;
    const size_t cap = strlen(target) + 48;
    if (!(o->tmp = malloc(cap))) {
        free(target);
        reset(o);
        return nm_fail(NM_ERR_NOMEM, err, err_size, "out of memory");
    }
    o->final = target;
    int fd = -1;
    static unsigned counter;
    for (int attempt = 0; attempt < 100 && fd < 0; attempt++) {
        snprintf(o->tmp, cap, "%.*s.%s.nm-%ld-%u.tmp", (int)dlen, target, base, (long)getpid(), counter++);
        fd = open(o->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, exists ? (st.st_mode & 07777) : 0666);
        if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0) {
        int e = errno;
        free(o->tmp);
        o->tmp = NULL; // nothing of ours to remove
        return fail_errno(o, e, err, err_size, "cannot create a file in its folder");
    }
    if (exists) (void)fchmod(fd, st.st_mode & 07777); // the mode the old file had, past the umask
    if (!(o->f = fdopen(fd, "wb"))) {
        int e = errno;
        close(fd);
        return fail_errno(o, e, err, err_size, "cannot open");
    }
    o->seekable = true;
    return NM_OK;
}

nm_status nm_outfile_commit(nm_outfile *o, char *err, size_t err_size) {
    if (err && err_size) err[0] = '\0';
    if (!o->f) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "output not open");
    errno = 0;
    if (fflush(o->f) != 0 || ferror(o->f)) return fail_errno(o, errno ? errno : EIO, err, err_size, "write failed");
    if (o->is_stdout) {
        o->f = NULL;
        reset(o);
        return NM_OK;
    }
    if (o->tmp && fsync(fileno(o->f)) != 0) return fail_errno(o, errno, err, err_size, "write failed");
    FILE *f = o->f;
    o->f = NULL;
    if (fclose(f) != 0) return fail_errno(o, errno, err, err_size, "write failed");
    if (o->tmp && rename(o->tmp, o->final) != 0) return fail_errno(o, errno, err, err_size, "cannot replace");
    free(o->tmp);
    o->tmp = NULL;
    reset(o);
    return NM_OK;
}

void nm_outfile_abort(nm_outfile *o) {
    if (o->f && !o->is_stdout) fclose(o->f);
    if (o->f && o->is_stdout) fflush(o->f);
    o->f = NULL;
    if (o->tmp) unlink(o->tmp); // ours alone
    reset(o);
}
