// The OpenCL backend left out (-DNM_WITH_OPENCL=OFF; off.h): no OpenCL device
// is listed, and asking for one says which option brings it.
#include "backend/registry.h"
#include "off/off.h"

nm_status nm_backend_opencl_new(int index, const nm_backend_params *p, nm_backend **out, char *err, size_t err_size) {
    *out = NULL;
    return nm_off_fail(err, err_size, "the OpenCL backend", "NM_WITH_OPENCL");
}
int32_t nm_opencl_devices(nm_device_info *out, int32_t n) { return 0; }
double nm_opencl_read_gbps(int index) { return 0.0; }
