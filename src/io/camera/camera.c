// The camera (nanomind.h, "the camera"; docs/cli.md, assistant --frames
// /dev/videoN): V4L2 single-planar capture with streaming I/O
// (https://docs.kernel.org/userspace-api/media/v4l/capture.html). Frames go
// into the ring's IMAGE slots: with V4L2_MEMORY_USERPTR the queued buffers
// are the slots themselves (the driver writes the frame where the vision
// brick reads it); with V4L2_MEMORY_MMAP the driver's buffers are mapped and
// each frame is copied into a slot through the ledger.
#include "io/camera/camera.h"
#include "core/clock.h"
#include "core/fail.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/videodev2.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

typedef struct cam_buf {
    void *map;        // MMAP: the driver's buffer, mapped
    size_t len;
    nm_tabm_slot slot; // USERPTR: the slot queued as this buffer
    bool queued;      // with the driver
} cam_buf;

struct nm_camera {
    nm_v4l2_ops ops;
    int fd;
    char dev[256];
    nm_camera_params p;
    nm_camera_info info;
    nm_camera_stats st;
    uint32_t bytesperline, bpp; // bpp 0: compressed (MJPEG)
    bool started, streaming, userptr;
    nm_tabm *ring;
    nm_tabm *own_ring; // nm_camera_start's ring NULL: the camera's own (freed at close)
    uint32_t producer;
    uint32_t n_bufs, n_queued;
    cam_buf buf[NM_CAMERA_MAX_BUFFERS];
    int ep_cam, ep_vision;
    char err[320];
};

// ---- libc's calls ----------------------------------------------------------------------------

static int sys_open(void *ctx, const char *path, int flags) { return (void)ctx, open(path, flags); }
static int sys_close(void *ctx, int fd) { return (void)ctx, close(fd); }
static int sys_ioctl(void *ctx, int fd, unsigned long req, void *arg) { return (void)ctx, ioctl(fd, req, arg); }
static void *sys_mmap(void *ctx, size_t len, int prot, int flags, int fd, off_t off) {
    return (void)ctx, mmap(NULL, len, prot, flags, fd, off);
}
static int sys_munmap(void *ctx, void *addr, size_t len) { return (void)ctx, munmap(addr, len); }
static int sys_poll(void *ctx, struct pollfd *fds, nfds_t n, int timeout_ms) { return (void)ctx, poll(fds, n, timeout_ms); }

static const nm_v4l2_ops sys_ops = {NULL, sys_open, sys_close, sys_ioctl, sys_mmap, sys_munmap, sys_poll};

// ---- helpers ---------------------------------------------------------------------------------

__attribute__((format(printf, 3, 4))) static nm_status cfail(nm_camera *c, nm_status st, const char *fmt, ...) {
    char prefix[sizeof c->dev + 16];
    snprintf(prefix, sizeof prefix, "camera %s: ", c->dev);
    va_list ap;
    va_start(ap, fmt);
    nm_vfail(st, c->err, sizeof c->err, prefix, fmt, ap);
    va_end(ap);
    return st;
}

// ioctl, again while a signal interrupts it.
static int xioctl(nm_camera *c, unsigned long req, void *arg) {
    int r;
    do r = c->ops.ioctl(c->ops.ctx, c->fd, req, arg);
    while (r < 0 && errno == EINTR);
    return r;
}


static void fourcc_str(uint32_t f, char s[5]) {
    for (int i = 0; i < 4; i++) {
        const char ch = (char)((f >> (8 * i)) & 0xff);
        s[i] = ch >= 32 && ch < 127 ? ch : '?';
    }
    s[4] = '\0';
}

static const uint32_t preferred[] = {V4L2_PIX_FMT_YUYV, V4L2_PIX_FMT_MJPEG, V4L2_PIX_FMT_RGB24, V4L2_PIX_FMT_GREY};

static uint32_t bytes_per_pixel(uint32_t fourcc) {
    switch (fourcc) {
    case V4L2_PIX_FMT_YUYV: return 2;
    case V4L2_PIX_FMT_RGB24: return 3;
    case V4L2_PIX_FMT_GREY: return 1;
    }
    return 0; // MJPEG: a JPEG of any length up to sizeimage
}

nm_camera_params nm_camera_default_params(void) {
    return (nm_camera_params){.width = 640, .height = 480, .fps = 0, .fourcc = 0, .n_buffers = 4};
}

