/* Times gptc's causal attention kernels (engine/cuda/cuda_kernels.h) alone, so that each
 * can be set against a peer (bench_kernel_attention.py runs PyTorch's SDPA on the same
 * shapes in the same run).
 *
 *   usage: attention_bench B T NH hs fp32|bf16|both [warmup iters]   (default 3 20)
 *
 * For each precision: forward, backward and forward + backward, each timed with CUDA
 * events over `iters` calls after `warmup` untimed ones, on random inputs (fixed seed) in
 * gptc's layout (qkv [B,T,3C], heads in order). One JSON line per (precision, direction):
 * ms per call and TFLOP/s counted two ways:
 *   causal: the products a causal kernel must do, QK^T and PV over the T(T+1)/2 kept
 *     (query, key) pairs: forward 2 x 2 x B x NH x T(T+1)/2 x hs; backward 2.5x that
 *     (5 products: S recomputed, dV, dP, dQ, dK), as FlashAttention counts it.
 *   dense: the same over all T^2 pairs (4 x B x NH x T^2 x hs forward), the count that
 *     non-causal figures in the torch / FlashAttention papers use; twice the causal one.
 * The backward includes its rowsum(dout * out) step (cuda_attention_dot), as in training.
 * With GPTC_BENCH_QKV_BIAS=1 it also takes the qkv bias gradient, as training's backward
 * does: a pass of cuda_bias_backward after the kernels, or (GPTC_ATTENTION_BIAS=1, bf16)
 * the kernels' own sums.
 * Before any row is printed, out, lse and dqkv must be finite (they start as NaN, so an
 * element never written fails too). Exits 1 with one line on stderr when there is no GPU,
 * a launch fails or an output is not finite. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend.h"
#include "engine/bf16.h"
#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/cuda_internal.h"
#include "engine/cuda/cuda_kernels.h"
#include "engine/rng.h"

enum { FWD, BWD, FWD_BWD };
static const char *const DIR_NAME[3] = {"forward", "backward", "forward+backward"};

typedef struct {
    int B, T, NH, hs, C;
} shape;

/* one precision's device buffers */
typedef struct {
    gptc_precision p;
    gptc_act *qkv;  /* [B,T,3C] */
    gptc_act *out;  /* [B,T,C] */
    gptc_act *dout; /* [B,T,C] */
    gptc_act *dqkv; /* [B,T,3C] */
    float *lse;     /* [B,NH,T] */
    float *scratch; /* the backward's: rowsum(dout * out) [B,NH,T], and under bf16 with
                     * GPTC_ATTENTION_DQ=fused or atomic the dq parts
                     * (cuda_attention_bf16_scratch_floats) */
    float *dbias;   /* [3C] the qkv bias gradient (GPTC_BENCH_QKV_BIAS=1), or NULL */
} bufs;

static void *dev_alloc(size_t bytes) {
    void *p = NULL;
    cuda_check(cudaMalloc(&p, bytes), "cudaMalloc");
    return p;
}

/* The random values repeat with this prime period, a multiple of no row length: the
 * kernels' time does not depend on the values, and drawing each of the ~10^8 elements of
 * the largest shape took seconds of the benchmark's budget. */
enum { RANDN_PERIOD = 1048573 };

/* act dst[n] = std-normal values of stream key, in precision p's storage */
static gptc_act *dev_randn(size_t n, uint64_t key, gptc_precision p) {
    size_t esz = gptc_act_bytes(p);
    unsigned char *h = malloc(n * esz);                /* [n] of float or bf16 bits */
    float *period = malloc(RANDN_PERIOD * sizeof(float)); /* [RANDN_PERIOD] */
    if (!h || !period) {
        fprintf(stderr, "attention_bench: out of host memory\n");
        exit(EXIT_FAILURE);
    }
    for (size_t i = 0; i < RANDN_PERIOD; i++) period[i] = rng_normal(key, i);
    for (size_t i = 0; i < n; i++) {
        float x = period[i % RANDN_PERIOD];
        if (p == GPTC_BF16) {
            uint16_t b = bf16_bits(x);
            memcpy(h + i * esz, &b, esz);
        } else {
            memcpy(h + i * esz, &x, esz);
        }
    }
    void *d = dev_alloc(n * esz);
    cuda_check(cudaMemcpy(d, h, n * esz, cudaMemcpyHostToDevice), "cudaMemcpy");
    free(h), free(period);
    return d;
}

/* all-ones bytes: NaN as float and as bf16, so an element never written is not finite */
static void *dev_nan(size_t bytes) {
    void *d = dev_alloc(bytes);
    cuda_check(cudaMemset(d, 0xff, bytes), "cudaMemset");
    return d;
}

