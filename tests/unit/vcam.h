// An emulated V4L2 capture driver (the uAPI's semantics as a UVC webcam
// keeps them: formats, S_FMT clamping, USERPTR and MMAP buffers, the queue,
// DQBUF's flags and timestamps) behind nm_v4l2_ops, and injected trouble:
// corrupt, short and old frames, a device that goes. Used by
// tests/unit/test_camera.c directly and by tests/cli/vcam_preload.c (the
// assistant end to end, through libc's calls).
#ifndef NM_TEST_VCAM_H
#define NM_TEST_VCAM_H

#include <errno.h>
#include <linux/videodev2.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "io/camera/camera.h"

#define VC_FD 42
#define VC_MAX 16

typedef struct vcam {
    // what it is
    const char *path;      // the device's name
    int fd;                // the descriptor open() gives
    bool still;            // a still scene: every frame the same picture
    uint32_t caps;
    uint32_t formats[8];
    int n_formats;
    uint32_t max_w, max_h; // S_FMT clamps to these
    uint32_t pad;          // bytes past each row (bytesperline = w * bpp + pad)
    bool userptr_ok;       // REQBUFS(USERPTR) accepted
    bool userptr_qbuf_fails; // ... but the pages refused at QBUF (a contiguous-DMA driver)
    bool timeperframe;     // sets its rate
    uint32_t fps;
    int produce;           // frames completed a poll (with buffers queued)
    // injected trouble
    int error_frames;      // the next frames flagged V4L2_BUF_FLAG_ERROR
    int short_frames;      // the next frames with half their bytes
    int old_frames;        // the next frames stamped a second ago
    int dqbuf_errno;       // DQBUF fails so from now on
    int dqbuf_fail_in;     // > 0: the DQBUF that many calls from now fails with ENODEV (and every one after)
    bool poll_err;         // poll says POLLERR (unplugged)
    // state
    bool open, streaming;
    uint32_t fourcc, w, h, bpl, sizeimage, bpp;
    uint32_t memory, n_bufs;
    struct { uint8_t *mem; unsigned long userptr; uint32_t ulen; } b[VC_MAX];
    int queue[VC_MAX], nq, done[VC_MAX], nd;
    struct { uint32_t flags, bytesused, seq; uint64_t ts; } meta[VC_MAX];
    uint32_t frame;        // frames produced
    uint32_t last_frame_in[VC_MAX]; // the frame number each buffer holds
    int n_mapped;
} vcam;

static vcam vc_default(void) {
    return (vcam){.path = "/dev/vcam", .fd = VC_FD, .caps = V4L2_CAP_VIDEO_CAPTURE | V4L2_CAP_STREAMING, .formats = {V4L2_PIX_FMT_YUYV}, .n_formats = 1,
                  .max_w = 1280, .max_h = 720, .userptr_ok = true, .timeperframe = true, .fps = 30, .produce = 1};
}

// Frame f's byte at (x, y), byte k of the pixel: distinct per frame, row and column.
static uint8_t pattern(uint32_t f, uint32_t x, uint32_t y, uint32_t k) {
    return (uint8_t)(16 + ((x * 3 + y * 5 + f * 11 + k * 29) % 200));
}

static uint8_t *vc_buf(vcam *v, int i) { return v->memory == V4L2_MEMORY_USERPTR ? (uint8_t *)v->b[i].userptr : v->b[i].mem; }

static void vc_fill(vcam *v, int i) {
    uint8_t *d = vc_buf(v, i);
    const uint32_t f = v->still ? 0 : v->frame;
    v->frame++;
    if (v->fourcc == V4L2_PIX_FMT_MJPEG) { // a "JPEG" of a length that changes a frame
        const uint32_t n = 100 + f % 50;
        for (uint32_t k = 0; k < n; k++) d[k] = pattern(f, k, 0, 0);
        v->meta[i].bytesused = n;
    } else {
        for (uint32_t y = 0; y < v->h; y++) {
            for (uint32_t x = 0; x < v->w; x++)
                for (uint32_t k = 0; k < v->bpp; k++) d[y * v->bpl + x * v->bpp + k] = pattern(f, x, y, k);
            memset(d + y * v->bpl + v->w * v->bpp, 0xEE, v->pad); // the padding: never part of a frame
        }
        v->meta[i].bytesused = v->sizeimage;
    }
    v->meta[i].flags = V4L2_BUF_FLAG_DONE | V4L2_BUF_FLAG_TIMESTAMP_MONOTONIC;
    if (v->error_frames > 0) v->error_frames--, v->meta[i].flags |= V4L2_BUF_FLAG_ERROR;
    if (v->short_frames > 0) v->short_frames--, v->meta[i].bytesused /= 2;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t t = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    if (v->old_frames > 0) v->old_frames--, t -= 1000000000ull;
    v->meta[i].ts = t;
    v->meta[i].seq = v->frame - 1;
    v->last_frame_in[i] = v->frame - 1;
}

