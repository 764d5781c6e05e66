// The part of the OpenCL 1.2 host API nanomind uses, declared here so that
// we build without OpenCL headers and load the ICD loader at run time
// (dlopen("libOpenCL.so.1")): a machine without OpenCL still runs nanomind.
//
// Types and constant values are those of the Khronos CL/cl.h
// (https://github.com/KhronosGroup/OpenCL-Headers/blob/main/CL/cl.h);
// only what we call is here. Add to it by copying from cl.h, never by guessing.
#ifndef NM_CL_API_H
#define NM_CL_API_H

#include <stddef.h>
#include <stdint.h>

// ---- scalar and handle types (cl_platform.h / cl.h) ----------------------------------
typedef int32_t cl_int;
typedef uint32_t cl_uint;
typedef int64_t cl_long;
typedef uint64_t cl_ulong;
typedef cl_uint cl_bool;
typedef cl_ulong cl_bitfield;

typedef struct _cl_platform_id *cl_platform_id;
typedef struct _cl_device_id *cl_device_id;
typedef struct _cl_context *cl_context;
typedef struct _cl_command_queue *cl_command_queue;
typedef struct _cl_mem *cl_mem;
typedef struct _cl_program *cl_program;
typedef struct _cl_kernel *cl_kernel;
typedef struct _cl_event *cl_event;

typedef cl_bitfield cl_device_type;
typedef cl_uint cl_platform_info;
typedef cl_uint cl_device_info;
typedef cl_bitfield cl_command_queue_properties;
typedef intptr_t cl_context_properties;
typedef cl_bitfield cl_mem_flags;
typedef cl_bitfield cl_map_flags;
typedef cl_uint cl_program_info;
typedef cl_uint cl_program_build_info;
typedef cl_int cl_build_status;
typedef cl_uint cl_kernel_work_group_info;
typedef cl_uint cl_event_info;
typedef cl_uint cl_profiling_info;

// ---- constants ------------------------------------------------------------------------
// error codes
#define CL_SUCCESS 0
#define CL_DEVICE_NOT_FOUND -1
#define CL_DEVICE_NOT_AVAILABLE -2
#define CL_COMPILER_NOT_AVAILABLE -3
#define CL_MEM_OBJECT_ALLOCATION_FAILURE -4
#define CL_OUT_OF_RESOURCES -5
#define CL_OUT_OF_HOST_MEMORY -6
#define CL_BUILD_PROGRAM_FAILURE -11
#define CL_MAP_FAILURE -12
#define CL_INVALID_VALUE -30
#define CL_INVALID_DEVICE_TYPE -31
#define CL_INVALID_PLATFORM -32
#define CL_INVALID_DEVICE -33
#define CL_INVALID_CONTEXT -34
#define CL_INVALID_COMMAND_QUEUE -36
#define CL_INVALID_HOST_PTR -37
#define CL_INVALID_MEM_OBJECT -38
#define CL_INVALID_BINARY -42
#define CL_INVALID_BUILD_OPTIONS -43
#define CL_INVALID_PROGRAM -44
#define CL_INVALID_PROGRAM_EXECUTABLE -45
#define CL_INVALID_KERNEL_NAME -46
#define CL_INVALID_KERNEL -48
#define CL_INVALID_ARG_INDEX -49
#define CL_INVALID_ARG_VALUE -50
#define CL_INVALID_ARG_SIZE -51
#define CL_INVALID_KERNEL_ARGS -52
#define CL_INVALID_WORK_DIMENSION -53
#define CL_INVALID_WORK_GROUP_SIZE -54
#define CL_INVALID_WORK_ITEM_SIZE -55
#define CL_INVALID_GLOBAL_OFFSET -56
#define CL_INVALID_EVENT_WAIT_LIST -57
#define CL_INVALID_EVENT -58
#define CL_INVALID_OPERATION -59
#define CL_INVALID_BUFFER_SIZE -61
#define CL_INVALID_GLOBAL_WORK_SIZE -63

// cl_bool
#define CL_FALSE 0
#define CL_TRUE 1
#define CL_BLOCKING CL_TRUE
#define CL_NON_BLOCKING CL_FALSE

// cl_platform_info
#define CL_PLATFORM_PROFILE 0x0900
#define CL_PLATFORM_VERSION 0x0901
#define CL_PLATFORM_NAME 0x0902
#define CL_PLATFORM_VENDOR 0x0903
#define CL_PLATFORM_EXTENSIONS 0x0904