// ---- open: capabilities, format, rate --------------------------------------------------------

static nm_status negotiate(nm_camera *c) {
    struct v4l2_capability cap = {0};
    if (xioctl(c, VIDIOC_QUERYCAP, &cap) < 0)
        return cfail(c, errno == ENOTTY ? NM_ERR_UNSUPPORTED : NM_ERR_IO, "not a V4L2 device (VIDIOC_QUERYCAP: %s)",
                     strerror(errno));
    const uint32_t caps = (cap.capabilities & V4L2_CAP_DEVICE_CAPS) ? cap.device_caps : cap.capabilities;
    snprintf(c->info.driver, sizeof c->info.driver, "%.15s", (const char *)cap.driver);
    snprintf(c->info.card, sizeof c->info.card, "%.31s", (const char *)cap.card);
    if (!(caps & V4L2_CAP_VIDEO_CAPTURE))
        return cfail(c, NM_ERR_UNSUPPORTED, "'%s' is not a single-planar video capture device%s", c->info.card,
                     (caps & V4L2_CAP_VIDEO_CAPTURE_MPLANE) ? " (multi-planar capture is not read)" : "");
    if (!(caps & V4L2_CAP_STREAMING))
        return cfail(c, NM_ERR_UNSUPPORTED, "'%s' has no streaming I/O (read() cameras are not read)", c->info.card);

    // the formats it offers, and the first of ours among them
    uint32_t want = c->p.fourcc, offered[32];
    int n_off = 0;
    for (uint32_t i = 0; i < 64; i++) {
        struct v4l2_fmtdesc fd = {.index = i, .type = V4L2_BUF_TYPE_VIDEO_CAPTURE};
        if (xioctl(c, VIDIOC_ENUM_FMT, &fd) < 0) break;
        if (n_off < 32) offered[n_off++] = fd.pixelformat;
    }
    uint32_t fourcc = 0;
    for (size_t k = 0; k < sizeof preferred / sizeof preferred[0] && !fourcc; k++)
        for (int i = 0; i < n_off; i++)
            if (offered[i] == preferred[k] && (!want || want == preferred[k])) fourcc = preferred[k];
    if (!fourcc) {
        char list[200] = "", f[5];
        for (int i = 0; i < n_off && strlen(list) + 8 < sizeof list; i++) {
            fourcc_str(offered[i], f);
            strcat(list, i ? ", " : "");
            strcat(list, f);
        }
        if (want) {
            fourcc_str(want, f);
            return cfail(c, NM_ERR_UNSUPPORTED, "format %s asked for: %s (it offers %s; YUYV, MJPG, RGB3, GREY are read)",
                         f, bytes_per_pixel(want) || want == V4L2_PIX_FMT_MJPEG ? "not offered" : "not read",
                         n_off ? list : "none");
        }
        return cfail(c, NM_ERR_UNSUPPORTED, "offers %s: none of YUYV, MJPG, RGB3, GREY", n_off ? list : "no format");
    }

    struct v4l2_format fmt = {.type = V4L2_BUF_TYPE_VIDEO_CAPTURE};
    fmt.fmt.pix.width = (uint32_t)(c->p.width > 0 ? c->p.width : 640);
    fmt.fmt.pix.height = (uint32_t)(c->p.height > 0 ? c->p.height : 480);
    fmt.fmt.pix.pixelformat = fourcc;
    fmt.fmt.pix.field = V4L2_FIELD_NONE;
    if (xioctl(c, VIDIOC_S_FMT, &fmt) < 0) return cfail(c, NM_ERR_IO, "VIDIOC_S_FMT: %s", strerror(errno));
    const struct v4l2_pix_format *px = &fmt.fmt.pix;
    char f[5];
    fourcc_str(px->pixelformat, f);
    if (px->pixelformat != fourcc) return cfail(c, NM_ERR_UNSUPPORTED, "the driver set format %s, not the one asked", f);
    c->bpp = bytes_per_pixel(fourcc);
    const uint64_t row = (uint64_t)px->width * c->bpp;
    c->bytesperline = px->bytesperline ? px->bytesperline : (uint32_t)row;
    if (px->width == 0 || px->height == 0 || px->width > 16384 || px->height > 16384 || (c->bpp == 2 && (px->width & 1)) ||
        c->bytesperline < row || px->sizeimage == 0 || px->sizeimage > (256u << 20) ||
        (c->bpp && (uint64_t)c->bytesperline * px->height > px->sizeimage))
        return cfail(c, NM_ERR_FORMAT, "the driver's format makes no sense: %s %u x %u, %u bytes a line, %u an image", f,
                     px->width, px->height, px->bytesperline, px->sizeimage);
    c->info.width = (int32_t)px->width;
    c->info.height = (int32_t)px->height;
    c->info.fourcc = fourcc;
    c->info.slot_bytes = px->sizeimage;

    // the rate: asked where the driver sets one, else read back if it says
    struct v4l2_streamparm parm = {.type = V4L2_BUF_TYPE_VIDEO_CAPTURE};
    if (xioctl(c, VIDIOC_G_PARM, &parm) == 0) {
        if (c->p.fps > 0 && (parm.parm.capture.capability & V4L2_CAP_TIMEPERFRAME)) {
            parm.parm.capture.timeperframe = (struct v4l2_fract){1000, (uint32_t)(c->p.fps * 1000.0f + 0.5f)};
            if (xioctl(c, VIDIOC_S_PARM, &parm) < 0) parm.parm.capture.timeperframe = (struct v4l2_fract){0, 0};
        }
        const struct v4l2_fract t = parm.parm.capture.timeperframe;
        if (t.numerator && t.denominator) c->info.fps = (float)t.denominator / (float)t.numerator;
    }
    return NM_OK;
}

