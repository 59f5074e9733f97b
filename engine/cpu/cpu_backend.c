/* The CPU backend's op table. Streams are not yet threads: every op runs inline on the
 * caller, which is the serialized order any stream schedule must reproduce. */
#define _POSIX_C_SOURCE 200809L
#include "engine/backend.h"
#include "engine/cpu/cpu_blas.h"
#include "engine/cpu/cpu_ops.h"

#include <stdlib.h>
#include <string.h>

static void *cpu_alloc(size_t bytes) {
    /* 64-byte alignment keeps AVX-512 loads in the BLAS and loops aligned */
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0) return NULL;
    memset(p, 0, bytes);
    return p;
}
static void cpu_release(void *p) { free(p); }
static void cpu_zero(void *p, size_t bytes, gptc_stream *s) { memset(p, 0, bytes); }
static void cpu_copy(void *dst, const void *src, size_t bytes, gptc_stream *s) {
    memcpy(dst, src, bytes);
}
static void cpu_synchronize(gptc_stream *s) {}

static const gptc_backend CPU = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .release = cpu_release,
    .zero = cpu_zero,
    .copy_from_host = cpu_copy,
    .copy_to_host = cpu_copy,
    .synchronize = cpu_synchronize,
    .embedding_forward = cpu_embedding_forward,
    .embedding_backward = cpu_embedding_backward,
    .layernorm_forward = cpu_layernorm_forward,
    .layernorm_backward = cpu_layernorm_backward,
    .matmul_forward = cpu_matmul_forward,
    .matmul_backward = cpu_matmul_backward,
    .attention_forward = cpu_attention_forward,
    .attention_backward = cpu_attention_backward,
    .gelu_forward = cpu_gelu_forward,
    .gelu_backward = cpu_gelu_backward,
    .add = cpu_add,
    .accumulate = cpu_accumulate,
    .crossentropy_forward_backward = cpu_crossentropy_forward_backward,
    .sum_squares = cpu_sum_squares,
    .scale = cpu_scale,
    .adamw = cpu_adamw,
};

const gptc_backend *cpu_backend(void) {
    return cpu_blas_init() == 0 ? &CPU : NULL;
}
