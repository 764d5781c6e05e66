// Dead peers of a cross-process TABM ring: a child attaches the parent's ring
// by fd and is killed with SIGKILL while it holds a slot for write or for read,
// and at every step inside every ring call (nm_tabm_crash_countdown). The
// parent must never hang: readers of a shut-down ring end, writers of a full
// ring get the dead reader's slot back, the lock a dead child held is taken
// over and its half-done step undone (nm_tabm_check: every slot in exactly
// one place, counts right), and the ring stays usable. Each wait has a
// deadline far above the 100 ms the ring needs, so a hang fails, never blocks.
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <unistd.h>

#include "nmtest.h"
#include "mem/umem.h"
#include "tabm/tabm.h"

#define SEC 1000000000ll

static int put(nm_tabm *r, int32_t v, int64_t timeout) {
    nm_tabm_slot s;
    nm_status st = nm_tabm_acquire_write(r, 1, timeout, &s);
    if (st) return st;
    *(int32_t *)s.data = v;
    s.meta->kind = NM_TABM_TOKENS;
    s.meta->ndim = 1;
    s.meta->shape[0] = 1;
    s.meta->size = 4;
    return nm_tabm_publish(r, &s);
}

// The child's side: attach by fd (as another program would), then `body`.
typedef int (*child_fn)(nm_tabm *r, int k, int ready_fd);

static pid_t spawn(nm_tabm *parent, child_fn body, int k, int *ready_fd) {
    int p[2];
    if (pipe(p) != 0) return -1;
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        close(p[0]);
        nm_tabm *r = NULL;
        char err[256];
        if (nm_tabm_attach(nm_tabm_fd(parent), -1, &r, err, sizeof err) != NM_OK) _exit(90);
        _exit(body(r, k, p[1]));
    }
    close(p[1]);
    *ready_fd = p[0];
    return pid;
}

static void tell(int fd) {
    char c = 1;
    ssize_t w = write(fd, &c, 1);
    (void)w;
}
static bool wait_ready(int fd) {
    char c;
    bool ok = read(fd, &c, 1) == 1;
    close(fd);
    return ok;
}

static int hold_write(nm_tabm *r, int k, int fd) {
    (void)k;
    nm_tabm_slot s;
    if (nm_tabm_acquire_write(r, 7, SEC, &s) != NM_OK) return 91;
    tell(fd);
    for (;;) pause();
}

static int hold_read(nm_tabm *r, int k, int fd) {
    (void)k;
    nm_tabm_slot s;
    if (nm_tabm_acquire_read(r, SEC, &s) != NM_OK) return 91;
    tell(fd);
    for (;;) pause();
}

typedef struct killer {
    pid_t pid;
    int delay_ms;
} killer;
static void *kill_later(void *arg) {
    killer *k = arg;
    usleep((useconds_t)k->delay_ms * 1000);
    kill(k->pid, SIGKILL);
    return NULL;
}

static void check_ring(nm_tabm *r, int *nmtest_failed) {
    char err[256] = "";
    nm_status st = nm_tabm_check(r, err, sizeof err);
    if (st) fprintf(stderr, "  ring: %s\n", err);
    NM_CHECK(st == NM_OK);
}

// A ring of n_slots holding message `first`, and a child that attached it and
// holds a slot (hold_write or hold_read) until killed.
static pid_t ring_with_holder(nm_tabm **r, uint32_t n_slots, int32_t first, child_fn hold, int *nmtest_failed) {
    NM_CHECK(nm_tabm_create(NULL, n_slots, 64, r, NULL, 0) == NM_OK);
    NM_CHECK(put(*r, first, 0) == NM_OK);
    int fd;
    pid_t pid = spawn(*r, hold, 0, &fd);
    NM_CHECK(pid > 0 && wait_ready(fd));
    return pid;
}