nm_status nm_camera_open_ops(const char *device, const nm_camera_params *p, const nm_v4l2_ops *ops,
                             nm_camera **out, char *err, size_t err_size) {
    if (!out) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "camera: NULL output");
    *out = NULL;
    if (!device || !*device || !ops) return nm_fail(NM_ERR_INVALID_ARG, err, err_size, "camera: no device named");
    nm_camera_params pr = p ? *p : nm_camera_default_params();
    if (pr.n_buffers == 0) pr.n_buffers = 4;
    if (pr.n_buffers < 2 || pr.n_buffers > NM_CAMERA_MAX_BUFFERS || pr.width < 0 || pr.height < 0 || !(pr.fps >= 0))
        return nm_fail(NM_ERR_INVALID_ARG, err, err_size,
                       "camera %s: %u buffers (2..%d), %d x %d, %g frames/s: out of range", device, pr.n_buffers,
                       NM_CAMERA_MAX_BUFFERS, pr.width, pr.height, (double)pr.fps);
    nm_camera *c = calloc(1, sizeof *c);
    if (!c) return nm_fail(NM_ERR_NOMEM, err, err_size, "camera: out of memory");
    c->ops = *ops;
    c->p = pr;
    snprintf(c->dev, sizeof c->dev, "%s", device);
    c->fd = c->ops.open(c->ops.ctx, device, O_RDWR | O_NONBLOCK | O_CLOEXEC);
    nm_status st = c->fd < 0 ? cfail(c, NM_ERR_IO, "cannot be opened: %s", strerror(errno)) : negotiate(c);
    if (st != NM_OK) {
        nm_fail(st, err, err_size, "%s", c->err);
        nm_camera_close(c);
        return st;
    }
    if (pr.ledger) {
        c->ep_cam = nm_ledger_endpoint(pr.ledger, "camera");
        c->ep_vision = nm_ledger_endpoint(pr.ledger, "vision");
    }
    c->info.n_slots = pr.no_userptr ? 0 : pr.n_buffers;
    *out = c;
    return NM_OK;
}

nm_status nm_camera_open(const char *device, const nm_camera_params *p, nm_camera **out, char *err, size_t err_size) {
    return nm_camera_open_ops(device, p, &sys_ops, out, err, err_size);
}

nm_camera_info nm_camera_get_info(const nm_camera *c) { return c ? c->info : (nm_camera_info){0}; }
nm_tabm *nm_camera_ring(const nm_camera *c) { return c ? c->ring : NULL; }
nm_camera_stats nm_camera_get_stats(const nm_camera *c) { return c ? c->st : (nm_camera_stats){0}; }
const char *nm_camera_last_error(const nm_camera *c) { return c ? c->err : ""; }

// ---- buffers ---------------------------------------------------------------------------------

