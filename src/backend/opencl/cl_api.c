// Run-time loading of the OpenCL ICD loader (see cl_api.h).
#include "backend/opencl/cl_api.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

int nm_cl_api_load(nm_cl_api *api, char *err, size_t n) {
    memset(api, 0, sizeof *api);
    void *lib = dlopen("libOpenCL.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) lib = dlopen("libOpenCL.so", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *why = dlerror();
        if (err && n) snprintf(err, n, "cannot open libOpenCL.so.1: %s", why ? why : "not found");
        return -1;
    }
    // ISO C forbids converting void * to a function pointer; POSIX requires
    // dlsym's result to be usable as one, so copy the bits.
#define NM_CL_SYM(name)                                                                      \
    do {                                                                                     \
        void *p_ = dlsym(lib, #name);                                                        \
        if (!p_) {                                                                           \
            if (err && n) snprintf(err, n, "libOpenCL.so.1 lacks %s (OpenCL 1.2 needed)", #name); \
            dlclose(lib);                                                                    \
            memset(api, 0, sizeof *api);                                                     \
            return -1;                                                                       \
        }                                                                                    \
        memcpy(&api->name, &p_, sizeof p_);                                                  \
    } while (0)
    NM_CL_SYM(clGetPlatformIDs);
    NM_CL_SYM(clGetPlatformInfo);
    NM_CL_SYM(clGetDeviceIDs);
    NM_CL_SYM(clGetDeviceInfo);
    NM_CL_SYM(clCreateContext);
    NM_CL_SYM(clCreateCommandQueue);
    NM_CL_SYM(clReleaseCommandQueue);
    NM_CL_SYM(clReleaseContext);
    NM_CL_SYM(clCreateBuffer);
    NM_CL_SYM(clReleaseMemObject);
    NM_CL_SYM(clCreateProgramWithSource);
    NM_CL_SYM(clCreateProgramWithBinary);
    NM_CL_SYM(clGetProgramInfo);
    NM_CL_SYM(clBuildProgram);
    NM_CL_SYM(clGetProgramBuildInfo);
    NM_CL_SYM(clReleaseProgram);
    NM_CL_SYM(clCreateKernel);
    NM_CL_SYM(clReleaseKernel);
    NM_CL_SYM(clSetKernelArg);
    NM_CL_SYM(clEnqueueNDRangeKernel);
    NM_CL_SYM(clEnqueueReadBuffer);
    NM_CL_SYM(clEnqueueWriteBuffer);
    NM_CL_SYM(clEnqueueCopyBuffer);
    NM_CL_SYM(clEnqueueFillBuffer);
    NM_CL_SYM(clEnqueueMapBuffer);
    NM_CL_SYM(clEnqueueUnmapMemObject);
    NM_CL_SYM(clEnqueueMarkerWithWaitList);
    NM_CL_SYM(clEnqueueBarrierWithWaitList);
    NM_CL_SYM(clWaitForEvents);
    NM_CL_SYM(clReleaseEvent);
    NM_CL_SYM(clRetainEvent);
    NM_CL_SYM(clGetEventInfo);
    NM_CL_SYM(clFinish);
    NM_CL_SYM(clFlush);
    NM_CL_SYM(clGetEventProfilingInfo);
    NM_CL_SYM(clGetKernelWorkGroupInfo);
#undef NM_CL_SYM
    api->lib = lib;
    return 0;
}

// The library stays loaded (dlopen's count is kept): ICDs and their compilers
// keep state and threads past their last release, and are not made to be
// unloaded from a running process; a later load finds it loaded.
void nm_cl_api_unload(nm_cl_api *api) { memset(api, 0, sizeof *api); }

const char *nm_cl_strerror(cl_int err) {
    switch (err) {
#define NM_CL_ERR(e) \
    case e: return #e;
        NM_CL_ERR(CL_SUCCESS)
        NM_CL_ERR(CL_DEVICE_NOT_FOUND)
        NM_CL_ERR(CL_DEVICE_NOT_AVAILABLE)
        NM_CL_ERR(CL_COMPILER_NOT_AVAILABLE)
        NM_CL_ERR(CL_MEM_OBJECT_ALLOCATION_FAILURE)
        NM_CL_ERR(CL_OUT_OF_RESOURCES)
        NM_CL_ERR(CL_OUT_OF_HOST_MEMORY)
        NM_CL_ERR(CL_BUILD_PROGRAM_FAILURE)
        NM_CL_ERR(CL_MAP_FAILURE)
        NM_CL_ERR(CL_INVALID_VALUE)
        NM_CL_ERR(CL_INVALID_DEVICE_TYPE)
        NM_CL_ERR(CL_INVALID_PLATFORM)
        NM_CL_ERR(CL_INVALID_DEVICE)
        NM_CL_ERR(CL_INVALID_CONTEXT)
        NM_CL_ERR(CL_INVALID_COMMAND_QUEUE)
        NM_CL_ERR(CL_INVALID_HOST_PTR)
        NM_CL_ERR(CL_INVALID_MEM_OBJECT)
        NM_CL_ERR(CL_INVALID_BINARY)
        NM_CL_ERR(CL_INVALID_BUILD_OPTIONS)
        NM_CL_ERR(CL_INVALID_PROGRAM)
        NM_CL_ERR(CL_INVALID_PROGRAM_EXECUTABLE)
        NM_CL_ERR(CL_INVALID_KERNEL_NAME)
        NM_CL_ERR(CL_INVALID_KERNEL)
        NM_CL_ERR(CL_INVALID_ARG_INDEX)
        NM_CL_ERR(CL_INVALID_ARG_VALUE)
        NM_CL_ERR(CL_INVALID_ARG_SIZE)
        NM_CL_ERR(CL_INVALID_KERNEL_ARGS)
        NM_CL_ERR(CL_INVALID_WORK_DIMENSION)
        NM_CL_ERR(CL_INVALID_WORK_GROUP_SIZE)
        NM_CL_ERR(CL_INVALID_WORK_ITEM_SIZE)
        NM_CL_ERR(CL_INVALID_GLOBAL_OFFSET)
        NM_CL_ERR(CL_INVALID_EVENT_WAIT_LIST)
        NM_CL_ERR(CL_INVALID_EVENT)
        NM_CL_ERR(CL_INVALID_OPERATION)
        NM_CL_ERR(CL_INVALID_BUFFER_SIZE)
        NM_CL_ERR(CL_INVALID_GLOBAL_WORK_SIZE)
#undef NM_CL_ERR
    default: return "CL_UNKNOWN_ERROR";
    }
}

static int pow2_in(int v, int lo, int hi) { return v >= lo && v <= hi && (v & (v - 1)) == 0; }

nm_cl_x8_geom nm_cl_x8_geom_get(void) {
    nm_cl_x8_geom g = {.mvq_rows = 8, .mvq_lws = 64, .mvq_b = 2, .mvs_rpw = 2, .mvs_b = 1, .mvs_lws = 256, .mvg_b = 2,
                       .mvs_split = 2};
    int a, b, c, d = 1;
    const char *e = getenv("NM_OPENCL_MVQ");
    if (e && sscanf(e, "%d,%d,%d", &a, &b, &c) == 3 && pow2_in(a, 2, 16) && pow2_in(b, 32, 256) && pow2_in(c, 1, 8))
        g.mvq_rows = a, g.mvq_lws = b, g.mvq_b = c;
    if ((e = getenv("NM_OPENCL_MVS")) && sscanf(e, "%d,%d,%d,%d", &a, &b, &c, &d) >= 3 && pow2_in(a, 1, 4) &&
        pow2_in(b, 1, 8) && pow2_in(c, 32, 1024) && pow2_in(d, 1, 8) && c / 32 >= d)
        g.mvs_rpw = a, g.mvs_b = b, g.mvs_lws = c, g.mvs_split = d;
    if ((e = getenv("NM_OPENCL_MVG")) && sscanf(e, "%d", &a) == 1 && pow2_in(a, 1, 8)) g.mvg_b = a;
    return g;
}

void nm_cl_build_opts(const nm_cl_x8_geom *g, int ptx, char *buf, size_t n) {
    snprintf(buf, n,
             "-cl-std=CL1.2%s -DNM_MVQ_ROWS=%d -DNM_MVQ_LWS=%d -DNM_MVQ_B=%d -DNM_MVS_RPW=%d -DNM_MVS_B=%d "
             "-DNM_MVG_B=%d -DNM_MVS_SPLIT=%d",
             ptx ? " -DNM_DP4A_PTX=1" : "", g->mvq_rows, g->mvq_lws, g->mvq_b, g->mvs_rpw, g->mvs_b, g->mvg_b,
             ptx ? g->mvs_split : 1);
}