// cl_device_type (bitfield)
#define CL_DEVICE_TYPE_DEFAULT (1 << 0)
#define CL_DEVICE_TYPE_CPU (1 << 1)
#define CL_DEVICE_TYPE_GPU (1 << 2)
#define CL_DEVICE_TYPE_ACCELERATOR (1 << 3)
#define CL_DEVICE_TYPE_ALL 0xFFFFFFFF

// cl_device_info
#define CL_DEVICE_TYPE 0x1000
#define CL_DEVICE_VENDOR_ID 0x1001
#define CL_DEVICE_MAX_COMPUTE_UNITS 0x1002
#define CL_DEVICE_MAX_WORK_ITEM_DIMENSIONS 0x1003
#define CL_DEVICE_MAX_WORK_GROUP_SIZE 0x1004
#define CL_DEVICE_MAX_WORK_ITEM_SIZES 0x1005
#define CL_DEVICE_MAX_CLOCK_FREQUENCY 0x100C
#define CL_DEVICE_ADDRESS_BITS 0x100D
#define CL_DEVICE_MAX_MEM_ALLOC_SIZE 0x1010
#define CL_DEVICE_MAX_PARAMETER_SIZE 0x1017
#define CL_DEVICE_MEM_BASE_ADDR_ALIGN 0x1019
#define CL_DEVICE_GLOBAL_MEM_CACHE_SIZE 0x101E
#define CL_DEVICE_GLOBAL_MEM_SIZE 0x101F
#define CL_DEVICE_MAX_CONSTANT_BUFFER_SIZE 0x1020
#define CL_DEVICE_LOCAL_MEM_SIZE 0x1023
#define CL_DEVICE_AVAILABLE 0x1027
#define CL_DEVICE_COMPILER_AVAILABLE 0x1028
#define CL_DEVICE_NAME 0x102B
#define CL_DEVICE_VENDOR 0x102C
#define CL_DRIVER_VERSION 0x102D
#define CL_DEVICE_PROFILE 0x102E
#define CL_DEVICE_VERSION 0x102F
#define CL_DEVICE_EXTENSIONS 0x1030
#define CL_DEVICE_PLATFORM 0x1031
#define CL_DEVICE_HOST_UNIFIED_MEMORY 0x1035 // deprecated in 2.0, still answered
#define CL_DEVICE_OPENCL_C_VERSION 0x103D

// cl_command_queue_properties (bitfield)
#define CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE (1 << 0)
#define CL_QUEUE_PROFILING_ENABLE (1 << 1)

// cl_context_properties
#define CL_CONTEXT_PLATFORM 0x1084

// cl_mem_flags (bitfield)
#define CL_MEM_READ_WRITE (1 << 0)
#define CL_MEM_WRITE_ONLY (1 << 1)
#define CL_MEM_READ_ONLY (1 << 2)
#define CL_MEM_USE_HOST_PTR (1 << 3)
#define CL_MEM_ALLOC_HOST_PTR (1 << 4)
#define CL_MEM_COPY_HOST_PTR (1 << 5)
#define CL_MEM_HOST_WRITE_ONLY (1 << 7)
#define CL_MEM_HOST_READ_ONLY (1 << 8)
#define CL_MEM_HOST_NO_ACCESS (1 << 9)

// cl_map_flags (bitfield)
#define CL_MAP_READ (1 << 0)
#define CL_MAP_WRITE (1 << 1)
#define CL_MAP_WRITE_INVALIDATE_REGION (1 << 2)

// cl_program_info
#define CL_PROGRAM_NUM_DEVICES 0x1162
#define CL_PROGRAM_DEVICES 0x1163
#define CL_PROGRAM_BINARY_SIZES 0x1165
#define CL_PROGRAM_BINARIES 0x1166
#define CL_PROGRAM_NUM_KERNELS 0x1167
#define CL_PROGRAM_KERNEL_NAMES 0x1168

// cl_program_build_info, cl_build_status
#define CL_PROGRAM_BUILD_STATUS 0x1181
#define CL_PROGRAM_BUILD_OPTIONS 0x1182
#define CL_PROGRAM_BUILD_LOG 0x1183
#define CL_BUILD_SUCCESS 0
#define CL_BUILD_NONE -1
#define CL_BUILD_ERROR -2
#define CL_BUILD_IN_PROGRESS -3

// cl_kernel_work_group_info
#define CL_KERNEL_WORK_GROUP_SIZE 0x11B0
#define CL_KERNEL_COMPILE_WORK_GROUP_SIZE 0x11B1
#define CL_KERNEL_LOCAL_MEM_SIZE 0x11B2
#define CL_KERNEL_PREFERRED_WORK_GROUP_SIZE_MULTIPLE 0x11B3
#define CL_KERNEL_PRIVATE_MEM_SIZE 0x11B4