static int qbuf(nm_camera *c, uint32_t i) {
    struct v4l2_buffer b = {.index = i, .type = V4L2_BUF_TYPE_VIDEO_CAPTURE,
                            .memory = c->userptr ? V4L2_MEMORY_USERPTR : V4L2_MEMORY_MMAP};
    if (c->userptr) {
        b.m.userptr = (unsigned long)c->buf[i].slot.data;
        b.length = (uint32_t)c->buf[i].slot.capacity;
    }
    if (xioctl(c, VIDIOC_QBUF, &b) < 0) return -1;
    c->buf[i].queued = true;
    c->n_queued++;
    return 0;
}

// USERPTR: a free slot of the ring queued as buffer i. NM_ERR_TIMEOUT when
// none is free within timeout_ns.
static nm_status queue_slot(nm_camera *c, uint32_t i, int64_t timeout_ns) {
    nm_status st = nm_tabm_acquire_write(c->ring, c->producer, timeout_ns, &c->buf[i].slot);
    if (st != NM_OK) return st;
    if (qbuf(c, i) == 0) return NM_OK;
    const int e = errno;
    nm_tabm_cancel(c->ring, &c->buf[i].slot);
    errno = e;
    return cfail(c, NM_ERR_IO, "VIDIOC_QBUF (user pointer): %s", strerror(e));
}

// Every idle buffer back to the driver (USERPTR: each with a slot, as many
// as are free now).
static nm_status refill(nm_camera *c) {
    for (uint32_t i = 0; i < c->n_bufs; i++) {
        if (c->buf[i].queued) continue;
        if (!c->userptr) {
            if (qbuf(c, i) < 0) return cfail(c, NM_ERR_IO, "VIDIOC_QBUF: %s", strerror(errno));
            continue;
        }
        nm_status st = queue_slot(c, i, 0);
        if (st == NM_ERR_AGAIN || st == NM_ERR_TIMEOUT) break; // the readers hold the rest
        if (st != NM_OK) return st;
    }
    return NM_OK;
}

static void unmap_all(nm_camera *c) {
    for (uint32_t i = 0; i < c->n_bufs; i++)
        if (c->buf[i].map) c->ops.munmap(c->ops.ctx, c->buf[i].map, c->buf[i].len);
    memset(c->buf, 0, sizeof c->buf);
    c->n_bufs = c->n_queued = 0;
}

static nm_status setup_mmap(nm_camera *c) {
    struct v4l2_requestbuffers rb = {.count = c->p.n_buffers, .type = V4L2_BUF_TYPE_VIDEO_CAPTURE,
                                     .memory = V4L2_MEMORY_MMAP};
    if (xioctl(c, VIDIOC_REQBUFS, &rb) < 0) return cfail(c, NM_ERR_IO, "VIDIOC_REQBUFS (mmap): %s", strerror(errno));
    if (rb.count < 2) return cfail(c, NM_ERR_IO, "the driver gave %u buffers (2 needed)", rb.count);
    c->n_bufs = rb.count < NM_CAMERA_MAX_BUFFERS ? rb.count : NM_CAMERA_MAX_BUFFERS;
    for (uint32_t i = 0; i < c->n_bufs; i++) {
        struct v4l2_buffer b = {.index = i, .type = V4L2_BUF_TYPE_VIDEO_CAPTURE, .memory = V4L2_MEMORY_MMAP};
        if (xioctl(c, VIDIOC_QUERYBUF, &b) < 0) return cfail(c, NM_ERR_IO, "VIDIOC_QUERYBUF: %s", strerror(errno));
        if (b.length < c->info.slot_bytes && c->bpp)
            return cfail(c, NM_ERR_FORMAT, "buffer %u holds %u bytes, a frame %zu", i, b.length, c->info.slot_bytes);
        void *m = c->ops.mmap(c->ops.ctx, b.length, PROT_READ | PROT_WRITE, MAP_SHARED, c->fd, (off_t)b.m.offset);
        if (m == MAP_FAILED) return cfail(c, NM_ERR_IO, "mmap of buffer %u: %s", i, strerror(errno));
        c->buf[i].map = m;
        c->buf[i].len = b.length;
    }
    return NM_OK;
}

