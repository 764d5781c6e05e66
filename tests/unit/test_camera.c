// The camera (src/io/camera/camera.c) against an emulated V4L2 driver
// (this machine and CI have no /dev/video; a real one is tried where it
// exists): the driver writes frames into the ring's slots (USERPTR) or its
// own buffers (MMAP, each copy counted); rows packed; the newest frame kept
// and stale, corrupt and short ones skipped; format and capability checks;
// a device that goes away; every slot back in the ring after close.
#include <errno.h>
#include <pthread.h>
#include <linux/videodev2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "io/camera/camera.h"
#include "vcam.h"
#include "bricks/vision/preproc.h"
#include "nmtest.h"

// ---- helpers ---------------------------------------------------------------------------------

// Slot bytes are frame f's pixels with rows packed.
static bool holds_frame(const vcam *v, const nm_tabm_slot *s, uint32_t f) {
    const nm_tabm_meta *m = s->meta;
    if (m->kind != NM_TABM_IMAGE || m->ndim != 3 || m->shape[0] != v->h || m->shape[1] != v->w ||
        m->shape[2] != v->bpp || m->size != (uint64_t)v->w * v->h * v->bpp)
        return false;
    const uint8_t *d = s->data;
    for (uint32_t y = 0; y < v->h; y++)
        for (uint32_t x = 0; x < v->w; x++)
            for (uint32_t k = 0; k < v->bpp; k++)
                if (*d++ != pattern(f, x, y, k)) return false;
    return true;
}

typedef struct rig {
    vcam v;
    nm_v4l2_ops ops;
    nm_camera *cam;
    nm_tabm *ring;
    nm_ledger *led;
} rig;

// Opens the emulated camera (w x h) and a ring of n_slots sized for its frames; starts it.
static nm_status rig_up(rig *r, nm_camera_params p, uint32_t n_slots) {
    r->ops = vc_ops(&r->v);
    r->led = nm_ledger_create();
    p.ledger = r->led;
    char err[320];
    nm_status st = nm_camera_open_ops("/dev/vcam", &p, &r->ops, &r->cam, err, sizeof err);
    if (st != NM_OK) {
        fprintf(stderr, "  open: %s\n", err);
        return st;
    }
    if ((st = nm_tabm_create(NULL, n_slots, nm_camera_get_info(r->cam).slot_bytes, &r->ring, err, sizeof err)) != NM_OK)
        return st;
    st = nm_camera_start(r->cam, r->ring, 1);
    if (st != NM_OK) fprintf(stderr, "  start: %s\n", nm_camera_last_error(r->cam));
    return st;
}

// Closes everything; true when the ring got every slot back and the driver is closed, stopped, unmapped.
static bool rig_down(rig *r) {
    nm_camera_close(r->cam);
    const bool freed = !r->ring || all_slots_free(r->ring);
    nm_tabm_free(r->ring);
    nm_ledger_free(r->led);
    vc_free(&r->v);
    return freed && !r->v.open && !r->v.streaming && r->v.n_mapped == 0;
}

static nm_camera_params small(int32_t w, int32_t h) {
    nm_camera_params p = nm_camera_default_params();
    p.width = w;
    p.height = h;
    return p;
}

// ---- the cases -------------------------------------------------------------------------------

NM_TEST(camera_userptr_frames_land_in_the_slots) {
    rig r = {.v = vc_default()};
    NM_CHECK(rig_up(&r, small(64, 48), 6) == NM_OK);
    const nm_camera_info in = nm_camera_get_info(r.cam);
    NM_CHECK(in.zero_copy && in.n_slots == 4 && in.width == 64 && in.height == 48 && in.fourcc == V4L2_PIX_FMT_YUYV);
    NM_CHECK(!strcmp(in.driver, "vcam") && !strcmp(in.card, "Emulated camera") && in.slot_bytes == 64 * 48 * 2);
    for (uint32_t f = 0; f < 5 && r.ring; f++) {
        nm_tabm_slot s, rd;
        NM_CHECK(nm_camera_capture(r.cam, 1000000000, &s) == NM_OK);
        NM_CHECK(holds_frame(&r.v, &s, f));
        // the driver wrote where the slot is: the buffer it was given is the slot's memory
        bool is_slot = false;
        for (uint32_t i = 0; i < r.v.n_bufs; i++) is_slot |= r.v.b[i].userptr == (unsigned long)s.data && r.v.last_frame_in[i] == f;
        NM_CHECK(is_slot);
        s.meta->request = f + 1;
        NM_CHECK(nm_tabm_publish(r.ring, &s) == NM_OK);
        NM_CHECK(nm_tabm_acquire_read(r.ring, 0, &rd) == NM_OK && rd.meta->request == f + 1 && holds_frame(&r.v, &rd, f));
        nm_tabm_release(r.ring, &rd);
    }
    const nm_camera_stats st = nm_camera_get_stats(r.cam);
    NM_CHECK(st.n_frames == 5 && st.n_dropped == 0 && st.n_errors == 0 && st.bytes_copied == 0);
    NM_CHECK(nm_ledger_total(r.led) == 0);
    NM_CHECK(rig_down(&r));
}