// The first case: a producer dies holding a slot for write; a reader
// of the shut-down ring waits for that writer and must end anyway. The child
// is not waited for until the end: a zombie is dead too.
NM_TEST(deadpeer_writer_killed_while_reader_drains) {
    alarm(120); // a hang ends the test (SIGALRM) instead of blocking ctest
    nm_tabm *r = NULL;
    pid_t pid = ring_with_holder(&r, 2, 11, hold_write, nmtest_failed);
    nm_tabm_shutdown(r); // the child lives: nothing to reclaim yet
    NM_CHECK(nm_tabm_get_stats(r).reclaimed_write == 0);
    nm_tabm_slot s;
    NM_CHECK(nm_tabm_acquire_read(r, 5 * SEC, &s) == NM_OK && *(int32_t *)s.data == 11);
    NM_CHECK(nm_tabm_release(r, &s) == NM_OK);
    pthread_t th;
    killer k = {pid, 50};
    pthread_create(&th, NULL, kill_later, &k);
    uint64_t t0 = nm_now_ns();
    nm_status st = nm_tabm_acquire_read(r, 10 * SEC, &s); // waits for the writer, who dies
    double waited = (double)(nm_now_ns() - t0) * 1e-9;
    pthread_join(th, NULL);
    NM_CHECK(st == NM_ERR_SHUTDOWN);
    if (st != NM_ERR_SHUTDOWN) fprintf(stderr, "  acquire_read: %d after %.2f s\n", st, waited);
    nm_tabm_stats ss = nm_tabm_get_stats(r);
    NM_CHECK(ss.reclaimed_write == 1 && ss.reclaimed_read == 0 && ss.occupancy == 0);
    check_ring(r, nmtest_failed);
    NM_CHECK(waitpid(pid, NULL, 0) == pid);
    nm_tabm_free(r);
}

// A consumer dies holding the only slot for read: the writer waiting on the
// full ring gets it back. The child is reaped first here (not a zombie).
NM_TEST(deadpeer_reader_killed_while_writer_waits) {
    alarm(120); // a hang ends the test (SIGALRM) instead of blocking ctest
    nm_tabm *r = NULL;
    pid_t pid = ring_with_holder(&r, 1, 5, hold_read, nmtest_failed);
    NM_CHECK(put(r, 6, 0) == NM_ERR_AGAIN); // full: the child holds the slot
    pthread_t th;
    killer k = {pid, 50};
    pthread_create(&th, NULL, kill_later, &k);
    NM_CHECK(put(r, 6, 10 * SEC) == NM_OK);
    pthread_join(th, NULL);
    NM_CHECK(waitpid(pid, NULL, 0) == pid);
    nm_tabm_stats ss = nm_tabm_get_stats(r);
    NM_CHECK(ss.reclaimed_read == 1 && ss.reclaimed_write == 0);
    nm_tabm_slot s;
    NM_CHECK(nm_tabm_acquire_read(r, 0, &s) == NM_OK && *(int32_t *)s.data == 6);
    NM_CHECK(nm_tabm_release(r, &s) == NM_OK);
    check_ring(r, nmtest_failed);
    nm_tabm_free(r);
}

// nm_tabm_reclaim on demand (a poller's way): nothing while the holder lives.
NM_TEST(deadpeer_reclaim_on_demand) {
    alarm(120); // a hang ends the test (SIGALRM) instead of blocking ctest
    nm_tabm *r = NULL;
    NM_CHECK(nm_tabm_create(NULL, 3, 64, &r, NULL, 0) == NM_OK);
    int fd;
    pid_t pid = spawn(r, hold_write, 0, &fd);
    NM_CHECK(pid > 0 && wait_ready(fd));
    NM_CHECK(nm_tabm_reclaim(r) == 0);
    NM_CHECK(nm_tabm_get_stats(r).occupancy == 1);
    kill(pid, SIGKILL);
    NM_CHECK(waitpid(pid, NULL, 0) == pid);
    NM_CHECK(nm_tabm_reclaim(r) == 1);
    NM_CHECK(nm_tabm_reclaim(r) == 0);
    NM_CHECK(nm_tabm_get_stats(r).occupancy == 0);
    check_ring(r, nmtest_failed);
    nm_tabm_free(r);
}

// ---- kill -9 at every step of every call -------------------------------------------------
// Each op: what the child does before arming the countdown (its prefix, whole),
// then the call under test with the countdown at k. The parent has published
// two messages (values 1, 2) before; the child's own message is 100.
enum { OP_ACQ_WRITE, OP_PUBLISH, OP_CANCEL, OP_ACQ_READ, OP_RELEASE, OP_REAP, N_OPS };
static const char *op_name[N_OPS] = {"acquire_write", "publish", "cancel", "acquire_read", "release",
                                     "reclaim of a dead peer's slot"};
