// The OpenCL backend left out (-DNM_WITH_OPENCL=OFF; off.h): no OpenCL device
// is listed, and asking for one says which option brings it.
#include "backend/registry.h"
#include "off/off.h"

static nm_status opencl_create(int32_t index, const nm_backend_params *p, nm_backend **out, char *err,
                               size_t err_size) {
    (void)index, (void)p;
    *out = NULL;
    return nm_off_fail(err, err_size, "the OpenCL backend", "NM_WITH_OPENCL");
}
static int32_t opencl_devices(nm_device_info *out, int32_t n, bool measure) {
    (void)out, (void)n, (void)measure;
    return 0;
}
static int32_t opencl_pick_auto(char *err, size_t err_size) {
    nm_off_fail(err, err_size, "the OpenCL backend", "NM_WITH_OPENCL");
    return -1;
}

const nm_backend_reg nm_backend_opencl_reg = {.version = NM_BACKEND_IFACE_VERSION, .name = "opencl",
                                              .devices = opencl_devices, .create = opencl_create,
                                              .pick_auto = opencl_pick_auto};
