/* Test tool, not part of the engine: the host side of the CUDA runtime API as far as
 * engine/cuda/ uses it, for the CPU emulator of tests/cuda_emu (see emu_runtime.c).
 * It stands in for the toolkit's header of the same name when the emulated kernels
 * and the test driver are compiled; it is plain C so that the C test driver can
 * include engine/cuda/cuda_kernels.h. "Device memory" is host memory here, and a
 * stream is only a tag: every launch runs to completion before it returns. */
#ifndef GPTC_CUDA_EMU_RUNTIME_API_H
#define GPTC_CUDA_EMU_RUNTIME_API_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct CUstream_st *cudaStream_t;
typedef int cudaError_t;
enum { cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorInvalidConfiguration = 9 };
typedef enum cudaDeviceAttr { cudaDevAttrMultiProcessorCount = 16 } cudaDeviceAttr;
typedef enum cudaFuncAttribute {
    cudaFuncAttributeMaxDynamicSharedMemorySize = 8
} cudaFuncAttribute;

/* Renamed to emu_* at the symbol level so that a build which also links the real
 * libcudart (GPTC_CUDA on) never mixes the two. */
#define cudaGetDevice emu_cudaGetDevice
#define cudaDeviceGetAttribute emu_cudaDeviceGetAttribute
#define cudaGetLastError emu_cudaGetLastError
cudaError_t emu_cudaGetDevice(int *device);
/* the multiprocessor count is 2 (GPTC_EMU_SM overrides it): grid-stride loops and
 * multi-block reductions then take several passes even at test sizes */
cudaError_t emu_cudaDeviceGetAttribute(int *value, cudaDeviceAttr attr, int device);
cudaError_t emu_cudaGetLastError(void);
/* kernel is the kernel function's address; only the dynamic shared memory limit is kept */
#define cudaFuncSetAttribute(kernel, attr, value) \
    emu_func_set_attribute((const void *)(kernel), (attr), (value))
cudaError_t emu_func_set_attribute(const void *kernel, cudaFuncAttribute attr, int value);

#ifdef __cplusplus
}
#endif

#endif