static _Atomic int g_op;

static int step_child(nm_tabm *r, int k, int fd) {
    (void)fd;
    nm_tabm_slot s;
    int op = atomic_load(&g_op);
    if (op == OP_REAP) {
        // A grandchild holds a slot and dies; this child reclaims it, and is
        // killed at step k of that.
        pid_t g = fork();
        if (g == 0) {
            nm_tabm_slot gs;
            _exit(nm_tabm_acquire_write(r, 9, SEC, &gs) == NM_OK ? 0 : 91);
        }
        int ws;
        if (waitpid(g, &ws, 0) != g || !WIFEXITED(ws) || WEXITSTATUS(ws) != 0) return 92;
        atomic_store(&nm_tabm_crash_countdown, k);
        return nm_tabm_reclaim(r) == 1 ? 0 : 93;
    }
    if (op == OP_PUBLISH || op == OP_CANCEL) {
        if (nm_tabm_acquire_write(r, 9, SEC, &s) != NM_OK) return 91;
        *(int32_t *)s.data = 100;
        s.meta->kind = NM_TABM_TOKENS;
        s.meta->ndim = 1;
        s.meta->shape[0] = 1;
        s.meta->size = 4;
    }
    if (op == OP_RELEASE && nm_tabm_acquire_read(r, SEC, &s) != NM_OK) return 91;
    atomic_store(&nm_tabm_crash_countdown, k);
    nm_status st = NM_OK;
    switch (op) {
    case OP_ACQ_WRITE: st = nm_tabm_acquire_write(r, 9, SEC, &s); break;
    case OP_PUBLISH: st = nm_tabm_publish(r, &s); break;
    case OP_CANCEL: st = nm_tabm_cancel(r, &s); break;
    case OP_ACQ_READ: st = nm_tabm_acquire_read(r, SEC, &s); break;
    case OP_RELEASE: st = nm_tabm_release(r, &s); break;
    }
    atomic_store(&nm_tabm_crash_countdown, 0);
    return st == NM_OK ? 0 : 94; // survived every step: the call completed
}

// After the child's death at some step: the ring is whole, and what it holds
// reads back as a subset of {1, 2, 100} in publish order, none twice, with 1
// and 2 present unless the child was reading.
static void check_after(nm_tabm *r, int op, int *nmtest_failed) {
    check_ring(r, nmtest_failed);
    nm_tabm_reclaim(r);
    check_ring(r, nmtest_failed);
    nm_tabm_stats ss = nm_tabm_get_stats(r);
    NM_CHECK(ss.occupancy == ss.ready); // nothing held any more
    int got[4], n = 0;
    nm_tabm_slot s;
    while (n < 4 && nm_tabm_acquire_read(r, 0, &s) == NM_OK) {
        got[n++] = *(int32_t *)s.data;
        NM_CHECK(nm_tabm_release(r, &s) == NM_OK);
    }
    // The child's read either was undone (1 back at the head) or took 1,
    // which died with it; a release undone leaves 1 held, then reaped.
    int i = 2;
    if ((op == OP_ACQ_READ && !(n >= 1 && got[0] == 1)) || op == OP_RELEASE) {
        NM_CHECK(n >= 1 && got[0] == 2);
        i = 1;
    } else {
        NM_CHECK(n >= 2 && got[0] == 1 && got[1] == 2);
    }
    for (; i < n; i++) NM_CHECK(got[i] == 100 && op == OP_PUBLISH);
    // Usable at full size again.
    for (int k = 0; k < 3; k++) NM_CHECK(put(r, 200 + k, 0) == NM_OK);
    for (int k = 0; k < 3; k++) {
        NM_CHECK(nm_tabm_acquire_read(r, 0, &s) == NM_OK && *(int32_t *)s.data == 200 + k);
        NM_CHECK(nm_tabm_release(r, &s) == NM_OK);
    }
    check_ring(r, nmtest_failed);
}