// Started on no ring: the camera makes its own (its buffers and two more slots, a frame each), which
// the frames land in and nm_camera_close frees (ASan's leak check).
NM_TEST(camera_own_ring) {
    rig r = {.v = vc_default()};
    r.ops = vc_ops(&r.v);
    const nm_camera_params p = small(64, 48);
    NM_CHECK(nm_camera_open_ops("/dev/vcam", &p, &r.ops, &r.cam, NULL, 0) == NM_OK);
    NM_CHECK(nm_camera_ring(r.cam) == NULL && nm_camera_start(r.cam, NULL, 1) == NM_OK);
    nm_tabm *ring = nm_camera_ring(r.cam);
    const nm_camera_info in = nm_camera_get_info(r.cam);
    NM_CHECK(ring && nm_tabm_n_slots(ring) == NM_CAMERA_MAX_BUFFERS + 2 && nm_tabm_max_payload(ring) >= in.slot_bytes);
    for (uint32_t f = 0; f < 3 && ring; f++) {
        nm_tabm_slot s;
        NM_CHECK(nm_camera_capture(r.cam, 1000000000, &s) == NM_OK && holds_frame(&r.v, &s, f));
        nm_tabm_cancel(ring, &s);
    }
    nm_camera_close(r.cam);
    vc_free(&r.v);
    NM_CHECK(!r.v.open && !r.v.streaming && r.v.n_mapped == 0);
}

NM_TEST(camera_mmap_copies_are_counted) {
    rig r = {.v = vc_default()};
    r.v.userptr_ok = false;
    NM_CHECK(rig_up(&r, small(32, 16), 2) == NM_OK);
    NM_CHECK(!nm_camera_get_info(r.cam).zero_copy && nm_camera_get_info(r.cam).n_slots == 0 && r.v.n_mapped == 4);
    for (uint32_t f = 0; f < 3 && r.ring; f++) {
        nm_tabm_slot s;
        NM_CHECK(nm_camera_capture(r.cam, 1000000000, &s) == NM_OK);
        NM_CHECK(holds_frame(&r.v, &s, f));
        nm_tabm_cancel(r.ring, &s);
    }
    NM_CHECK(nm_camera_get_stats(r.cam).bytes_copied == 3 * 32 * 16 * 2);
    NM_CHECK(nm_ledger_bytes(r.led, -1, -1) == 3 * 32 * 16 * 2 && nm_ledger_copies(r.led, -1, -1) == 3);
    NM_CHECK(rig_down(&r));
    // asked for: the driver's buffers even where it takes user pointers
    rig q = {.v = vc_default()};
    nm_camera_params p = small(32, 16);
    p.no_userptr = true;
    NM_CHECK(rig_up(&q, p, 2) == NM_OK && !nm_camera_get_info(q.cam).zero_copy && q.v.memory == V4L2_MEMORY_MMAP);
    NM_CHECK(rig_down(&q));
}

NM_TEST(camera_userptr_refused_at_qbuf_falls_back_to_mmap) {
    rig r = {.v = vc_default()};
    r.v.userptr_qbuf_fails = true;
    NM_CHECK(rig_up(&r, small(32, 16), 3) == NM_OK);
    NM_CHECK(!nm_camera_get_info(r.cam).zero_copy && r.v.memory == V4L2_MEMORY_MMAP);
    nm_tabm_slot s;
    NM_CHECK(nm_camera_capture(r.cam, 1000000000, &s) == NM_OK && holds_frame(&r.v, &s, 0));
    if (r.ring) nm_tabm_cancel(r.ring, &s);
    NM_CHECK(rig_down(&r)); // the slot tried for the first buffer went back too
}

