// LD_PRELOAD=libnm_vcam_preload.so: the emulated camera (tests/unit/vcam.h)
// at /dev/video-nm-emu for an unchanged nanomind, through libc's own calls
// (open, ioctl, mmap, munmap, poll, close): what tests/cli/test_cli.sh runs
// `assistant --frames /dev/video-nm-emu` against, where no camera exists.
// Any other path or descriptor goes to libc. NM_VCAM_STILL=1: every frame the
// same picture (a still scene); NM_VCAM_MMAP=1: a driver without user
// pointers; NM_VCAM_GONE_AFTER=N: unplugged at the N-th VIDIOC_DQBUF. Test tooling only.
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <sys/ioctl.h>

#include "vcam.h"

#define VCAM_PATH "/dev/video-nm-emu"

static vcam V;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int vfd = -1; // the descriptor of the open camera (a /dev/null of its own), or -1

#define REAL(ret, name, ...)                                             \
    static ret (*real_##name)(__VA_ARGS__);                              \
    if (!real_##name) real_##name = (ret(*)(__VA_ARGS__))dlsym(RTLD_NEXT, #name)

static int is_cam(int fd) { return fd >= 0 && __atomic_load_n(&vfd, __ATOMIC_ACQUIRE) == fd; }

static int open_cam(int (*real)(const char *, int, ...), const char *path, int flags) {
    pthread_mutex_lock(&mu);
    if (vfd >= 0) {
        pthread_mutex_unlock(&mu);
        return errno = EBUSY, -1;
    }
    vc_free(&V);
    V = vc_default();
    V.path = VCAM_PATH;
    V.still = getenv("NM_VCAM_STILL") && atoi(getenv("NM_VCAM_STILL"));
    V.userptr_ok = !(getenv("NM_VCAM_MMAP") && atoi(getenv("NM_VCAM_MMAP")));
    V.dqbuf_fail_in = getenv("NM_VCAM_GONE_AFTER") ? atoi(getenv("NM_VCAM_GONE_AFTER")) : 0;
    const int fd = real("/dev/null", O_RDWR | O_CLOEXEC);
    if (fd >= 0) {
        V.fd = fd;
        vc_open(&V, path, flags);
        __atomic_store_n(&vfd, fd, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&mu);
    return fd;
}

// open and open64: the camera's path to the emulation, any other to libc (with its mode, when it takes one).
static int open_either(int (*real)(const char *, int, ...), const char *path, int flags, va_list ap) {
    if (!strcmp(path, VCAM_PATH)) return open_cam(real, path, flags);
    return flags & (O_CREAT | O_TMPFILE) ? real(path, flags, (mode_t)va_arg(ap, int)) : real(path, flags);
}

int open(const char *path, int flags, ...) {
    REAL(int, open, const char *, int, ...);
    va_list ap;
    va_start(ap, flags);
    const int fd = open_either(real_open, path, flags, ap);
    va_end(ap);
    return fd;
}

int open64(const char *path, int flags, ...) {
    REAL(int, open64, const char *, int, ...);
    va_list ap;
    va_start(ap, flags);
    const int fd = open_either(real_open64, path, flags, ap);
    va_end(ap);
    return fd;
}

int close(int fd) {
    REAL(int, close, int);
    if (is_cam(fd)) {
        pthread_mutex_lock(&mu);
        vc_close(&V, fd);
        __atomic_store_n(&vfd, -1, __ATOMIC_RELEASE);
        pthread_mutex_unlock(&mu);
    }
    return real_close(fd);
}

int ioctl(int fd, unsigned long req, ...) {
    REAL(int, ioctl, int, unsigned long, ...);
    va_list ap;
    va_start(ap, req);
    void *arg = va_arg(ap, void *);
    va_end(ap);
    if (!is_cam(fd)) return real_ioctl(fd, req, arg);
    pthread_mutex_lock(&mu);
    const int r = vc_ioctl(&V, fd, req, arg);
    const int e = errno;
    pthread_mutex_unlock(&mu);
    errno = e;
    return r;
}

void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
    REAL(void *, mmap, void *, size_t, int, int, int, off_t);
    if (!is_cam(fd)) return real_mmap(addr, len, prot, flags, fd, off);
    pthread_mutex_lock(&mu);
    void *m = vc_mmap(&V, len, prot, flags, fd, off);
    pthread_mutex_unlock(&mu);
    return m;
}

void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off) { return mmap(addr, len, prot, flags, fd, off); }

int munmap(void *addr, size_t len) {
    REAL(int, munmap, void *, size_t);
    pthread_mutex_lock(&mu);
    for (uint32_t i = 0; i < V.n_bufs; i++)
        if (V.b[i].mem && V.b[i].mem == addr) {
            vc_munmap(&V, addr, len);
            pthread_mutex_unlock(&mu);
            return 0;
        }
    pthread_mutex_unlock(&mu);
    return real_munmap(addr, len);
}

int poll(struct pollfd *fds, nfds_t n, int timeout_ms) {
    REAL(int, poll, struct pollfd *, nfds_t, int);
    if (n != 1 || !is_cam(fds[0].fd)) return real_poll(fds, n, timeout_ms);
    pthread_mutex_lock(&mu);
    const int r = vc_poll(&V, fds, n, 0);
    pthread_mutex_unlock(&mu);
    if (r == 0 && timeout_ms != 0) usleep(2000); // (no frame: the caller polls again)
    return r;
}