NM_TEST(deadpeer_killed_at_every_step) {
    alarm(120); // a hang ends the test (SIGALRM) instead of blocking ctest
    int total = 0;
    for (int op = 0; op < N_OPS; op++) {
        atomic_store(&g_op, op);
        int k = 1, points = 0;
        for (;; k++) {
            nm_tabm *r = NULL;
            NM_CHECK(nm_tabm_create(NULL, 3, 64, &r, NULL, 0) == NM_OK);
            NM_CHECK(put(r, 1, 0) == NM_OK && put(r, 2, 0) == NM_OK);
            int fd, ws = 0;
            pid_t pid = spawn(r, step_child, k, &fd);
            close(fd);
            NM_CHECK(pid > 0 && waitpid(pid, &ws, 0) == pid);
            bool killed = WIFSIGNALED(ws) && WTERMSIG(ws) == SIGKILL;
            if (!killed) {
                if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0) {
                    fprintf(stderr, "  %s, step %d: child status %#x\n", op_name[op], k, ws);
                    *nmtest_failed = 1;
                }
                nm_tabm_free(r);
                break; // the call has fewer than k steps: all were tried
            }
            points++;
            int failed_before = *nmtest_failed;
            check_after(r, op, nmtest_failed);
            if (*nmtest_failed && !failed_before) fprintf(stderr, "  killed in %s at step %d\n", op_name[op], k);
            nm_tabm_free(r);
            if (k > 64) {
                NM_CHECK(!"more than 64 crash points in one call");
                break;
            }
        }
        NM_CHECK(points >= 3);
        fprintf(stderr, "  %s: killed at each of its %d steps\n", op_name[op], points);
        total += points;
    }
    NM_CHECK(total > 20);
}

// A reader asleep on an empty ring while a writer of another process
// publishes and is killed at each step of it, the last one between the
// publish and its wake: the reader gets the message (from the dead writer's
// undone or finished step, through the lock's take-over or its bounded
// sleep), or, when the step was undone, nothing until shutdown; never a hang.
typedef struct reader_arg {
    nm_tabm *r;
    nm_status st;
    int32_t v;
    _Atomic int done;
} reader_arg;
static void *read_one(void *arg) {
    reader_arg *a = arg;
    nm_tabm_slot s;
    a->st = nm_tabm_acquire_read(a->r, 30 * SEC, &s);
    if (a->st == NM_OK) {
        a->v = *(int32_t *)s.data;
        nm_tabm_release(a->r, &s);
    }
    atomic_store(&a->done, 1);
    return NULL;
}

NM_TEST(deadpeer_publisher_killed_before_its_wake) {
    alarm(120);
    atomic_store(&g_op, OP_PUBLISH);
    int got = 0, undone = 0;
    for (int k = 1; k <= 64; k++) {
        nm_tabm *r = NULL;
        NM_CHECK(nm_tabm_create(NULL, 2, 64, &r, NULL, 0) == NM_OK);
        reader_arg a = {.r = r};
        pthread_t th;
        pthread_create(&th, NULL, read_one, &a);
        usleep(20000); // the reader sleeps on the empty ring
        int fd, ws = 0;
        pid_t pid = spawn(r, step_child, k, &fd);
        close(fd);
        NM_CHECK(pid > 0 && waitpid(pid, &ws, 0) == pid);
        bool killed = WIFSIGNALED(ws) && WTERMSIG(ws) == SIGKILL;
        // A published message must reach the sleeping reader with no help.
        for (int i = 0; i < 300 && !atomic_load(&a.done); i++) {
            if (nm_tabm_get_stats(r).ready == 0 && nm_tabm_get_stats(r).occupancy == 0 && i > 50) break;
            usleep(10000);
        }
        if (!atomic_load(&a.done)) {
            NM_CHECK(nm_tabm_get_stats(r).ready == 0); // left waiting with a message there: a lost wake
            nm_tabm_shutdown(r);
            undone++;
        } else {
            got++;
        }
        pthread_join(th, NULL);
        NM_CHECK(a.st == NM_OK ? a.v == 100 : a.st == NM_ERR_SHUTDOWN);
        check_ring(r, nmtest_failed);
        nm_tabm_free(r);
        if (!killed) break; // the call finished: every step was tried
    }
    fprintf(stderr, "  reader got the message %d times, the publish was undone %d times\n", got, undone);
    NM_CHECK(got >= 2 && undone >= 1);
}

NM_TEST_MAIN()