static int vc_open(void *ctx, const char *path, int flags) {
    (void)flags;
    vcam *v = ctx;
    if (strcmp(path, v->path)) return errno = ENOENT, -1;
    v->open = true;
    return v->fd;
}

static int vc_close(void *ctx, int fd) {
    vcam *v = ctx;
    if (fd != v->fd) return errno = EBADF, -1;
    v->open = false;
    return 0;
}

static void *vc_mmap(void *ctx, size_t len, int prot, int flags, int fd, off_t off) {
    (void)prot;
    vcam *v = ctx;
    const uint32_t i = (uint32_t)(off / 0x100000);
    if (fd != v->fd || !(flags & MAP_SHARED) || v->memory != V4L2_MEMORY_MMAP || i >= v->n_bufs || len != v->sizeimage)
        return errno = EINVAL, MAP_FAILED;
    v->n_mapped++;
    return v->b[i].mem;
}

static int vc_munmap(void *ctx, void *addr, size_t len) {
    (void)addr, (void)len;
    ((vcam *)ctx)->n_mapped--;
    return 0;
}

static int vc_poll(void *ctx, struct pollfd *fds, nfds_t n, int timeout_ms) {
    (void)n;
    vcam *v = ctx;
    fds[0].revents = 0;
    if (v->poll_err) return fds[0].revents = POLLERR, 1;
    for (int k = 0; v->streaming && k < v->produce && v->nq > 0; k++) { // the sensor delivers into the oldest queued
        const int i = v->queue[0];
        memmove(v->queue, v->queue + 1, sizeof(int) * (size_t)--v->nq);
        vc_fill(v, i);
        v->done[v->nd++] = i;
    }
    if (v->nd > 0) return fds[0].revents = POLLIN, 1;
    if (timeout_ms > 0) usleep(1000 * (unsigned)(timeout_ms < 5 ? timeout_ms : 5));
    return 0;
}