// USERPTR where the driver takes it: false (and nothing held) when it does not.
static bool setup_userptr(nm_camera *c) {
    struct v4l2_requestbuffers rb = {.count = c->p.n_buffers, .type = V4L2_BUF_TYPE_VIDEO_CAPTURE,
                                     .memory = V4L2_MEMORY_USERPTR};
    if (xioctl(c, VIDIOC_REQBUFS, &rb) < 0 || rb.count < 2) return false;
    c->userptr = true;
    c->n_bufs = rb.count < NM_CAMERA_MAX_BUFFERS ? rb.count : NM_CAMERA_MAX_BUFFERS;
    // the first buffer tells whether it takes the ring's pages (a driver that
    // needs contiguous memory refuses them at the first QBUF)
    if (queue_slot(c, 0, 0) != NM_OK) {
        struct v4l2_requestbuffers none = {.count = 0, .type = V4L2_BUF_TYPE_VIDEO_CAPTURE,
                                           .memory = V4L2_MEMORY_USERPTR};
        xioctl(c, VIDIOC_REQBUFS, &none);
        c->userptr = false;
        c->n_bufs = c->n_queued = 0;
        c->err[0] = '\0';
        return false;
    }
    return true;
}

nm_status nm_camera_start(nm_camera *c, nm_tabm *ring, uint32_t producer) {
    if (!c) return NM_ERR_INVALID_ARG;
    if (c->started) return cfail(c, NM_ERR_STATE, "started already");
    if (!ring) { // a ring of its own: its buffers (the driver may grant more than asked), and two more (the frame
        char err[256]; // the vision brick reads, one compared); pages are touched only where frames land
        const uint32_t n = c->info.n_slots > NM_CAMERA_MAX_BUFFERS ? c->info.n_slots : NM_CAMERA_MAX_BUFFERS;
        const nm_status st = nm_tabm_create(NULL, n + 2, c->info.slot_bytes, &c->own_ring, err, sizeof err);
        if (st != NM_OK) return cfail(c, st, "its ring: %s", err);
        ring = c->own_ring;
    }
    if (nm_tabm_max_payload(ring) < c->info.slot_bytes)
        return cfail(c, NM_ERR_RANGE, "the ring's slots hold %zu bytes, a frame needs %zu", nm_tabm_max_payload(ring),
                     c->info.slot_bytes);
    c->ring = ring;
    c->producer = producer;
    c->started = true;
    nm_status st = NM_OK;
    if (c->p.no_userptr || !setup_userptr(c)) {
        st = setup_mmap(c);
        if (st == NM_OK) st = refill(c);
    } else {
        st = refill(c);
    }
    int type = V4L2_BUF_TYPE_VIDEO_CAPTURE;
    if (st == NM_OK && xioctl(c, VIDIOC_STREAMON, &type) < 0) st = cfail(c, NM_ERR_IO, "VIDIOC_STREAMON: %s", strerror(errno));
    c->streaming = st == NM_OK;
    c->info.zero_copy = c->userptr;
    c->info.n_slots = c->userptr ? c->n_bufs : 0;
    return st;
}

// ---- capture ---------------------------------------------------------------------------------

// A filled buffer from the driver: 1 (*b set), 0 none ready, -1 failed (err set).
static int dqbuf(nm_camera *c, struct v4l2_buffer *b) {
    *b = (struct v4l2_buffer){.type = V4L2_BUF_TYPE_VIDEO_CAPTURE,
                              .memory = c->userptr ? V4L2_MEMORY_USERPTR : V4L2_MEMORY_MMAP};
    if (xioctl(c, VIDIOC_DQBUF, b) < 0) {
        if (errno == EAGAIN) return 0;
        cfail(c, NM_ERR_IO, "%s (VIDIOC_DQBUF: %s)", errno == ENODEV ? "gone" : "capture failed", strerror(errno));
        return -1;
    }
    if (b->index >= c->n_bufs || !c->buf[b->index].queued) {
        cfail(c, NM_ERR_IO, "the driver returned buffer %u, not one queued", b->index);
        return -1;
    }
    c->buf[b->index].queued = false;
    c->n_queued--;
    return 1;
}

// A buffer taken from the driver that goes nowhere (an error after it was
// taken): with USERPTR its slot back to the ring, so no slot stays held.
static void drop(nm_camera *c, uint32_t i) {
    if (c->userptr) nm_tabm_cancel(c->ring, &c->buf[i].slot);
}