// cl_profiling_info (ns of the device's clock)
#define CL_PROFILING_COMMAND_START 0x1282
#define CL_PROFILING_COMMAND_END 0x1283

// cl_event_info, command execution status
#define CL_EVENT_COMMAND_QUEUE 0x11D0
#define CL_EVENT_COMMAND_TYPE 0x11D1
#define CL_EVENT_REFERENCE_COUNT 0x11D2
#define CL_EVENT_COMMAND_EXECUTION_STATUS 0x11D3
#define CL_EVENT_CONTEXT 0x11D4
#define CL_COMPLETE 0x0
#define CL_RUNNING 0x1
#define CL_SUBMITTED 0x2
#define CL_QUEUED 0x3

// ---- entry points (OpenCL 1.2; CL_API_CALL is empty outside Windows) ------------------
typedef void (*nm_cl_context_notify_fn)(const char *errinfo, const void *private_info, size_t cb, void *user_data);
typedef void (*nm_cl_build_notify_fn)(cl_program program, void *user_data);

typedef cl_int (*nm_clGetPlatformIDs_fn)(cl_uint num_entries, cl_platform_id *platforms, cl_uint *num_platforms);
typedef cl_int (*nm_clGetPlatformInfo_fn)(cl_platform_id platform, cl_platform_info param_name,
                                          size_t param_value_size, void *param_value, size_t *param_value_size_ret);
typedef cl_int (*nm_clGetDeviceIDs_fn)(cl_platform_id platform, cl_device_type device_type, cl_uint num_entries,
                                       cl_device_id *devices, cl_uint *num_devices);
typedef cl_int (*nm_clGetDeviceInfo_fn)(cl_device_id device, cl_device_info param_name, size_t param_value_size,
                                        void *param_value, size_t *param_value_size_ret);
typedef cl_context (*nm_clCreateContext_fn)(const cl_context_properties *properties, cl_uint num_devices,
                                            const cl_device_id *devices, nm_cl_context_notify_fn pfn_notify,
                                            void *user_data, cl_int *errcode_ret);
typedef cl_command_queue (*nm_clCreateCommandQueue_fn)(cl_context context, cl_device_id device,
                                                       cl_command_queue_properties properties, cl_int *errcode_ret);
typedef cl_int (*nm_clReleaseCommandQueue_fn)(cl_command_queue command_queue);
typedef cl_int (*nm_clReleaseContext_fn)(cl_context context);
typedef cl_mem (*nm_clCreateBuffer_fn)(cl_context context, cl_mem_flags flags, size_t size, void *host_ptr,
                                       cl_int *errcode_ret);
typedef cl_int (*nm_clReleaseMemObject_fn)(cl_mem memobj);
typedef cl_program (*nm_clCreateProgramWithSource_fn)(cl_context context, cl_uint count, const char **strings,
                                                      const size_t *lengths, cl_int *errcode_ret);
typedef cl_program (*nm_clCreateProgramWithBinary_fn)(cl_context context, cl_uint num_devices,
                                                      const cl_device_id *device_list, const size_t *lengths,
                                                      const unsigned char **binaries, cl_int *binary_status,
                                                      cl_int *errcode_ret);
typedef cl_int (*nm_clGetProgramInfo_fn)(cl_program program, cl_program_info param_name, size_t param_value_size,
                                         void *param_value, size_t *param_value_size_ret);
typedef cl_int (*nm_clBuildProgram_fn)(cl_program program, cl_uint num_devices, const cl_device_id *device_list,
                                       const char *options, nm_cl_build_notify_fn pfn_notify, void *user_data);
typedef cl_int (*nm_clGetProgramBuildInfo_fn)(cl_program program, cl_device_id device,
                                              cl_program_build_info param_name, size_t param_value_size,
                                              void *param_value, size_t *param_value_size_ret);
typedef cl_int (*nm_clReleaseProgram_fn)(cl_program program);
typedef cl_kernel (*nm_clCreateKernel_fn)(cl_program program, const char *kernel_name, cl_int *errcode_ret);
typedef cl_int (*nm_clReleaseKernel_fn)(cl_kernel kernel);
typedef cl_int (*nm_clSetKernelArg_fn)(cl_kernel kernel, cl_uint arg_index, size_t arg_size, const void *arg_value);
typedef cl_int (*nm_clEnqueueNDRangeKernel_fn)(cl_command_queue command_queue, cl_kernel kernel, cl_uint work_dim,
                                               const size_t *global_work_offset, const size_t *global_work_size,
                                               const size_t *local_work_size, cl_uint num_events_in_wait_list,
                                               const cl_event *event_wait_list, cl_event *event);