static int vc_ioctl(void *ctx, int fd, unsigned long req, void *arg) {
    vcam *v = ctx;
    if (fd != v->fd || !v->open) return errno = EBADF, -1;
    switch (req) {
    case VIDIOC_QUERYCAP: {
        struct v4l2_capability *c = arg;
        memset(c, 0, sizeof *c);
        strcpy((char *)c->driver, "vcam");
        strcpy((char *)c->card, "Emulated camera");
        c->capabilities = v->caps | V4L2_CAP_DEVICE_CAPS;
        c->device_caps = v->caps;
        return 0;
    }
    case VIDIOC_ENUM_FMT: {
        struct v4l2_fmtdesc *f = arg;
        if (f->type != V4L2_BUF_TYPE_VIDEO_CAPTURE || f->index >= (uint32_t)v->n_formats) return errno = EINVAL, -1;
        f->pixelformat = v->formats[f->index];
        return 0;
    }
    case VIDIOC_S_FMT: {
        struct v4l2_format *f = arg;
        if (v->streaming || v->n_bufs) return errno = EBUSY, -1;
        struct v4l2_pix_format *p = &f->fmt.pix;
        bool known = false;
        for (int i = 0; i < v->n_formats; i++) known |= v->formats[i] == p->pixelformat;
        if (!known) p->pixelformat = v->formats[0]; // as drivers do: another format, not an error
        p->width = p->width > v->max_w ? v->max_w : p->width < 16 ? 16 : p->width & ~1u;
        p->height = p->height > v->max_h ? v->max_h : p->height < 16 ? 16 : p->height;
        v->fourcc = p->pixelformat;
        v->bpp = v->fourcc == V4L2_PIX_FMT_YUYV ? 2 : v->fourcc == V4L2_PIX_FMT_RGB24 ? 3 : v->fourcc == V4L2_PIX_FMT_GREY ? 1 : 0;
        v->w = p->width;
        v->h = p->height;
        v->bpl = v->bpp ? v->w * v->bpp + v->pad : 0;
        v->sizeimage = v->bpp ? v->bpl * v->h : v->w * v->h; // MJPEG: room for the worst frame
        p->bytesperline = v->bpl;
        p->sizeimage = v->sizeimage;
        p->field = V4L2_FIELD_NONE;
        return 0;
    }
    case VIDIOC_G_PARM:
    case VIDIOC_S_PARM: {
        struct v4l2_streamparm *s = arg;
        if (req == VIDIOC_S_PARM && v->timeperframe) {
            const struct v4l2_fract t = s->parm.capture.timeperframe;
            v->fps = t.numerator ? (t.denominator + t.numerator / 2) / t.numerator : 30;
            if (v->fps > 60) v->fps = 60;
        }
        memset(&s->parm, 0, sizeof s->parm);
        s->parm.capture.capability = v->timeperframe ? V4L2_CAP_TIMEPERFRAME : 0;
        if (v->timeperframe) s->parm.capture.timeperframe = (struct v4l2_fract){1, v->fps};
        return 0;
    }
    case VIDIOC_REQBUFS: {
        struct v4l2_requestbuffers *r = arg;
        if (r->memory == V4L2_MEMORY_USERPTR && !v->userptr_ok) return errno = EINVAL, -1;
        if (r->memory != V4L2_MEMORY_USERPTR && r->memory != V4L2_MEMORY_MMAP) return errno = EINVAL, -1;
        if (v->streaming) return errno = EBUSY, -1;
        for (uint32_t i = 0; i < v->n_bufs; i++) free(v->b[i].mem);
        memset(v->b, 0, sizeof v->b);
        v->nq = v->nd = 0;
        v->n_bufs = r->count > VC_MAX ? VC_MAX : r->count;
        v->memory = r->memory;
        for (uint32_t i = 0; i < v->n_bufs && r->memory == V4L2_MEMORY_MMAP; i++) v->b[i].mem = calloc(1, v->sizeimage);
        r->count = v->n_bufs;
        return 0;
    }
    case VIDIOC_QUERYBUF: {
        struct v4l2_buffer *b = arg;
        if (b->index >= v->n_bufs || v->memory != V4L2_MEMORY_MMAP) return errno = EINVAL, -1;
        b->length = v->sizeimage;
        b->m.offset = b->index * 0x100000u;
        return 0;
    }
    case VIDIOC_QBUF: {
        struct v4l2_buffer *b = arg;
        if (b->index >= v->n_bufs || b->memory != v->memory || b->type != V4L2_BUF_TYPE_VIDEO_CAPTURE) return errno = EINVAL, -1;
        for (int k = 0; k < v->nq; k++)
            if (v->queue[k] == (int)b->index) return errno = EINVAL, -1; // queued twice
        for (int k = 0; k < v->nd; k++)
            if (v->done[k] == (int)b->index) return errno = EINVAL, -1;
        if (v->memory == V4L2_MEMORY_USERPTR) {
            if (v->userptr_qbuf_fails) return errno = EFAULT, -1;
            if (!b->m.userptr || b->length < v->sizeimage) return errno = EINVAL, -1;
            v->b[b->index].userptr = b->m.userptr;
            v->b[b->index].ulen = b->length;
        }
        v->queue[v->nq++] = (int)b->index;
        return 0;
    }
    case VIDIOC_DQBUF: {
        struct v4l2_buffer *b = arg;
        if (v->dqbuf_fail_in > 0 && --v->dqbuf_fail_in == 0) v->dqbuf_errno = ENODEV;
        if (v->dqbuf_errno) return errno = v->dqbuf_errno, -1;
        if (b->memory != v->memory) return errno = EINVAL, -1;
        if (v->nd == 0) return errno = EAGAIN, -1;
        const int i = v->done[0];
        memmove(v->done, v->done + 1, sizeof(int) * (size_t)--v->nd);
        b->index = (uint32_t)i;
        b->flags = v->meta[i].flags;
        b->bytesused = v->meta[i].bytesused;
        b->sequence = v->meta[i].seq;
        b->timestamp.tv_sec = (time_t)(v->meta[i].ts / 1000000000ull);
        b->timestamp.tv_usec = (suseconds_t)(v->meta[i].ts % 1000000000ull / 1000);
        if (v->memory == V4L2_MEMORY_USERPTR) b->m.userptr = v->b[i].userptr, b->length = v->b[i].ulen;
        else b->m.offset = (uint32_t)i * 0x100000u, b->length = v->sizeimage;
        return 0;
    }
    case VIDIOC_STREAMON:
        if (!v->n_bufs) return errno = EINVAL, -1;
        v->streaming = true;
        return 0;
    case VIDIOC_STREAMOFF:
        v->streaming = false;
        v->nq = v->nd = 0; // every buffer dequeued, filled or not
        return 0;
    }
    return errno = ENOTTY, -1;
}

// Every slot of the ring can be taken for write now (none leaked), then given back.
static inline bool all_slots_free(nm_tabm *r) {
    const uint32_t n = nm_tabm_n_slots(r);
    nm_tabm_slot s[64];
    uint32_t k = 0;
    while (k < n && k < 64 && nm_tabm_acquire_write(r, 9, 0, &s[k]) == NM_OK) k++;
    for (uint32_t i = 0; i < k; i++) nm_tabm_cancel(r, &s[i]);
    return k == n;
}

static inline nm_v4l2_ops vc_ops(vcam *v) { return (nm_v4l2_ops){v, vc_open, vc_close, vc_ioctl, vc_mmap, vc_munmap, vc_poll}; }

static void vc_free(vcam *v) {
    for (uint32_t i = 0; i < v->n_bufs; i++) free(v->b[i].mem);
}

#endif
