/* Test tool, not part of the engine: the host side of the CUDA runtime API as far as
 * engine/cuda/ uses it, for the CPU emulator of tests/cuda_emu. It stands in for the
 * toolkit's header of the same name wherever tests/cuda_emu is first on the include path:
 * the emulated kernels, the kernel test driver (test_cuda_emu.c) and the real host files
 * of engine/cuda/ built into gptc-train-emu (tests/CMakeLists.txt). Plain C, so that C
 * files include it.
 *
 * Implemented by emu_runtime.c (kernel launches: a host thread per CUDA thread) and
 * fake_runtime.c (devices, memory, streams, events, copies; read its header comment for
 * the semantics and the checks). "Device memory" is host memory; a stream is a host
 * thread running its work in order, so streams really run beside each other and beside
 * the host, as on a GPU. The NULL (legacy) stream is synchronous.
 *
 * Values of enums and flags are those of the real toolkit, so that code passing them
 * through as numbers still means the same thing. */
#ifndef GPTC_CUDA_EMU_RUNTIME_API_H
#define GPTC_CUDA_EMU_RUNTIME_API_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;

typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInitializationError = 3,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidMemcpyDirection = 21,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorNoKernelImageForDevice = 209,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorNotReady = 600,
    cudaErrorUnknown = 999
} cudaError_t;

typedef enum cudaDeviceAttr {
    cudaDevAttrMaxThreadsPerBlock = 1,
    cudaDevAttrMaxSharedMemoryPerBlock = 8,
    cudaDevAttrWarpSize = 10,
    cudaDevAttrMultiProcessorCount = 16,
    cudaDevAttrL2CacheSize = 38,
    cudaDevAttrComputeCapabilityMajor = 75,
    cudaDevAttrComputeCapabilityMinor = 76,
    cudaDevAttrMaxSharedMemoryPerMultiprocessor = 81,
    cudaDevAttrMaxSharedMemoryPerBlockOptin = 97
} cudaDeviceAttr;

typedef enum cudaFuncAttribute {
    cudaFuncAttributeMaxDynamicSharedMemorySize = 8
} cudaFuncAttribute;

typedef enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4
} cudaMemcpyKind;

/* stream, event and host allocation flags */
#define cudaStreamDefault 0x00
#define cudaStreamNonBlocking 0x01
#define cudaEventDefault 0x00
#define cudaEventBlockingSync 0x01
#define cudaEventDisableTiming 0x02
#define cudaHostAllocDefault 0x00
#define cudaHostAllocPortable 0x01
#define cudaHostAllocMapped 0x02
#define cudaHostAllocWriteCombined 0x04

typedef void (*cudaHostFn_t)(void *userData);

/* What the launchers of the kernels read (cudaGetDeviceProperties); the emulated device
 * is an sm_90 with 2 multiprocessors (GPTC_EMU_SM=n for n). */
typedef struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem;
    size_t sharedMemPerBlock;
    size_t sharedMemPerBlockOptin;
    int warpSize;
    int maxThreadsPerBlock;
    int multiProcessorCount;
    int major, minor;
} cudaDeviceProp;

/* Renamed to emu_* at the symbol level so that a build which also links the real
 * libcudart (GPTC_CUDA on) never mixes the two. */
#define cudaGetErrorString emu_cudaGetErrorString
#define cudaGetErrorName emu_cudaGetErrorName
#define cudaGetLastError emu_cudaGetLastError
#define cudaPeekAtLastError emu_cudaPeekAtLastError
#define cudaGetDeviceCount emu_cudaGetDeviceCount
#define cudaSetDevice emu_cudaSetDevice
#define cudaGetDevice emu_cudaGetDevice
#define cudaDeviceGetAttribute emu_cudaDeviceGetAttribute
#define cudaGetDeviceProperties emu_cudaGetDeviceProperties
#define cudaDeviceGetPCIBusId emu_cudaDeviceGetPCIBusId
#define cudaDeviceGetStreamPriorityRange emu_cudaDeviceGetStreamPriorityRange
#define cudaDeviceSynchronize emu_cudaDeviceSynchronize
#define cudaMalloc emu_cudaMalloc
#define cudaFree emu_cudaFree
#define cudaMallocAsync emu_cudaMallocAsync
#define cudaFreeAsync emu_cudaFreeAsync
#define cudaMallocHost emu_cudaMallocHost
#define cudaHostAlloc emu_cudaHostAlloc
#define cudaFreeHost emu_cudaFreeHost
#define cudaHostGetDevicePointer emu_cudaHostGetDevicePointer
#define cudaMemcpy emu_cudaMemcpy
#define cudaMemcpyAsync emu_cudaMemcpyAsync
#define cudaMemset emu_cudaMemset
#define cudaMemsetAsync emu_cudaMemsetAsync
#define cudaStreamCreate emu_cudaStreamCreate
#define cudaStreamCreateWithFlags emu_cudaStreamCreateWithFlags
#define cudaStreamCreateWithPriority emu_cudaStreamCreateWithPriority
#define cudaStreamDestroy emu_cudaStreamDestroy
#define cudaStreamSynchronize emu_cudaStreamSynchronize
#define cudaStreamQuery emu_cudaStreamQuery
#define cudaStreamWaitEvent emu_cudaStreamWaitEvent
#define cudaLaunchHostFunc emu_cudaLaunchHostFunc
#define cudaEventCreate emu_cudaEventCreate
#define cudaEventCreateWithFlags emu_cudaEventCreateWithFlags
#define cudaEventDestroy emu_cudaEventDestroy
#define cudaEventRecord emu_cudaEventRecord
#define cudaEventQuery emu_cudaEventQuery
#define cudaEventSynchronize emu_cudaEventSynchronize
#define cudaEventElapsedTime emu_cudaEventElapsedTime

