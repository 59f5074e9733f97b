/* The CUDA backend (train.device = cuda): one GPU per rank, chosen round-robin from the
 * rank's index on its node. */
#ifndef GPTC_CUDA_BACKEND_H
#define GPTC_CUDA_BACKEND_H

#include "engine/backend.h"

#include <stddef.h>

/* The op table, started on GPU local_rank % (GPUs on this node). NULL with a one-line
 * reason in err when there is no usable GPU or a start-up call fails. Later calls return
 * the table already started. */
const gptc_backend *cuda_backend(int local_rank, char *err, size_t errlen);
/* 0 when the started GPU runs the kernels of a model with this head size at precision
 * p; else -1 with a one-line reason in err (the attention needs more shared memory per
 * block than the GPU allows: fp32 above head size 64 on sm_86 / sm_89). */
int cuda_backend_check_model(int head_size, gptc_precision p, char *err, size_t errlen);
/* The bf16 attention kernels that run at this head size, as their environment variables
 * chose them (attention_bf16.cu), in buf: "forward plain, dq by its own kernel, qkv bias
 * by a pass"; NULL under fp32, which has no variants. */
const char *cuda_backend_attention_kernels(int head_size, gptc_precision p, char *buf, size_t len);
/* The GPU index this process uses (after cuda_backend succeeded). */
int cuda_backend_device(void);
/* The PCI bus id of that GPU in buf (NVML finds the same board by it); NULL if unknown. */
const char *cuda_backend_pci_bus_id(char *buf, int len);
/* GPUs visible to this process; 0 when there is none or no working driver. */
int cuda_device_count(void);
/* The file the GEMM choices are appended to during the run (GPTC_GEMM_CACHE, kept only
 * with GPTC_GEMM_CANDIDATES a count of 2 or more: cuda_matmul.c), or NULL; from the
 * environment alone, so that the start-up checks know it before the backend starts. */
const char *cuda_backend_gemm_cache(void);
/* Builds without CUDA link engine/cuda_none.c, whose cuda_backend says so in err. */


#endif