NM_TEST(camera_padded_rows_are_packed) {
    for (int mode = 0; mode < 2; mode++) {
        rig r = {.v = vc_default()};
        r.v.pad = 24;
        r.v.formats[0] = V4L2_PIX_FMT_RGB24;
        r.v.userptr_ok = mode == 0;
        NM_CHECK(rig_up(&r, small(20, 16), 6) == NM_OK);
        NM_CHECK(nm_camera_get_info(r.cam).slot_bytes == (20 * 3 + 24) * 16);
        for (uint32_t f = 0; f < 2 && r.ring; f++) {
            nm_tabm_slot s;
            NM_CHECK(nm_camera_capture(r.cam, 1000000000, &s) == NM_OK && holds_frame(&r.v, &s, f));
            nm_tabm_cancel(r.ring, &s);
        }
        NM_CHECK(nm_camera_get_stats(r.cam).bytes_copied == (mode ? 2u * 20 * 3 * 16 : 0u));
        NM_CHECK(rig_down(&r));
    }
}

NM_TEST(camera_newest_frame_older_ones_recycled) {
    rig r = {.v = vc_default()};
    r.v.produce = 3; // three frames done by the time it looks
    NM_CHECK(rig_up(&r, small(16, 16), 8) == NM_OK);
    nm_tabm_slot s;
    NM_CHECK(nm_camera_capture(r.cam, 1000000000, &s) == NM_OK && holds_frame(&r.v, &s, 2));
    NM_CHECK(nm_camera_get_stats(r.cam).n_dropped == 2 && nm_camera_get_stats(r.cam).n_frames == 1);
    if (r.ring) nm_tabm_cancel(r.ring, &s);
    NM_CHECK(nm_camera_capture(r.cam, 1000000000, &s) == NM_OK && holds_frame(&r.v, &s, 5));
    if (r.ring) nm_tabm_cancel(r.ring, &s);
    NM_CHECK(rig_down(&r));
}

NM_TEST(camera_stale_corrupt_and_short_frames_skipped) {
    rig r = {.v = vc_default()};
    NM_CHECK(rig_up(&r, small(16, 16), 8) == NM_OK);
    NM_CHECK(nm_camera_get_info(r.cam).fps == 30.0f);
    static const struct { int old, error, shortf; uint32_t want; uint64_t dropped, errors; } steps[] = {
        {1, 0, 0, 1, 1, 0}, // frame 0 a second old at 30 frames/s: the next
        {0, 1, 0, 3, 1, 1}, // frame 2 flagged corrupt by the driver
        {0, 0, 2, 6, 1, 3}, // frames 4, 5 short
        {0, 0, 0, 7, 1, 3},
    };
    for (size_t k = 0; k < sizeof steps / sizeof steps[0] && r.ring; k++) {
        r.v.old_frames = steps[k].old;
        r.v.error_frames = steps[k].error;
        r.v.short_frames = steps[k].shortf;
        nm_tabm_slot s;
        NM_CHECK(nm_camera_capture(r.cam, 1000000000, &s) == NM_OK && holds_frame(&r.v, &s, steps[k].want));
        const nm_camera_stats st = nm_camera_get_stats(r.cam);
        NM_CHECK(st.n_dropped == steps[k].dropped && st.n_errors == steps[k].errors && st.n_frames == k + 1);
        nm_tabm_cancel(r.ring, &s);
    }
    NM_CHECK(rig_down(&r));
}

NM_TEST(camera_asks_the_rate) {
    rig r = {.v = vc_default()};
    nm_camera_params p = small(16, 16);
    p.fps = 5;
    NM_CHECK(rig_up(&r, p, 5) == NM_OK && r.v.fps == 5 && nm_camera_get_info(r.cam).fps == 5.0f);
    NM_CHECK(rig_down(&r));
    rig q = {.v = vc_default()};
    q.v.timeperframe = false; // a driver with one rate says nothing of it
    NM_CHECK(rig_up(&q, p, 5) == NM_OK && nm_camera_get_info(q.cam).fps == 0.0f);
    NM_CHECK(rig_down(&q));
}

