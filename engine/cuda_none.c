/* Linked instead of engine/cuda/ when the build has no CUDA (no nvcc, or -DGPTC_CUDA=OFF),
 * so that train.device = cuda is refused by name rather than missing at link time. */
#include "engine/cuda/cuda_backend.h"

#include <stdio.h>

const gptc_backend *cuda_backend(int local_rank, char *err, size_t errlen) {
    snprintf(err, errlen, "train.device = cuda: this build has no CUDA backend "
                          "(build where nvcc is found, or with -DGPTC_CUDA=ON)");
    return NULL;
}
int cuda_backend_check_model(int head_size, gptc_precision p, char *err, size_t errlen) {
    return 0; /* never reached: cuda_backend refused */
}
const char *cuda_backend_attention_kernels(int head_size, gptc_precision p, char *buf,
                                           size_t len) {
    return NULL;
}
int cuda_backend_device(void) { return -1; }
int cuda_device_count(void) { return 0; }
const char *cuda_backend_pci_bus_id(char *buf, int len) { return NULL; }
const char *cuda_backend_gemm_cache(void) { return NULL; }
