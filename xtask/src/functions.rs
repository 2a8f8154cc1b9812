//! The driver API functions the bindings cover, by the name a C program writes.
//!
//! The loader resolves each under the ABI-versioned symbol that `cuda.h`'s
//! `#define`s map it to (`cuMemAlloc` -> `cuMemAlloc_v2`); `codegen` reads that
//! mapping from the pinned header, so nothing here spells a version suffix
//! except functions whose *API name* carries one (`cuDeviceGetUuid_v2`).
//!
//! Compiled into `xtask-codegen`, not into `xtask`: it stays at this path,
//! which the generated bindings name as the file to edit.

/// API names, grouped as the issue asks for them.
pub const FUNCTIONS: &[&str] = &[
    // init and version
    "cuInit",
    "cuDriverGetVersion",
    "cuGetProcAddress",
    "cuGetErrorName",
    "cuGetErrorString",
    // devices
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetName",
    "cuDeviceGetUuid_v2",
    "cuDeviceGetAttribute",
    "cuDeviceTotalMem",
    // primary context
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease",
    "cuDevicePrimaryCtxGetState",
    // contexts
    "cuCtxPushCurrent",
    "cuCtxPopCurrent",
    "cuCtxGetCurrent",
    "cuCtxSetCurrent",
    "cuCtxGetDevice",
    "cuCtxSynchronize",
    // streams
    "cuStreamCreate",
    "cuStreamDestroy",
    "cuStreamSynchronize",
    "cuStreamQuery",
    "cuStreamGetCtx",
    "cuStreamWaitEvent",
    "cuLaunchHostFunc",
    "cuStreamWriteValue64",
    "cuStreamWaitValue64",
    // events
    "cuEventCreate",
    "cuEventRecord",
    "cuEventQuery",
    "cuEventSynchronize",
    "cuEventElapsedTime",
    "cuEventDestroy",
    // memory
    "cuMemAlloc",
    "cuMemFree",
    "cuMemAllocHost",
    "cuMemFreeHost",
    "cuMemGetInfo",
    "cuMemsetD8",
    "cuMemsetD32",
    "cuMemsetD8Async",
    "cuMemcpyHtoD",
    "cuMemcpyDtoH",
    "cuMemcpyDtoD",
    "cuMemcpyHtoDAsync",
    "cuMemcpyDtoHAsync",
    "cuMemcpyDtoDAsync",
    "cuMemcpy2D",
    "cuMemcpy2DAsync",
    "cuMemcpy3D",
    "cuMemcpy3DAsync",
    // arrays
    "cuArray3DCreate",
    "cuArrayDestroy",
    "cuArray3DGetDescriptor",
    "cuMipmappedArrayCreate",
    "cuMipmappedArrayGetLevel",
    "cuMipmappedArrayDestroy",
    // external memory
    "cuImportExternalMemory",
    "cuExternalMemoryGetMappedBuffer",
    "cuExternalMemoryGetMappedMipmappedArray",
    "cuDestroyExternalMemory",
    // external semaphores
    "cuImportExternalSemaphore",
    "cuSignalExternalSemaphoresAsync",
    "cuWaitExternalSemaphoresAsync",
    "cuDestroyExternalSemaphore",
    // surface and texture objects
    "cuSurfObjectCreate",
    "cuSurfObjectDestroy",
    "cuTexObjectCreate",
    "cuTexObjectDestroy",
    // modules and launch
    "cuModuleLoadData",
    "cuModuleLoadDataEx",
    "cuModuleGetFunction",
    "cuModuleUnload",
    "cuLaunchKernel",
];

/// Types the safe crate names directly; bindgen pulls in what they depend on.
pub const TYPES: &[&str] = &[
    "CUresult",
    "CUdevice_attribute",
    "CUcomputemode",
    "CUstream_flags",
    "CUevent_flags",
    "CUstreamWaitValue_flags",
    "CUstreamWriteValue_flags",
    "CUarray_format",
    "CUmemorytype",
    "CUresourcetype",
    "CUaddress_mode",
    "CUfilter_mode",
    "CUjit_option",
    "CUexternalMemoryHandleType",
    "CUexternalSemaphoreHandleType",
    "CUDA_MEMCPY2D",
    "CUDA_MEMCPY3D",
    "CUDA_ARRAY3D_DESCRIPTOR",
    "CUDA_RESOURCE_DESC",
    "CUDA_TEXTURE_DESC",
    "CUDA_RESOURCE_VIEW_DESC",
    "CUDA_EXTERNAL_MEMORY_HANDLE_DESC",
    "CUDA_EXTERNAL_MEMORY_BUFFER_DESC",
    "CUDA_EXTERNAL_MEMORY_MIPMAPPED_ARRAY_DESC",
    "CUDA_EXTERNAL_SEMAPHORE_HANDLE_DESC",
    "CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS",
    "CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS",
    "CUuuid",
    "CUdriverProcAddressQueryResult",
];

/// `#define` constants kept (flags the safe crate sets).
pub const CONSTANTS: &[&str] = &[
    "CUDA_VERSION",
    "CUDA_ARRAY3D_LAYERED",
    "CUDA_ARRAY3D_SURFACE_LDST",
    "CUDA_ARRAY3D_CUBEMAP",
    "CUDA_ARRAY3D_TEXTURE_GATHER",
    "CUDA_ARRAY3D_COLOR_ATTACHMENT",
    "CUDA_EXTERNAL_MEMORY_DEDICATED",
    "CU_TRSF_READ_AS_INTEGER",
    "CU_TRSF_NORMALIZED_COORDINATES",
    "CU_GET_PROC_ADDRESS_DEFAULT",
    "CU_MEMHOSTALLOC_PORTABLE",
];