NM_TEST(camera_formats_negotiated) {
    static const struct { uint32_t offered[3]; int n; uint32_t want, got; } cases[] = {
        {{V4L2_PIX_FMT_MJPEG, V4L2_PIX_FMT_YUYV}, 2, 0, V4L2_PIX_FMT_YUYV},
        {{V4L2_PIX_FMT_MJPEG, V4L2_PIX_FMT_YUYV}, 2, V4L2_PIX_FMT_MJPEG, V4L2_PIX_FMT_MJPEG},
        {{V4L2_PIX_FMT_NV12, V4L2_PIX_FMT_GREY}, 2, 0, V4L2_PIX_FMT_GREY},
        {{V4L2_PIX_FMT_NV12, V4L2_PIX_FMT_RGB24, V4L2_PIX_FMT_GREY}, 3, 0, V4L2_PIX_FMT_RGB24},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        rig r = {.v = vc_default()};
        memcpy(r.v.formats, cases[k].offered, sizeof cases[k].offered);
        r.v.n_formats = cases[k].n;
        nm_camera_params p = small(2000, 1000); // clamped by the driver to 1280 x 720
        p.fourcc = cases[k].want;
        NM_CHECK(rig_up(&r, p, 5) == NM_OK);
        const nm_camera_info in = nm_camera_get_info(r.cam);
        NM_CHECK(in.fourcc == cases[k].got && in.width == 1280 && in.height == 720);
        nm_tabm_slot s;
        NM_CHECK(r.ring && nm_camera_capture(r.cam, 1000000000, &s) == NM_OK);
        if (r.ring && cases[k].got == V4L2_PIX_FMT_MJPEG) { // the compressed frame as it came, its own length
            NM_CHECK(s.meta->ndim == 1 && s.meta->size == 100 && s.meta->shape[0] == 100);
            NM_CHECK(((uint8_t *)s.data)[7] == pattern(0, 7, 0, 0));
        } else if (r.ring) {
            NM_CHECK(holds_frame(&r.v, &s, 0));
        }
        if (r.ring) nm_tabm_cancel(r.ring, &s);
        NM_CHECK(rig_down(&r));
    }
}

NM_TEST(camera_refuses_what_it_cannot_read) {
    char err[320];
    nm_camera *c = NULL;
    vcam v = vc_default();
    nm_v4l2_ops ops = vc_ops(&v);
    v.formats[0] = V4L2_PIX_FMT_NV12, v.formats[1] = V4L2_PIX_FMT_H264, v.n_formats = 2;
    NM_CHECK(nm_camera_open_ops("/dev/vcam", NULL, &ops, &c, err, sizeof err) == NM_ERR_UNSUPPORTED && !c);
    NM_CHECK(strstr(err, "/dev/vcam") && strstr(err, "NV12, H264") && strstr(err, "YUYV") && !v.open);
    v = vc_default();
    nm_camera_params p = nm_camera_default_params();
    p.fourcc = V4L2_PIX_FMT_MJPEG; // not offered
    NM_CHECK(nm_camera_open_ops("/dev/vcam", &p, &ops, &c, err, sizeof err) == NM_ERR_UNSUPPORTED);
    NM_CHECK(strstr(err, "MJPG asked for: not offered (it offers YUYV"));
    v.caps = V4L2_CAP_VIDEO_OUTPUT | V4L2_CAP_STREAMING;
    NM_CHECK(nm_camera_open_ops("/dev/vcam", NULL, &ops, &c, err, sizeof err) == NM_ERR_UNSUPPORTED);
    NM_CHECK(strstr(err, "not a single-planar video capture device"));
    v.caps = V4L2_CAP_VIDEO_CAPTURE_MPLANE | V4L2_CAP_STREAMING;
    NM_CHECK(nm_camera_open_ops("/dev/vcam", NULL, &ops, &c, err, sizeof err) == NM_ERR_UNSUPPORTED);
    NM_CHECK(strstr(err, "multi-planar"));
    v.caps = V4L2_CAP_VIDEO_CAPTURE | V4L2_CAP_READWRITE;
    NM_CHECK(nm_camera_open_ops("/dev/vcam", NULL, &ops, &c, err, sizeof err) == NM_ERR_UNSUPPORTED);
    NM_CHECK(strstr(err, "no streaming I/O"));
    NM_CHECK(nm_camera_open_ops("/dev/vcam9", NULL, &ops, &c, err, sizeof err) == NM_ERR_IO && strstr(err, "/dev/vcam9"));
    p = nm_camera_default_params();
    p.n_buffers = 1;
    NM_CHECK(nm_camera_open_ops("/dev/vcam", &p, &ops, &c, err, sizeof err) == NM_ERR_INVALID_ARG);
    // the real call: a file that is no camera, and a path that is nothing
    NM_CHECK(nm_camera_open("/dev/null", NULL, &c, err, sizeof err) == NM_ERR_UNSUPPORTED && strstr(err, "not a V4L2 device"));
    NM_CHECK(nm_camera_open("/nonexistent/video0", NULL, &c, err, sizeof err) == NM_ERR_IO &&
             strstr(err, "/nonexistent/video0") && strstr(err, "No such file"));
    NM_CHECK(!c);
    vc_free(&v);
}

