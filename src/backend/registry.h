// The backends this build has, by device name (nm_backend_create). Only
// src/backend includes this: bricks name devices, not backends.
#ifndef NM_BACKEND_REGISTRY_H
#define NM_BACKEND_REGISTRY_H

#include "backend/backend.h"

nm_status nm_backend_cpu_new(const nm_backend_params *p, nm_backend **out, char *err, size_t err_size);
// index: the N of "opencl:N" (devices of all platforms in order).
nm_status nm_backend_opencl_new(int index, const nm_backend_params *p, nm_backend **out, char *err, size_t err_size);

// Read bandwidth of opencl:index (a float4 sum over a large buffer), GB/s; 0 if it cannot run.
double nm_opencl_read_gbps(int index);

#endif