typedef cl_int (*nm_clEnqueueReadBuffer_fn)(cl_command_queue command_queue, cl_mem buffer, cl_bool blocking_read,
                                            size_t offset, size_t size, void *ptr, cl_uint num_events_in_wait_list,
                                            const cl_event *event_wait_list, cl_event *event);
typedef cl_int (*nm_clEnqueueWriteBuffer_fn)(cl_command_queue command_queue, cl_mem buffer, cl_bool blocking_write,
                                             size_t offset, size_t size, const void *ptr,
                                             cl_uint num_events_in_wait_list, const cl_event *event_wait_list,
                                             cl_event *event);
typedef cl_int (*nm_clEnqueueCopyBuffer_fn)(cl_command_queue command_queue, cl_mem src_buffer, cl_mem dst_buffer,
                                            size_t src_offset, size_t dst_offset, size_t size,
                                            cl_uint num_events_in_wait_list, const cl_event *event_wait_list,
                                            cl_event *event);
typedef cl_int (*nm_clEnqueueFillBuffer_fn)(cl_command_queue command_queue, cl_mem buffer, const void *pattern,
                                            size_t pattern_size, size_t offset, size_t size,
                                            cl_uint num_events_in_wait_list, const cl_event *event_wait_list,
                                            cl_event *event);
typedef void *(*nm_clEnqueueMapBuffer_fn)(cl_command_queue command_queue, cl_mem buffer, cl_bool blocking_map,
                                          cl_map_flags map_flags, size_t offset, size_t size,
                                          cl_uint num_events_in_wait_list, const cl_event *event_wait_list,
                                          cl_event *event, cl_int *errcode_ret);
typedef cl_int (*nm_clEnqueueUnmapMemObject_fn)(cl_command_queue command_queue, cl_mem memobj, void *mapped_ptr,
                                                cl_uint num_events_in_wait_list, const cl_event *event_wait_list,
                                                cl_event *event);
typedef cl_int (*nm_clEnqueueMarkerWithWaitList_fn)(cl_command_queue command_queue, cl_uint num_events_in_wait_list,
                                                    const cl_event *event_wait_list, cl_event *event);
typedef cl_int (*nm_clEnqueueBarrierWithWaitList_fn)(cl_command_queue command_queue, cl_uint num_events_in_wait_list,
                                                     const cl_event *event_wait_list, cl_event *event);
typedef cl_int (*nm_clWaitForEvents_fn)(cl_uint num_events, const cl_event *event_list);
typedef cl_int (*nm_clReleaseEvent_fn)(cl_event event);
typedef cl_int (*nm_clRetainEvent_fn)(cl_event event);
typedef cl_int (*nm_clGetEventInfo_fn)(cl_event event, cl_event_info param_name, size_t param_value_size,
                                       void *param_value, size_t *param_value_size_ret);
typedef cl_int (*nm_clFinish_fn)(cl_command_queue command_queue);
typedef cl_int (*nm_clFlush_fn)(cl_command_queue command_queue);
typedef cl_int (*nm_clGetEventProfilingInfo_fn)(cl_event event, cl_profiling_info param_name, size_t param_value_size,
                                               void *param_value, size_t *param_value_size_ret);
typedef cl_int (*nm_clGetKernelWorkGroupInfo_fn)(cl_kernel kernel, cl_device_id device,
                                                 cl_kernel_work_group_info param_name, size_t param_value_size,
                                                 void *param_value, size_t *param_value_size_ret);