NM_TEST(camera_ring_too_small_and_start_twice) {
    rig r = {.v = vc_default()};
    r.ops = vc_ops(&r.v);
    nm_camera_params p = small(32, 32);
    NM_CHECK(nm_camera_open_ops("/dev/vcam", &p, &r.ops, &r.cam, NULL, 0) == NM_OK);
    NM_CHECK(nm_tabm_create(NULL, 4, 32 * 32 * 2 - 1, &r.ring, NULL, 0) == NM_OK);
    NM_CHECK(nm_camera_start(r.cam, r.ring, 1) == NM_ERR_RANGE && strstr(nm_camera_last_error(r.cam), "2048"));
    nm_tabm_slot s;
    NM_CHECK(nm_camera_capture(r.cam, 0, &s) == NM_ERR_STATE);
    NM_CHECK(rig_down(&r));
}

typedef struct giver { nm_tabm *ring; nm_tabm_slot s; } giver;
static void *give_back_later(void *arg) {
    giver *g = arg;
    usleep(50000);
    nm_tabm_cancel(g->ring, &g->s);
    return NULL;
}

NM_TEST(camera_every_slot_held_then_one_freed) {
    rig r = {.v = vc_default()};
    NM_CHECK(rig_up(&r, small(16, 16), 3) == NM_OK); // 4 buffers asked, 3 slots: the camera queues what is free
    nm_tabm_slot s[3];
    for (int k = 0; k < 3 && r.ring; k++) NM_CHECK(nm_camera_capture(r.cam, 1000000000, &s[k]) == NM_OK);
    nm_tabm_slot more;
    NM_CHECK(r.ring && nm_camera_capture(r.cam, 30000000, &more) == NM_ERR_TIMEOUT);
    NM_CHECK(strstr(nm_camera_last_error(r.cam), "no free slot"));
    // a reader gives one back while the camera waits for it
    pthread_t th;
    giver g = {r.ring, s[1]};
    const bool started = r.ring && pthread_create(&th, NULL, give_back_later, &g) == 0;
    NM_CHECK(started && nm_camera_capture(r.cam, 2000000000, &more) == NM_OK && holds_frame(&r.v, &more, 3));
    if (started) pthread_join(th, NULL);
    if (r.ring) {
        nm_tabm_cancel(r.ring, &s[0]);
        nm_tabm_cancel(r.ring, &s[2]);
        nm_tabm_cancel(r.ring, &more);
    }
    NM_CHECK(rig_down(&r));
}

NM_TEST(camera_gone_is_an_io_error) {
    for (int how = 0; how < 3; how++) {
        rig r = {.v = vc_default()};
        NM_CHECK(rig_up(&r, small(16, 16), 5) == NM_OK);
        nm_tabm_slot s;
        NM_CHECK(nm_camera_capture(r.cam, 1000000000, &s) == NM_OK);
        if (r.ring) nm_tabm_cancel(r.ring, &s);
        if (how == 0) r.v.dqbuf_errno = ENODEV;
        else if (how == 1) r.v.poll_err = true;
        else r.v.produce = 2, r.v.dqbuf_fail_in = 2; // gone between two frames: the first one's slot goes back
        NM_CHECK(nm_camera_capture(r.cam, 1000000000, &s) == NM_ERR_IO);
        NM_CHECK(strstr(nm_camera_last_error(r.cam), "/dev/vcam") && strstr(nm_camera_last_error(r.cam), "gone"));
        NM_CHECK(rig_down(&r));
    }
}

NM_TEST(camera_no_frame_times_out_and_shutdown_ends_it) {
    rig r = {.v = vc_default()};
    r.v.produce = 0; // a sensor that sends nothing
    NM_CHECK(rig_up(&r, small(16, 16), 5) == NM_OK);
    nm_tabm_slot s;
    NM_CHECK(r.ring && nm_camera_capture(r.cam, 0, &s) == NM_ERR_TIMEOUT);
    NM_CHECK(r.ring && nm_camera_capture(r.cam, 20000000, &s) == NM_ERR_TIMEOUT);
    if (r.ring) nm_tabm_shutdown(r.ring);
    NM_CHECK(r.ring && nm_camera_capture(r.cam, -1, &s) == NM_ERR_SHUTDOWN);
    nm_camera_close(r.cam);
    r.cam = NULL;
    nm_tabm_free(r.ring);
    r.ring = NULL;
    NM_CHECK(rig_down(&r));
}

