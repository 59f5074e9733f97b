/* Test tool, not part of the engine: what the parts of the fake CUDA runtime of
 * tests/cuda_emu share (emu_runtime.c runs kernels, fake_runtime.c is the host API with
 * its streams, fake_cublaslt.c and fake_cupti.c stand in for those libraries). */
#ifndef GPTC_CUDA_EMU_INTERNAL_H
#define GPTC_CUDA_EMU_INTERNAL_H

#include "cuda_runtime_api.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Records e (unless cudaSuccess) as the calling thread's last error; returns e. */
cudaError_t emu_set_error(cudaError_t e);

/* 1 when s is NULL (the legacy stream) or a live stream. */
int emu_stream_valid(cudaStream_t s);
/* Runs fn(arg) in s's order on s's thread and returns at once; on the NULL (legacy)
 * stream, after the blocking streams' work, before returning. what names the work in
 * hang reports; it must live until the work ran (a string literal). */
void emu_stream_run(cudaStream_t s, void (*fn)(void *), void *arg, const char *what);

/* Under lazy module loading (CUDA_MODULE_LOADING other than EAGER when CUDA started),
 * the first use of the kernel `key` waits for every stream, as its module load may wait
 * for the device; later uses, and every use under EAGER, go on at once. name names it
 * in a hang report. */
void emu_module_first_use(uint64_t key, const char *name);

/* Where a range of memory lies. */
typedef enum {
    EMU_MEM_PAGEABLE, /* no allocation of ours: plain host memory, which the GPU cannot touch */
    EMU_MEM_DEVICE,   /* inside one cudaMalloc block */
    EMU_MEM_PINNED,   /* inside one cudaMallocHost / cudaHostAlloc block (UVA: device-visible) */
    EMU_MEM_OVERRUN   /* starts inside one of our blocks but runs past its end */
} emu_mem_class;
emu_mem_class emu_mem_classify(const void *p, size_t bytes);
/* 0 when a kernel or library call may read or write [p, p + bytes) (device or pinned
 * memory); otherwise -1 with the reason, naming `what`, in why. */
int emu_check_device_range(const void *p, size_t bytes, const char *what, char *why, size_t n);

/* CLOCK_MONOTONIC in milliseconds: the clock of event timestamps (the engine's
 * timing_now_ms reads the same one). */
double emu_now_ms(void);

/* the opt-in limit of dynamic shared memory per block, bytes (emu_runtime.c) */
int emu_smem_optin(void);

/* The fake CUPTI's view of the work (fake_cupti.c): a call that puts work on a stream
 * takes a correlation id (0 while CUPTI is off) on the calling thread, and the work,
 * when it ran, reports its span on emu_cupti_now()'s clock (ns). A kernel names itself:
 * `name` is a C-style name that the record gives as the symbol a C++ kernel of that name
 * has (mangled: _Z<length><name>v), or, with `c_symbol` set, as it is (a C kernel, as
 * cuBLAS's and NCCL's are); copies and sets pass NULL. */
typedef enum { EMU_CUPTI_KERNEL, EMU_CUPTI_MEMCPY, EMU_CUPTI_MEMSET } emu_cupti_work_kind;
uint32_t emu_cupti_api(void);
uint64_t emu_cupti_now(void);
void emu_cupti_work(emu_cupti_work_kind what, uint32_t corr, const char *name, int c_symbol,
                    uint64_t start_ns, uint64_t end_ns);

/* Prints "cuda_emu: " msg (with the calling CUDA thread, if any) and aborts. */
void emu_fail(const char *msg);

#ifdef __cplusplus
}
#endif

#endif