// The loaded library and its entry points; members are named as the API
// functions so that a grep for clFinish finds every call.
typedef struct nm_cl_api {
    void *lib; // dlopen handle; NULL until loaded
    nm_clGetPlatformIDs_fn clGetPlatformIDs;
    nm_clGetPlatformInfo_fn clGetPlatformInfo;
    nm_clGetDeviceIDs_fn clGetDeviceIDs;
    nm_clGetDeviceInfo_fn clGetDeviceInfo;
    nm_clCreateContext_fn clCreateContext;
    nm_clCreateCommandQueue_fn clCreateCommandQueue;
    nm_clReleaseCommandQueue_fn clReleaseCommandQueue;
    nm_clReleaseContext_fn clReleaseContext;
    nm_clCreateBuffer_fn clCreateBuffer;
    nm_clReleaseMemObject_fn clReleaseMemObject;
    nm_clCreateProgramWithSource_fn clCreateProgramWithSource;
    nm_clCreateProgramWithBinary_fn clCreateProgramWithBinary;
    nm_clGetProgramInfo_fn clGetProgramInfo;
    nm_clBuildProgram_fn clBuildProgram;
    nm_clGetProgramBuildInfo_fn clGetProgramBuildInfo;
    nm_clReleaseProgram_fn clReleaseProgram;
    nm_clCreateKernel_fn clCreateKernel;
    nm_clReleaseKernel_fn clReleaseKernel;
    nm_clSetKernelArg_fn clSetKernelArg;
    nm_clEnqueueNDRangeKernel_fn clEnqueueNDRangeKernel;
    nm_clEnqueueReadBuffer_fn clEnqueueReadBuffer;
    nm_clEnqueueWriteBuffer_fn clEnqueueWriteBuffer;
    nm_clEnqueueCopyBuffer_fn clEnqueueCopyBuffer;
    nm_clEnqueueFillBuffer_fn clEnqueueFillBuffer;
    nm_clEnqueueMapBuffer_fn clEnqueueMapBuffer;
    nm_clEnqueueUnmapMemObject_fn clEnqueueUnmapMemObject;
    nm_clEnqueueMarkerWithWaitList_fn clEnqueueMarkerWithWaitList;
    nm_clEnqueueBarrierWithWaitList_fn clEnqueueBarrierWithWaitList;
    nm_clWaitForEvents_fn clWaitForEvents;
    nm_clReleaseEvent_fn clReleaseEvent;
    nm_clRetainEvent_fn clRetainEvent;
    nm_clGetEventInfo_fn clGetEventInfo;
    nm_clFinish_fn clFinish;
    nm_clFlush_fn clFlush;
    nm_clGetEventProfilingInfo_fn clGetEventProfilingInfo;
    nm_clGetKernelWorkGroupInfo_fn clGetKernelWorkGroupInfo;
} nm_cl_api;

// Opens libOpenCL.so.1 (else libOpenCL.so) and resolves every entry point
// above. Returns 0 on success; -1 with a message in err[0..n) if the library
// or any symbol is missing (then *api is zeroed and holds nothing to unload).
// Thread safety: none; call once and share the filled struct read-only.
int nm_cl_api_load(nm_cl_api *api, char *err, size_t n);
// Zeroes *api (the library itself stays loaded: ICDs are not made to be
// unloaded); a no-op on a zeroed struct. Every OpenCL object made through it
// must have been released before.
void nm_cl_api_unload(nm_cl_api *api);
// "CL_INVALID_VALUE" for -30, ...; "CL_UNKNOWN_ERROR" for codes not named above.
const char *nm_cl_strerror(cl_int err);

// The geometry of the x8 matvecs (kernels_x8.cl), given to the program as build
// options: mvq_q4_0's rows a work-group, its local size and the blocks an item
// loads a step (NM_MVQ_ROWS, NM_MVQ_LWS, NM_MVQ_B); mvq_res_q4_0's rows a
// group of 32 items, blocks a step and groups of 32 a row (NM_MVS_RPW, NM_MVS_B,
// NM_MVS_SPLIT: 1 without PTX); mvq_glu_q4_0's blocks a step (NM_MVG_B). mvs_lws is mvq_res_q4_0's local size where the
// program has NM_DP4A_PTX (elsewhere 1024 / mvs_rpw: a block of 32 rows a
// work-group). The backend and the kernel tests build with the same.
typedef struct nm_cl_x8_geom {
    int mvq_rows, mvq_lws, mvq_b, mvs_rpw, mvs_b, mvs_lws, mvg_b, mvs_split;
} nm_cl_x8_geom;
// The defaults, or the tuning settings NM_OPENCL_MVQ=ROWS,LWS,B (ROWS 2..16,
// LWS 32..256, B 1..8), NM_OPENCL_MVS=RPW,B,LWS[,SPLIT] (RPW 1..4, LWS 32..1024,
// SPLIT 1..8, at least one row a work-group) and
// NM_OPENCL_MVG=B, each a power of two (a setting out of range keeps the
// defaults).
nm_cl_x8_geom nm_cl_x8_geom_get(void);
// The program's build options into buf[0..n): OpenCL C 1.2, the geometry, and
// with ptx NM_DP4A_PTX (NVIDIA's inline PTX).
void nm_cl_build_opts(const nm_cl_x8_geom *g, int ptx, char *buf, size_t n);

#endif