// A camera's slot as the vision brick and the frame signature read it: YUYV pixels into RGB.
NM_TEST(camera_slot_decodes_as_the_brick_reads_it) {
    rig r = {.v = vc_default()};
    NM_CHECK(rig_up(&r, small(32, 24), 5) == NM_OK);
    nm_tabm_slot s;
    NM_CHECK(r.ring && nm_camera_capture(r.cam, 1000000000, &s) == NM_OK);
    if (r.ring) {
        nm_image img = {0};
        NM_CHECK(nm_image_decode_slot(s.data, s.meta, s.capacity, 0, &img, NULL, 0) == NM_OK && img.w == 32 && img.h == 24);
        const uint8_t *y = s.data;
        // pixel (3, 5): Y at its own byte, U and V of its pair (2, 3)
        const uint8_t *pair = y + (5 * 32 + 2) * 2, yy = pair[2], u = pair[1], vv = pair[3];
        const double R = 1.164 * (yy - 16) + 1.596 * (vv - 128), B = 1.164 * (yy - 16) + 2.017 * (u - 128);
        NM_CHECK(img.rgb && fabs(img.rgb[(5 * 32 + 3) * 3] - (R < 0 ? 0 : R > 255 ? 255 : R)) <= 1.0);
        NM_CHECK(img.rgb && fabs(img.rgb[(5 * 32 + 3) * 3 + 2] - (B < 0 ? 0 : B > 255 ? 255 : B)) <= 1.0);
        nm_frame_sig a, b;
        NM_CHECK(nm_frame_signature_slot(&s, &a, NULL, 0) == NM_OK && a.width == 32 && a.height == 24);
        // the same frame once more (a still scene): no difference; another frame: some
        nm_tabm_cancel(r.ring, &s);
        NM_CHECK(nm_camera_capture(r.cam, 1000000000, &s) == NM_OK && nm_frame_signature_slot(&s, &b, NULL, 0) == NM_OK);
        NM_CHECK(nm_frame_difference(&a, &a) == 0.0 && nm_frame_difference(&a, &b) > 0.0);
        nm_tabm_cancel(r.ring, &s);
        nm_image_free(&img);
    }
    NM_CHECK(rig_down(&r));
}

// A real camera, where the machine has one (CI has none).
NM_TEST(camera_real_device) {
    const char *dev = getenv("NM_TEST_CAMERA") ? getenv("NM_TEST_CAMERA") : "/dev/video0";
    if (access(dev, F_OK) != 0) {
        NM_SKIP("no camera here (/dev/video0 or NM_TEST_CAMERA)");
        return;
    }
    char err[320];
    nm_camera *c = NULL;
    nm_tabm *ring = NULL;
    NM_CHECK(nm_camera_open(dev, NULL, &c, err, sizeof err) == NM_OK);
    if (!c) {
        fprintf(stderr, "  %s\n", err);
        return;
    }
    const nm_camera_info in = nm_camera_get_info(c);
    NM_CHECK(nm_tabm_create(NULL, in.n_slots + 2, in.slot_bytes, &ring, NULL, 0) == NM_OK);
    NM_CHECK(ring && nm_camera_start(c, ring, 1) == NM_OK);
    for (int k = 0; k < 3 && ring; k++) {
        nm_tabm_slot s;
        nm_image img = {0};
        NM_CHECK(nm_camera_capture(c, 5000000000ll, &s) == NM_OK);
        NM_CHECK(nm_image_decode_slot(s.data, s.meta, s.capacity, 0, &img, err, sizeof err) == NM_OK);
        NM_CHECK(img.w == in.width && img.h == in.height);
        nm_image_free(&img);
        nm_tabm_cancel(ring, &s);
    }
    fprintf(stderr, "  %s (%s): %d x %d, %.1f frames/s, %s\n", in.card, in.driver, in.width, in.height, (double)in.fps,
            nm_camera_get_info(c).zero_copy ? "user pointers (no copy)" : "mmap (a copy a frame)");
    nm_camera_close(c);
    NM_CHECK(ring && all_slots_free(ring));
    nm_tabm_free(ring);
}

NM_TEST_MAIN()
