// Vision left out (-DNM_WITH_VISION=OFF, so no libpng, libjpeg; off.h): no
// vision brick loads, no image is decoded, no camera opens.
#include <stdlib.h>
#include <string.h>

#include "bricks/brick_impl.h"
#include "off/off.h"

#define WHAT "vision (images, the camera, mmproj encoders)"
#define OPTION "NM_WITH_VISION"

static nm_status vision_load(const nm_brick_params *p, void **state, char *err, size_t err_size) {
    *state = NULL;
    return nm_off_fail(err, err_size, WHAT, OPTION);
}
static nm_status vision_run(void *state, nm_brick *self, nm_tabm *in, nm_tabm *out) { return NM_ERR_UNSUPPORTED; }
static void vision_release(void *state) {}

const nm_brick_i nm_brick_vision_i = {
    .version = NM_BRICK_I_VERSION,
    .kind = NM_BRICK_VISION,
    .name = "vision",
    .in_ports = NM_PORT_BIT(NM_PORT_IMAGE),
    .out_ports = NM_PORT_BIT(NM_PORT_TOKENS) | NM_PORT_BIT(NM_PORT_EMBD),
    .units = NM_UNIT_BIT(NM_UNIT_CPU),
    .load = vision_load,
    .run = vision_run,
    .release = vision_release,
};

bool nm_brick_vision_info(const nm_brick *b, nm_vision_info *out) {
    if (out) memset(out, 0, sizeof *out);
    return false;
}

nm_status nm_frame_signature(const char *path, nm_frame_sig *out, char *err, size_t err_size) {
    return nm_off_fail(err, err_size, WHAT, OPTION);
}
nm_status nm_frame_signature_slot(const nm_tabm_slot *s, nm_frame_sig *out, char *err, size_t err_size) {
    return nm_off_fail(err, err_size, WHAT, OPTION);
}
// Plain arithmetic, the same as src/io/camera/frame_change.c's.
double nm_frame_difference(const nm_frame_sig *a, const nm_frame_sig *b) {
    if (!a || !b) return 255.0;
    uint64_t d = 0;
    for (int i = 0; i < NM_FRAME_SIG_SIDE * NM_FRAME_SIG_SIDE; i++) d += (uint64_t)abs((int)a->luma[i] - (int)b->luma[i]);
    return (double)d / (NM_FRAME_SIG_SIDE * NM_FRAME_SIG_SIDE);
}

nm_camera_params nm_camera_default_params(void) {
    return (nm_camera_params){.width = 640, .height = 480, .fps = 0, .fourcc = 0, .n_buffers = 4};
}
nm_status nm_camera_open(const char *device, const nm_camera_params *p, nm_camera **out, char *err,
                         size_t err_size) {
    if (out) *out = NULL;
    return nm_off_fail(err, err_size, WHAT, OPTION);
}
// No camera can exist: the calls on one are those on NULL.
nm_camera_info nm_camera_get_info(const nm_camera *c) { return (nm_camera_info){0}; }
nm_camera_stats nm_camera_get_stats(const nm_camera *c) { return (nm_camera_stats){0}; }
const char *nm_camera_last_error(const nm_camera *c) { return ""; }
nm_status nm_camera_start(nm_camera *c, nm_tabm *ring, uint32_t producer) { return NM_ERR_UNSUPPORTED; }
nm_tabm *nm_camera_ring(const nm_camera *c) { return NULL; }
nm_status nm_camera_capture(nm_camera *c, int64_t timeout_ns, nm_tabm_slot *slot) { return NM_ERR_UNSUPPORTED; }
void nm_camera_close(nm_camera *c) {}
