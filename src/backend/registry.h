// The backends this build has, registered by name (ggml-backend's reg/device
// split): each knows its devices and makes a backend on one of them.
// nm_backend_create and nm_list_devices go through it; only src/backend
// includes this: bricks name devices ("cpu", "opencl:1"), not backends.
#ifndef NM_BACKEND_REGISTRY_H
#define NM_BACKEND_REGISTRY_H

#include "backend/backend.h"

#define NM_BACKEND_MAX_REGS 8

typedef struct nm_backend_reg {
    uint32_t version;   // NM_BACKEND_IFACE_VERSION it was built against (checked at registration)
    const char *name;   // its devices' prefix: "cpu", "opencl" (devices NAME, NAME:N)
    // Its devices (NAME:0 first), up to n into out (out may be NULL with n 0); how many exist (0:
    // none here, or the backend left out of this build). measure: time a read on each (slow).
    int32_t (*devices)(nm_device_info *out, int32_t n, bool measure);
    // A backend on device `index` (0 for NAME alone). err says why not (no such device, left out).
    nm_status (*create)(int32_t index, const nm_backend_params *p, nm_backend **out, char *err, size_t err_size);
    // Optional (NULL: NAME:auto is not a device): the device NAME:auto names, or -1 with err saying why.
    int32_t (*pick_auto)(char *err, size_t err_size);
} nm_backend_reg;

// Adds a backend to the registry (the built-ins, cpu first, are there before
// the first lookup). NM_ERR_INVALID_ARG (err says why) for another interface
// version, a name empty or taken, devices or create NULL; NM_ERR_RANGE when
// the registry is full.
nm_status nm_backend_register(const nm_backend_reg *r, char *err, size_t err_size);
// The registered backends, in order: *out (may be NULL) points at them; their count.
int32_t nm_backend_regs(const nm_backend_reg *const **out);
// The backend registered as name[0..len), or NULL.
const nm_backend_reg *nm_backend_reg_find(const char *name, size_t len);
// A backend's table as nm_backend_create checks it: its version and every
// member not marked optional set. False with why in err.
bool nm_backend_iface_check(const nm_backend_i *i, char *err, size_t err_size);

// The built-ins: cpu (cpu_backend.c), opencl (opencl_backend.c, or off/opencl.c where it is left out).
extern const nm_backend_reg nm_backend_cpu_reg, nm_backend_opencl_reg;
nm_status nm_backend_cpu_new(const nm_backend_params *p, nm_backend **out, char *err, size_t err_size);
// The host as a device (name "cpu"), for the cpu backend's devices (backend.c).
void nm_host_device_info(nm_device_info *d, bool measure);

#endif