static bufs bufs_make(const shape *sh, gptc_precision p) {
    size_t nqkv = (size_t)sh->B * sh->T * 3 * sh->C, ny = (size_t)sh->B * sh->T * sh->C;
    size_t nlse = (size_t)sh->B * sh->NH * sh->T, esz = gptc_act_bytes(p);
    bufs b = {.p = p};
    b.qkv = dev_randn(nqkv, 1, p);
    b.dout = dev_randn(ny, 2, p);
    b.out = dev_nan(ny * esz);
    b.dqkv = dev_nan(nqkv * esz);
    b.lse = dev_nan(nlse * sizeof(float));
    size_t nscratch =
        p == GPTC_BF16 ? cuda_attention_bf16_scratch_floats(sh->B, sh->T, sh->C, sh->NH) : nlse;
    b.scratch = dev_nan(nscratch * sizeof(float));
    const char *bias = getenv("GPTC_BENCH_QKV_BIAS");
    if (bias && atoi(bias) == 1) {
        b.dbias = dev_alloc(3 * (size_t)sh->C * sizeof(float));
        cuda_check(cudaMemset(b.dbias, 0, 3 * (size_t)sh->C * sizeof(float)), "cudaMemset");
    }
    return b;
}

static void bufs_free(bufs *b) {
    void *all[7] = {b->qkv, b->out, b->dout, b->dqkv, b->lse, b->scratch, b->dbias};
    for (int i = 0; i < 7; i++)
        if (all[i]) cuda_check(cudaFree(all[i]), "cudaFree");
}

static void launch(int dir, const bufs *b, const shape *sh, cudaStream_t s) {
    int B = sh->B, T = sh->T, C = sh->C, NH = sh->NH;
    if (dir != BWD) {
        if (b->p == GPTC_BF16)
            cuda_attention_forward_bf16(b->out, b->lse, b->qkv, B, T, C, NH, s);
        else
            cuda_attention_forward(b->out, b->lse, b->qkv, B, T, C, NH, s);
    }
    if (dir != FWD) {
        if (b->p == GPTC_BF16)
            cuda_attention_backward_bf16(b->dqkv, b->dbias, b->scratch, b->dout, b->out, b->qkv,
                                         b->lse, B, T, C, NH, s);
        else
            cuda_attention_backward(b->dqkv, b->scratch, b->dout, b->out, b->qkv, b->lse, B, T,
                                    C, NH, s);
        if (b->p != GPTC_BF16 && b->dbias) /* as the op table does in fp32 */
            cuda_bias_backward(b->dbias, b->dqkv, B * T, 3 * C, GPTC_FP32, s);
    }
}

/* exits with one line when a launch of this thread or the stream's work failed */
static void check_stream(cudaStream_t s, const char *what) {
    int rc = cuda_check_launch();
    if (rc != 0) {
        fprintf(stderr, "attention_bench: %s: launch failed: %s\n", what,
                cudaGetErrorString((cudaError_t)rc));
        exit(EXIT_FAILURE);
    }
    cuda_check(cudaStreamSynchronize(s), what);
}

/* mean ms per call of direction dir over iters calls, after warmup untimed ones */
static double time_dir(int dir, const bufs *b, const shape *sh, int warmup, int iters,
                       cudaStream_t s) {
    cudaEvent_t e0, e1;
    cuda_check(cudaEventCreate(&e0), "cudaEventCreate");
    cuda_check(cudaEventCreate(&e1), "cudaEventCreate");
    for (int i = 0; i < warmup; i++) launch(dir, b, sh, s);
    check_stream(s, DIR_NAME[dir]);
    cuda_check(cudaEventRecord(e0, s), "cudaEventRecord");
    for (int i = 0; i < iters; i++) launch(dir, b, sh, s);
    cuda_check(cudaEventRecord(e1, s), "cudaEventRecord");
    check_stream(s, DIR_NAME[dir]);
    float ms = 0;
    cuda_check(cudaEventElapsedTime(&ms, e0, e1), "cudaEventElapsedTime");
    cuda_check(cudaEventDestroy(e0), "cudaEventDestroy");
    cuda_check(cudaEventDestroy(e1), "cudaEventDestroy");
    return (double)ms / iters;
}

/* the number of elements of act buffer d[n] that are not finite */
static size_t count_nonfinite_act(const gptc_act *d, size_t n, gptc_precision p) {
    size_t esz = gptc_act_bytes(p), bad = 0;
    unsigned char *h = malloc(n * esz); /* [n] of float or bf16 bits */
    if (!h) {
        fprintf(stderr, "attention_bench: out of host memory\n");
        exit(EXIT_FAILURE);
    }
    cuda_check(cudaMemcpy(h, d, n * esz, cudaMemcpyDeviceToHost), "cudaMemcpy");
    for (size_t i = 0; i < n; i++) {
        float x;
        if (p == GPTC_BF16) {
            uint16_t u;
            memcpy(&u, h + i * esz, esz);
            x = bf16_to_float(u);
        } else {
            memcpy(&x, h + i * esz, esz);
        }
        bad += !isfinite(x);
    }
    free(h);
    return bad;
}

/* TFLOP/s of flops in ms; 0 for a time too short to measure (inf is no JSON number) */
static double tflops(double flops, double ms) { return ms > 0 ? flops / (ms * 1e9) : 0; }

