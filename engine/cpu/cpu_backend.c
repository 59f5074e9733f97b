/* The CPU backend's op table. Compute ops run inline on the caller (the NULL stream);
 * other streams are worker threads (cpu_stream.c) that run communication and host
 * functions in their queue's order. */
#define _POSIX_C_SOURCE 200809L
#include "engine/backend.h"
#include "engine/cpu/cpu_blas.h"
#include "engine/cpu/cpu_ops.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sysinfo.h>

/* Bytes the CPU backend holds in this process, and the most it may: the machine's memory
 * and swap. Linux overcommits, so an allocation past that succeeded, the memset below woke
 * the OOM killer, and the run ended without a word (gpt2-124m's activations on the CPU);
 * refused here instead, the caller says what for. */
static atomic_size_t cpu_held;

static size_t cpu_limit(void) {
    /* a test's small machine: the sum of the allocations is what is checked */
    const char *test = getenv("GPTC_TEST_CPU_MEMORY_BYTES");
    if (test && *test) return (size_t)strtoull(test, NULL, 10);
    struct sysinfo si;
    if (sysinfo(&si) != 0) return SIZE_MAX;
    return ((size_t)si.totalram + (size_t)si.totalswap) * (size_t)si.mem_unit;
}

enum { CPU_HEADER = 64 }; /* before each block: its size; 64 bytes keep it aligned */

static void *cpu_alloc(size_t bytes) {
    size_t want = CPU_HEADER + (bytes ? bytes : 64);
    if (want < bytes || atomic_fetch_add(&cpu_held, want) + want > cpu_limit()) {
        atomic_fetch_sub(&cpu_held, want);
        return NULL;
    }
    /* 64-byte alignment keeps AVX-512 loads in the BLAS and loops aligned */
    void *p = NULL;
    if (posix_memalign(&p, 64, want) != 0) {
        atomic_fetch_sub(&cpu_held, want);
        return NULL;
    }
    *(size_t *)p = want;
    memset((char *)p + CPU_HEADER, 0, bytes);
    return (char *)p + CPU_HEADER;
}
static void cpu_release(void *p) {
    if (!p) return;
    char *block = (char *)p - CPU_HEADER;
    atomic_fetch_sub(&cpu_held, *(size_t *)block);
    free(block);
}
static void cpu_release_host(void *p) { free(p); }
static void cpu_zero(void *p, size_t bytes, gptc_stream *s) { memset(p, 0, bytes); }
static void cpu_copy(void *dst, const void *src, size_t bytes, gptc_stream *s) {
    memcpy(dst, src, bytes);
}
static void *cpu_alloc_host(size_t bytes) { return malloc(bytes ? bytes : 1); }

/* In a stream's order: on NULL at once, on a stream by its worker thread. */
typedef struct {
    void *dst;       /* [bytes] */
    const void *src; /* [bytes] */
    size_t bytes;
} copy_task;

static void run_copy(void *arg) {
    copy_task *t = arg;
    memcpy(t->dst, t->src, t->bytes);
    free(t);
}

static void cpu_copy_async(void *dst, const void *src, size_t bytes, gptc_stream *s) {
    copy_task *t = s ? malloc(sizeof *t) : NULL;
    if (!t) {
        if (s) cpu_stream_synchronize(s); /* no memory for the task: copy in order, now */
        memcpy(dst, src, bytes);
        return;
    }
    *t = (copy_task){dst, src, bytes};
    cpu_launch_host_func(s, run_copy, t);
}

static const gptc_backend CPU = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .release = cpu_release,
    .zero = cpu_zero,
    .copy_from_host = cpu_copy,
    .copy_to_host = cpu_copy,
    .alloc_host = cpu_alloc_host,
    .release_host = cpu_release_host,
    .copy_async = cpu_copy_async,
    .synchronize = cpu_stream_synchronize,
    .stream_create = cpu_stream_create,
    .stream_destroy = cpu_stream_destroy,
    .event_create = cpu_event_create,
    .event_destroy = cpu_event_destroy,
    .event_record = cpu_event_record,
    .stream_wait_event = cpu_stream_wait_event,
    .event_synchronize = cpu_event_synchronize,
    .stream_synchronize = cpu_stream_synchronize,
    .launch_host_func = cpu_launch_host_func,
    .embedding_forward = cpu_embedding_forward,
    .embedding_backward = cpu_embedding_backward,
    .layernorm_forward = cpu_layernorm_forward,
    .add_layernorm_forward = cpu_add_layernorm_forward,
    .layernorm_backward = cpu_layernorm_backward,
    .set_precision = cpu_set_precision,
    .get_precision = cpu_get_precision,
    .to_act = cpu_to_act,
    .matmul_forward = cpu_matmul_forward,
    .matmul_backward = cpu_matmul_backward,
    .matmul_gelu_forward = cpu_matmul_gelu_forward,
    .matmul_dgelu_backward = cpu_matmul_dgelu_backward,
    .attention_state_floats = cpu_attention_state_floats,
    .attention_forward = cpu_attention_forward,
    .attention_backward = cpu_attention_backward,
    .gelu_forward = cpu_gelu_forward,
    .gelu_backward = cpu_gelu_backward,
    .add = cpu_add,
    .vocab_max = cpu_vocab_max,
    .vocab_expsum = cpu_vocab_expsum,
    .vocab_ce_finish = cpu_vocab_ce_finish,
    .cross_entropy = cpu_cross_entropy,
    .sum_squares = cpu_sum_squares,
    .adamw = cpu_adamw,
};

/* Tests only: GPTC_TEST_STAGED=1 gives a table that claims device memory, so that the
 * comm layer's host-staging path (the GPU fallback) runs, and is checked, on the CPU. */
static gptc_backend CPU_STAGED;

const gptc_backend *cpu_backend(void) {
    if (cpu_blas_init() != 0) return NULL;
    const char *staged = getenv("GPTC_TEST_STAGED");
    if (!staged || strcmp(staged, "1") != 0) return &CPU;
    CPU_STAGED = CPU;
    CPU_STAGED.name = "cpu (device memory simulated: GPTC_TEST_STAGED)";
    CPU_STAGED.on_device = 1;
    return &CPU_STAGED;
}
