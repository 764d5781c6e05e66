// The camera's system calls (camera.c): the V4L2 device is reached through
// this table, libc's by default. tests/unit/test_camera.c drives the capture
// code through an emulated driver with it (this machine and CI have no
// /dev/video), and a real camera where one exists.
#ifndef NM_CAMERA_H
#define NM_CAMERA_H

#include <poll.h>
#include <sys/types.h>

#include "nanomind.h"

typedef struct nm_v4l2_ops {
    void *ctx; // passed back to each call
    int (*open)(void *ctx, const char *path, int flags);
    int (*close)(void *ctx, int fd);
    int (*ioctl)(void *ctx, int fd, unsigned long request, void *arg); // -1 and errno as ioctl(2)
    void *(*mmap)(void *ctx, size_t len, int prot, int flags, int fd, off_t offset);
    int (*munmap)(void *ctx, void *addr, size_t len);
    int (*poll)(void *ctx, struct pollfd *fds, nfds_t n, int timeout_ms);
} nm_v4l2_ops;

// nm_camera_open through `ops` (copied; ops->ctx borrowed until close).
nm_status nm_camera_open_ops(const char *device, const nm_camera_params *p, const nm_v4l2_ops *ops,
                             nm_camera **out, char *err, size_t err_size);

#endif