static int run_precision(gptc_precision p, const shape *sh, int warmup, int iters,
                         cudaStream_t s, const char *gpu) {
    const char *pname = p == GPTC_BF16 ? "bf16" : "fp32";
    bufs b = bufs_make(sh, p);
    double ms[3];
    for (int dir = FWD; dir <= FWD_BWD; dir++) ms[dir] = time_dir(dir, &b, sh, warmup, iters, s);
    /* the last call was a forward + backward: every output is current */
    size_t nqkv = (size_t)sh->B * sh->T * 3 * sh->C, ny = (size_t)sh->B * sh->T * sh->C;
    size_t nlse = (size_t)sh->B * sh->NH * sh->T;
    size_t bad_out = count_nonfinite_act(b.out, ny, p);
    size_t bad_dqkv = count_nonfinite_act(b.dqkv, nqkv, p);
    size_t bad_lse = count_nonfinite_act(b.lse, nlse, GPTC_FP32);
    size_t nb = b.dbias ? 3 * (size_t)sh->C : 0;
    size_t bad_bias = nb ? count_nonfinite_act(b.dbias, nb, GPTC_FP32) : 0;
    bufs_free(&b);
    if (bad_out || bad_dqkv || bad_lse || bad_bias) {
        fprintf(stderr, "attention_bench: %s: non-finite outputs: out %zu of %zu, lse %zu of %zu, "
                "dqkv %zu of %zu, dbias %zu of %zu\n", pname, bad_out, ny, bad_lse, nlse,
                bad_dqkv, nqkv, bad_bias, nb);
        return 1;
    }
    double bh = (double)sh->B * sh->NH * sh->hs, T = sh->T;
    double fwd_causal = 2.0 * 2.0 * bh * T * (T + 1) / 2, fwd_dense = 2.0 * 2.0 * bh * T * T;
    static const double FACTOR[3] = {1.0, 2.5, 3.5}; /* of the forward's FLOPs */
    for (int dir = FWD; dir <= FWD_BWD; dir++) {
        double fc = FACTOR[dir] * fwd_causal, fd = FACTOR[dir] * fwd_dense;
        printf("{\"impl\": \"gptc\", \"gpu\": \"%s\", \"precision\": \"%s\", "
               "\"direction\": \"%s\", \"B\": %d, \"T\": %d, \"NH\": %d, \"hs\": %d, "
               "\"layout\": \"qkv[B,T,3C]\", \"warmup\": %d, \"iters\": %d, \"ms\": %.5f, "
               "\"flops_causal\": %.6e, \"flops_dense\": %.6e, \"tflops_causal\": %.4g, "
               "\"tflops_dense\": %.4g, \"finite\": true}\n",
               gpu, pname, DIR_NAME[dir], sh->B, sh->T, sh->NH, sh->hs, warmup, iters, ms[dir],
               fc, fd, tflops(fc, ms[dir]), tflops(fd, ms[dir]));
    }
    fflush(stdout);
    return 0;
}

static int parse_pos(const char *s, const char *what, int min) {
    char *end;
    long v = strtol(s, &end, 10);
    if (*end || v < min || v > (1L << 24)) {
        fprintf(stderr, "attention_bench: %s = '%s': want an integer >= %d\n", what, s, min);
        exit(2);
    }
    return (int)v;
}

int main(int argc, char **argv) {
    if (argc != 6 && argc != 8) {
        fprintf(stderr, "usage: attention_bench B T NH hs fp32|bf16|both [warmup iters]\n");
        return 2;
    }
    shape sh = {.B = parse_pos(argv[1], "B", 1), .T = parse_pos(argv[2], "T", 1),
                .NH = parse_pos(argv[3], "NH", 1), .hs = parse_pos(argv[4], "hs", 1)};
    sh.C = sh.NH * sh.hs;
    const char *prec = argv[5];
    int fp32 = !strcmp(prec, "fp32") || !strcmp(prec, "both");
    int bf16 = !strcmp(prec, "bf16") || !strcmp(prec, "both");
    if (!fp32 && !bf16) {
        fprintf(stderr, "attention_bench: precision '%s': want fp32, bf16 or both\n", prec);
        return 2;
    }
    int warmup = argc == 8 ? parse_pos(argv[6], "warmup", 0) : 3;
    int iters = argc == 8 ? parse_pos(argv[7], "iters", 1) : 20;

    char err[256];
    if (!cuda_backend(0, err, sizeof err)) {
        fprintf(stderr, "attention_bench: %s\n", err);
        return 1;
    }
    struct cudaDeviceProp prop; /* "struct": the runtime header names no typedef for C */
    cuda_check(cudaGetDeviceProperties(&prop, cuda_backend_device()), "cudaGetDeviceProperties");
    /* the name goes into JSON: keep it free of quotes and backslashes */
    char gpu[sizeof prop.name];
    snprintf(gpu, sizeof gpu, "%s", prop.name);
    for (char *c = gpu; *c; c++)
        if (*c == '"' || *c == '\\' || (unsigned char)*c < 0x20) *c = '_';
    cudaStream_t s = cuda_stream_of(NULL);
    int rc = 0;
    if (fp32) rc |= run_precision(GPTC_FP32, &sh, warmup, iters, s, gpu);
    if (bf16) rc |= run_precision(GPTC_BF16, &sh, warmup, iters, s, gpu);
    return rc;
}