// A buffer the caller does not get: straight back to the driver (else dropped).
static nm_status recycle(nm_camera *c, uint32_t i) {
    if (qbuf(c, i) == 0) return NM_OK;
    const int e = errno;
    drop(c, i);
    return cfail(c, NM_ERR_IO, "VIDIOC_QBUF: %s", strerror(e));
}

static uint64_t stamp_ns(const struct v4l2_buffer *b) {
    return (uint64_t)b->timestamp.tv_sec * 1000000000ull + (uint64_t)b->timestamp.tv_usec * 1000ull;
}

// The frame's bytes as the slot carries them: pixels with rows packed, or the JPEG.
static bool frame_fits(nm_camera *c, const struct v4l2_buffer *b, size_t *n) {
    const size_t row = (size_t)c->info.width * c->bpp;
    if (!c->bpp) {
        *n = b->bytesused;
        return b->bytesused > 0 && b->bytesused <= c->info.slot_bytes;
    }
    *n = row * (size_t)c->info.height;
    return b->bytesused >= (size_t)c->bytesperline * (size_t)(c->info.height - 1) + row;
}

static void fill_meta(nm_camera *c, nm_tabm_slot *s, size_t n) {
    nm_tabm_meta *m = s->meta;
    m->kind = NM_TABM_IMAGE;
    m->size = n;
    m->user = 0;
    m->request = 0;
    memset(m->shape, 0, sizeof m->shape);
    if (c->bpp) {
        m->ndim = 3;
        m->shape[0] = c->info.height;
        m->shape[1] = c->info.width;
        m->shape[2] = c->bpp;
    } else {
        m->ndim = 1;
        m->shape[0] = (int64_t)n;
    }
}

// The frame in buffer i into *slot: USERPTR hands the slot over (rows
// packed in place where the driver pads them); MMAP copies into a free slot.
static nm_status deliver(nm_camera *c, uint32_t i, size_t n, uint64_t deadline, nm_tabm_slot *slot) {
    const uint64_t t = nm_now_ns();
    const int64_t timeout_ns = deadline == UINT64_MAX ? -1 : t >= deadline ? 0 : (int64_t)(deadline - t);
    const size_t row = (size_t)c->info.width * c->bpp;
    if (c->userptr) {
        *slot = c->buf[i].slot;
        uint8_t *d = slot->data;
        if (c->bpp && c->bytesperline != row)
            for (int32_t y = 1; y < c->info.height; y++) memmove(d + (size_t)y * row, d + (size_t)y * c->bytesperline, row);
    } else {
        nm_status st = nm_tabm_acquire_write(c->ring, c->producer, timeout_ns, slot);
        if (st != NM_OK) {
            recycle(c, i);
            return st == NM_ERR_AGAIN || st == NM_ERR_TIMEOUT ? cfail(c, NM_ERR_TIMEOUT, "no free slot in the ring") : st;
        }
        const uint8_t *src = c->buf[i].map;
        uint8_t *d = slot->data;
        if (!c->bpp || c->bytesperline == row) {
            if (c->p.ledger) nm_ledger_copy(c->p.ledger, c->ep_cam, c->ep_vision, d, src, n);
            else memcpy(d, src, n);
        } else {
            for (int32_t y = 0; y < c->info.height; y++) {
                if (c->p.ledger)
                    nm_ledger_copy(c->p.ledger, c->ep_cam, c->ep_vision, d + (size_t)y * row,
                                   src + (size_t)y * c->bytesperline, row);
                else
                    memcpy(d + (size_t)y * row, src + (size_t)y * c->bytesperline, row);
            }
        }
        c->st.bytes_copied += n;
        if (recycle(c, i) != NM_OK) {
            nm_tabm_cancel(c->ring, slot);
            return NM_ERR_IO;
        }
    }
    fill_meta(c, slot, n);
    c->st.n_frames++;
    return NM_OK;
}

