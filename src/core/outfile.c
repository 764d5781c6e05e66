// Output files that never damage what is already on disk (outfile.h).
#include "core/outfile.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fail.h"

// ---- the temporaries a signal must remove --------------------------------------------------
// Each open temporary's path, copied into a fixed slot that a signal handler
// may read (nm_outfile_remove_temps): no allocation, no lock. A slot is FREE,
// BUSY (its owner writes or clears the path) or LIVE (the handler may unlink
// it). One more temporary than there are slots is written all the same: only
// a signal would leave it, and the next run's stale sweep removes it.
enum { LIVE_SLOTS = 32, SLOT_FREE = 0, SLOT_BUSY, SLOT_LIVE };
static struct {
    atomic_int state;
    pid_t pid; // the process that made it: a forked child's signal never removes its parent's files
    char path[PATH_MAX];
} g_live[LIVE_SLOTS];

static void live_add(const char *tmp) {
    const size_t n = strlen(tmp);
    if (n >= PATH_MAX) return;
    for (int i = 0; i < LIVE_SLOTS; i++) {
        int want = SLOT_FREE;
        if (!atomic_compare_exchange_strong(&g_live[i].state, &want, SLOT_BUSY)) continue;
        memcpy(g_live[i].path, tmp, n + 1);
        g_live[i].pid = getpid();
        atomic_store(&g_live[i].state, SLOT_LIVE);
        return;
    }
}

// After the temporary is renamed or removed (a signal in between unlinks a name no longer there).
static void live_remove(const char *tmp) {
    for (int i = 0; i < LIVE_SLOTS; i++) {
        int want = SLOT_LIVE;
        if (g_live[i].pid != getpid() || strcmp(g_live[i].path, tmp)) continue;
        if (!atomic_compare_exchange_strong(&g_live[i].state, &want, SLOT_BUSY)) continue;
        g_live[i].path[0] = '\0';
        atomic_store(&g_live[i].state, SLOT_FREE);
        return;
    }
}

void nm_outfile_remove_temps(void) {
    const pid_t me = getpid();
    for (int i = 0; i < LIVE_SLOTS; i++)
        if (atomic_load(&g_live[i].state) == SLOT_LIVE && g_live[i].pid == me) unlink(g_live[i].path);
}

// A decimal number as open writes one (%ld, %u: no sign, no leading zero), at
// most max, ending at *end; false otherwise.
static bool parse_num(const char *s, unsigned long max, unsigned long *v, const char **end) {
    if (*s < '0' || *s > '9' || (s[0] == '0' && s[1] >= '0' && s[1] <= '9')) return false;
    unsigned long x = 0;
    for (; *s >= '0' && *s <= '9'; s++) {
        if (x > (max - (unsigned long)(*s - '0')) / 10) return false;
        x = x * 10 + (unsigned long)(*s - '0');
    }
    *v = x, *end = s;
    return true;
}

// Removes the temporaries that runs killed before they could (SIGKILL, a
// crash, a power cut) left for this output: in its folder, the regular files
// of ours named exactly .BASE.nm-PID-N.tmp whose PID is no process. Nothing
// else is touched: another name, another owner, a PID that lives (or that we
// may not ask about) stays.
static void remove_stale(const char *dir, const char *base) {
    DIR *d = opendir(dir);
    if (!d) return;
    const size_t bl = strlen(base);
    const pid_t me = getpid();
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *n = e->d_name, *p;
        unsigned long pid, k;
        if (n[0] != '.' || strncmp(n + 1, base, bl) || strncmp(n + 1 + bl, ".nm-", 4)) continue;
        if (!parse_num(n + 1 + bl + 4, INT_MAX, &pid, &p) || *p != '-' || !parse_num(p + 1, UINT_MAX, &k, &p) ||
            strcmp(p, ".tmp") || pid == 0 || (pid_t)pid == me)
            continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;
        struct stat st;
        if (fstatat(dirfd(d), n, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid())
            continue;
        (void)unlinkat(dirfd(d), n, 0);
    }
    closedir(d);
}

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
    if (!strcmp(path, "-") || !strcmp(path, "/dev/stdout")) { // the latter names no file where stdout is a pipe
        o->f = stdout;
        o->is_stdout = true;
        return NM_OK;
    }
    // Follow a symlink to what it names: that is the file to replace.
    struct stat st;
    char *target = NULL;
    if (lstat(path, &st) == 0 && S_ISLNK(st.st_mode)) {
        // (a link to a pipe or socket, as /dev/fd/N, has no path to resolve: stat still says what it is)
        struct stat to;
        if (!(target = realpath(path, NULL)) && !(stat(path, &to) == 0 && !S_ISREG(to.st_mode) && !S_ISDIR(to.st_mode)))
            return fail_errno(o, errno, err, err_size, "cannot follow the link");
        if (!target && !(target = strdup(path))) {
            reset(o);
            return nm_fail(NM_ERR_NOMEM, err, err_size, "out of memory");
        }
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
    {
        char *dir = dlen ? strndup(target, dlen) : NULL;
        remove_stale(dir ? dir : ".", base);
        free(dir);
    }
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
    live_add(o->tmp); // a signal removes it (nm_outfile_remove_temps)
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
    if (o->tmp) live_remove(o->tmp);
    free(o->tmp);
    o->tmp = NULL;
    reset(o);
    return NM_OK;
}

void nm_outfile_abort(nm_outfile *o) {
    if (o->f && !o->is_stdout) fclose(o->f);
    if (o->f && o->is_stdout) fflush(o->f);
    o->f = NULL;
    if (o->tmp) {
        unlink(o->tmp); // ours alone
        live_remove(o->tmp);
    }
    reset(o);
}