const char *emu_cudaGetErrorString(cudaError_t e);
const char *emu_cudaGetErrorName(cudaError_t e);
/* per host thread, as in CUDA: the last error of a call or launch on this thread */
cudaError_t emu_cudaGetLastError(void);
cudaError_t emu_cudaPeekAtLastError(void);

/* one device (GPTC_EMU_DEVICES=n for n, 0 for "no device") */
cudaError_t emu_cudaGetDeviceCount(int *count);
cudaError_t emu_cudaSetDevice(int device);
cudaError_t emu_cudaGetDevice(int *device);
/* the multiprocessor count is 2 (GPTC_EMU_SM overrides it): grid-stride loops and
 * multi-block reductions then take several passes even at test sizes */
cudaError_t emu_cudaDeviceGetAttribute(int *value, cudaDeviceAttr attr, int device);
cudaError_t emu_cudaGetDeviceProperties(cudaDeviceProp *prop, int device);
cudaError_t emu_cudaDeviceGetPCIBusId(char *pciBusId, int len, int device);
cudaError_t emu_cudaDeviceGetStreamPriorityRange(int *leastPriority, int *greatestPriority);
cudaError_t emu_cudaDeviceSynchronize(void);

cudaError_t emu_cudaMalloc(void **p, size_t bytes);
cudaError_t emu_cudaFree(void *p);
cudaError_t emu_cudaMallocAsync(void **p, size_t bytes, cudaStream_t s);
cudaError_t emu_cudaFreeAsync(void *p, cudaStream_t s);
cudaError_t emu_cudaMallocHost(void **p, size_t bytes);
cudaError_t emu_cudaHostAlloc(void **p, size_t bytes, unsigned int flags);
cudaError_t emu_cudaFreeHost(void *p);
cudaError_t emu_cudaHostGetDevicePointer(void **pDevice, void *pHost, unsigned int flags);

cudaError_t emu_cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind);
cudaError_t emu_cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                                cudaStream_t s);
cudaError_t emu_cudaMemset(void *dst, int value, size_t bytes);
cudaError_t emu_cudaMemsetAsync(void *dst, int value, size_t bytes, cudaStream_t s);

cudaError_t emu_cudaStreamCreate(cudaStream_t *s);
cudaError_t emu_cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags);
cudaError_t emu_cudaStreamCreateWithPriority(cudaStream_t *s, unsigned int flags, int priority);
cudaError_t emu_cudaStreamDestroy(cudaStream_t s);
cudaError_t emu_cudaStreamSynchronize(cudaStream_t s);
cudaError_t emu_cudaStreamQuery(cudaStream_t s);
cudaError_t emu_cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags);
cudaError_t emu_cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void *userData);

cudaError_t emu_cudaEventCreate(cudaEvent_t *e);
cudaError_t emu_cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags);
cudaError_t emu_cudaEventDestroy(cudaEvent_t e);
cudaError_t emu_cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t emu_cudaEventQuery(cudaEvent_t e);
cudaError_t emu_cudaEventSynchronize(cudaEvent_t e);
cudaError_t emu_cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end);

/* kernel is the kernel function's address; only the dynamic shared memory limit is kept */
#define cudaFuncSetAttribute(kernel, attr, value) \
    emu_func_set_attribute((const void *)(kernel), (attr), (value))
cudaError_t emu_func_set_attribute(const void *kernel, cudaFuncAttribute attr, int value);

/* What cudaFuncGetAttributes tells here: whether the kernel runs on the device. The
 * emulated device is compute capability 9.0; GPTC_EMU_CC=75 (say) makes it a 7.5, on
 * which, as on a GPU the build has no code for, the call fails with
 * cudaErrorNoKernelImageForDevice. */
typedef struct cudaFuncAttributes {
    int maxThreadsPerBlock, numRegs, binaryVersion, ptxVersion;
    size_t sharedSizeBytes;
} cudaFuncAttributes;
#define cudaFuncGetAttributes(attr, kernel) emu_func_get_attributes((attr), (const void *)(kernel))
cudaError_t emu_func_get_attributes(cudaFuncAttributes *attr, const void *kernel);

#ifdef __cplusplus
}
#endif

#endif