nm_status nm_camera_capture(nm_camera *c, int64_t timeout_ns, nm_tabm_slot *slot) {
    if (!c || !slot) return NM_ERR_INVALID_ARG;
    if (!c->streaming) return cfail(c, NM_ERR_STATE, "not started");
    const uint64_t t0 = nm_now_ns();
    const uint64_t deadline = timeout_ns < 0 ? UINT64_MAX : t0 + (uint64_t)timeout_ns;
    // a frame this much older than now was taken while nobody asked: the next is fresher
    const uint64_t stale_ns = c->info.fps > 0 ? (uint64_t)(2e9 / c->info.fps) : 0;
    for (bool first = true;; first = false) {
        nm_status st = refill(c);
        if (st != NM_OK) return st;
        const uint64_t t = nm_now_ns();
        // (every pass but the first: a timeout of 0 still looks once)
        if (!first && timeout_ns >= 0 && t >= deadline) return cfail(c, NM_ERR_TIMEOUT, "no frame in time");
        const int64_t left = timeout_ns < 0 ? -1 : t >= deadline ? 0 : (int64_t)(deadline - t);
        if (c->n_queued == 0) { // the readers hold every slot: wait for one to come free
            uint32_t i = 0;
            while (i < c->n_bufs && c->buf[i].queued) i++;
            st = queue_slot(c, i, left);
            if (st == NM_ERR_AGAIN || st == NM_ERR_TIMEOUT) return cfail(c, NM_ERR_TIMEOUT, "no free slot in the ring");
            if (st != NM_OK) return st;
            continue;
        }
        struct pollfd pfd = {.fd = c->fd, .events = POLLIN};
        const int ms = left < 0 || left >= 200000000 ? 200 : (int)((left + 999999) / 1000000); // (at most 0.2 s: shutdown)
        const int r = c->ops.poll(c->ops.ctx, &pfd, 1, ms);
        if (r < 0 && errno != EINTR) return cfail(c, NM_ERR_IO, "poll: %s", strerror(errno));
        if (nm_tabm_is_shutdown(c->ring)) return NM_ERR_SHUTDOWN;
        if (r > 0 && (pfd.revents & (POLLERR | POLLHUP | POLLNVAL)) && !(pfd.revents & POLLIN))
            return cfail(c, NM_ERR_IO, "gone (the device reports an error)");
        if (r <= 0) continue;
        struct v4l2_buffer b, nb;
        int got = dqbuf(c, &b);
        if (got < 0) return NM_ERR_IO;
        if (got == 0) continue;
        // the newest the driver has: older ones back to it
        while ((got = dqbuf(c, &nb)) == 1) {
            c->st.n_dropped++;
            if ((st = recycle(c, b.index)) != NM_OK) return st;
            b = nb;
        }
        if (got < 0) {
            drop(c, b.index);
            return NM_ERR_IO;
        }
        size_t n = 0;
        if ((b.flags & V4L2_BUF_FLAG_ERROR) || !frame_fits(c, &b, &n) || (!c->userptr && n > c->buf[b.index].len)) {
            c->st.n_errors++;
            if ((st = recycle(c, b.index)) != NM_OK) return st;
            continue;
        }
        // stale: taken more than two frame periods before this call began (a camera that slows down in the
        // dark keeps its nominal rate: a frame taken since the call began is never stale)
        const bool mono = (b.flags & V4L2_BUF_FLAG_TIMESTAMP_MASK) == V4L2_BUF_FLAG_TIMESTAMP_MONOTONIC;
        const uint64_t ts = stamp_ns(&b);
        if (mono && stale_ns && ts + stale_ns < t0 && nm_now_ns() < deadline) {
            c->st.n_dropped++;
            if ((st = recycle(c, b.index)) != NM_OK) return st;
            continue;
        }
        return deliver(c, b.index, n, deadline, slot);
    }
}

void nm_camera_close(nm_camera *c) {
    if (!c) return;
    if (c->streaming) {
        int type = V4L2_BUF_TYPE_VIDEO_CAPTURE;
        xioctl(c, VIDIOC_STREAMOFF, &type); // every buffer back from the driver
    }
    if (c->userptr)
        for (uint32_t i = 0; i < c->n_bufs; i++)
            if (c->buf[i].queued) nm_tabm_cancel(c->ring, &c->buf[i].slot);
    if (c->fd >= 0 && c->started) {
        unmap_all(c);
        struct v4l2_requestbuffers none = {.count = 0, .type = V4L2_BUF_TYPE_VIDEO_CAPTURE,
                                           .memory = c->userptr ? V4L2_MEMORY_USERPTR : V4L2_MEMORY_MMAP};
        xioctl(c, VIDIOC_REQBUFS, &none);
    }
    if (c->fd >= 0) c->ops.close(c->ops.ctx, c->fd);
    nm_tabm_free(c->own_ring);
    free(c);
}
