/* The bf16 attention's choices, made on the host: which variant runs (environment
 * variables, checked at the backend's start), the shared memory each kernel takes, and
 * whether a head size has kernels. The kernels: attention_bf16_fwd.cu and
 * attention_bf16_bwd.cu; their scheme: attention_bf16.cuh. */
#include "engine/cuda/attention_bf16.cuh"

#include <stdio.h>
#include <string.h>

/* bytes of a [64][hs] tile */
size_t ab_tile_bytes(int hs) { return (size_t)AB_TILE * ab_pitch(hs) * sizeof(uint16_t); }

/* mt query tiles and two stages of a key and a value tile (wide: of two each) */
static size_t ab_fwd_smem(int hs, int mt, int wide) {
    return (size_t)(mt + (wide ? 8 : 4)) * ab_tile_bytes(hs);
}

/* 1 when the environment variable name is set to value: the variants below are chosen
 * this way, so that a benchmark compares them in one build */
static int ab_env_is(const char *name, const char *value) {
    const char *v = getenv(name);
    return v && strcmp(v, value) == 0;
}

/* The forward at hs 64: GPTC_ATTENTION_FWD=pipelined, attn_fwd_pipe; GPTC_ATTENTION_FWD=wide,
 * attn_fwd_wide (128 queries by 128 keys); else the plain kernel with two m-tiles a warp
 * (a block of 128 queries), or with GPTC_ATTENTION_FWD_ROWS=64 one m-tile. 128 rows are the
 * default since an H100 run (2026-11-27, benchmarks/gpu/results/2026-11-27-h100-run3.md):
 * level with 64 alone (0.338 against 0.337 ms at B 32, 0.090 against 0.092 at B 8), part of
 * the pair that took GPT-2 124M to 45.5% MFU. Any other head size: the plain kernel. */
ab_fwd_kind ab_fwd_variant(int hs) {
    if (hs != 64) return AB_FWD_PLAIN;
    if (ab_env_is("GPTC_ATTENTION_FWD", "pipelined")) return AB_FWD_PIPE;
    if (ab_env_is("GPTC_ATTENTION_FWD", "wide")) return AB_FWD_WIDE;
    if (ab_env_is("GPTC_ATTENTION_FWD_ROWS", "64")) return AB_FWD_PLAIN;
    return AB_FWD_ROWS128;
}

/* m-tiles a warp of the forward takes (a block's queries: 64 of them each) */
int ab_fwd_mt(int hs) {
    ab_fwd_kind k = ab_fwd_variant(hs);
    return k == AB_FWD_ROWS128 || k == AB_FWD_WIDE ? 2 : 1;
}

/* the forward's shared memory at head size hs, for the variant that runs */
size_t ab_fwd_smem_now(int hs) {
    return ab_fwd_smem(hs, ab_fwd_mt(hs), ab_fwd_variant(hs) == AB_FWD_WIDE);
}

/* 1 when the backward kernels add the qkv bias gradient while they hold dqkv (the
 * default), 0 with GPTC_ATTENTION_BIAS=0: one pass of cuda_bias_backward over dqkv after
 * them. On since an H100 run (2026-11-27, 2026-11-27-h100-run3.md): the backward with the
 * bias 0.898 ms against 1.044 with the pass (B 32, hs 64), a GPT-2 124M step 1.019x faster,
 * though its hs 64 dk/dv kernel spills more. */
int ab_bias_fused(void) { return !ab_env_is("GPTC_ATTENTION_BIAS", "0"); }

/* Where dq comes from (hs 64 with two stages only; every sm_80 and later has the shared
 * memory), instead of the dq kernel recomputing S, dP and dS (AB_DQ_KERNEL), so that a
 * tile pair takes 5 products instead of 7:
 *   - AB_DQ_PARTS (GPTC_ATTENTION_DQ=fused): the dk/dv kernel stores each pair's part and
 *     attention_bf16_dq_sum_kernel adds them in key order (deterministic), for a pass
 *     over the parts (fp32, about T / 128 times dq's size, written once and read once:
 *     at T 1024 about 17 times dq's bytes each way);
 *   - AB_DQ_ATOMIC (GPTC_ATTENTION_DQ=atomic): the dk/dv kernel adds each pair's part
 *     into one fp32 dq by atomics (8-byte reductions on sm_90, mostly in L2), which the
 *     same kernel then rounds: twice dq's fp32 bytes of traffic and a zeroing, but the
 *     sum's order is the order the blocks ran in, as flash attention 2's dq.
 * Off by default until a GPU run says which is fastest; the benchmarks compare all three. */
ab_dq_kind ab_dq_mode(int hs, int nst) {
    if (hs != 64 || nst != 2) return AB_DQ_KERNEL;
    if (ab_env_is("GPTC_ATTENTION_DQ", "fused")) return AB_DQ_PARTS;
    if (ab_env_is("GPTC_ATTENTION_DQ", "atomic")) return AB_DQ_ATOMIC;
    return AB_DQ_KERNEL;
}

/* nst: stages of the streamed tiles; fuse_dq: with the dS^T tile of a fused dq (ab_dq_mode) */
size_t ab_dkdv_smem(int hs, int nst, int fuse_dq) {
    return (2 + 2 * (size_t)nst) * ab_tile_bytes(hs) + 2 * (size_t)nst * AB_TILE * sizeof(float) +
           (fuse_dq ? (size_t)AB_TILE * AB_DS_PITCH * sizeof(uint16_t) : 0);
}

size_t ab_dq_smem(int hs, int nst) {
    return (2 + 2 * (size_t)nst) * ab_tile_bytes(hs) + 2 * AB_TILE * sizeof(float);
}

/* stages of the backward's streamed tiles at head size hs on a device that allows optin
 * bytes a block: 2 where they fit (dk/dv needs at least what dq does), else 1 (the lean
 * kernels) */
int ab_bwd_stages(int hs, size_t optin) {
    return ab_dkdv_smem(hs, 2, 0) <= optin ? 2 : 1;
}

/* 1 when bf16 buffers a and b (either may be NULL) allow load_tile's 16-byte cp.async:
 * every tile row starts a multiple of 8 elements in (C and hs are multiples of 8), so
 * 16-byte aligned bases are enough */
int ab_vec(const void *a, const void *b) {
    return ((uintptr_t)a & 15u) == 0 && ((uintptr_t)b & 15u) == 0;
}

/* 1 when a kernel exists for the head size: C = NH * hs, hs a multiple of 8 up to 128
 * (the 16-byte rows of ldmatrix and cp.async); otherwise the launch is refused
 * (cuda_refuse) */
int ab_shape_ok(int C, int NH, cudaStream_t s) {
    if (NH > 0 && C > 0 && C % NH == 0 && C / NH % 8 == 0 && C / NH <= AB_MAX_HS) return 1;
    cuda_refuse(s, "no bf16 attention kernel for C = %d over %d heads (head sizes: multiples "
                "of 8 up to 128)", C, NH);
    return 0;
}

/* what[80] = "the bf16 attention forward at head size 64", as a refusal names a kernel */
const char *ab_what(char *what, const char *role, int hs) {
    snprintf(what, 80, "the bf16 attention %s at head size %d", role, hs);
    return what;
}

/* The variant variables above and the values they take (the first, "", is unset) */
static const struct {
    const char *name, *values[4];
} ab_env_vars[] = {
    {"GPTC_ATTENTION_FWD", {"", "plain", "pipelined", "wide"}},
    {"GPTC_ATTENTION_FWD_ROWS", {"", "64", "128", NULL}},
    {"GPTC_ATTENTION_DQ", {"", "kernel", "fused", "atomic"}},
    {"GPTC_ATTENTION_BIAS", {"", "0", "1", NULL}},
};

extern "C" {

int cuda_attention_bf16_check_env(char *err, size_t errlen) {
    for (size_t i = 0; i < sizeof ab_env_vars / sizeof ab_env_vars[0]; i++) {
        const char *v = getenv(ab_env_vars[i].name);
        if (!v) continue;
        int known = 0;
        char choices[64] = "";
        for (int j = 0; j < 4 && ab_env_vars[i].values[j]; j++) {
            known |= strcmp(v, ab_env_vars[i].values[j]) == 0;
            if (j > 0)
                snprintf(choices + strlen(choices), sizeof choices - strlen(choices), "%s%s",
                         j > 1 ? ", " : "", ab_env_vars[i].values[j]);
        }
        if (!known) {
            snprintf(err, errlen, "%s = %s: give one of %s (or leave it unset)",
                     ab_env_vars[i].name, v, choices);
            return -1;
        }
    }
    return 0;
}

size_t cuda_attention_bf16_smem(int hs) {
    int nst = ab_bwd_stages(hs, (size_t)cuda_smem_optin());
    size_t need = ab_fwd_smem_now(hs);
    size_t kv = ab_dkdv_smem(hs, nst, ab_dq_mode(hs, nst) != AB_DQ_KERNEL);
    if (kv > need) need = kv;
    if (ab_dq_smem(hs, nst) > need) need = ab_dq_smem(hs, nst);
    return need;
}

const char *cuda_attention_bf16_fwd_name(int hs) {
    static const char *const names[] = {"plain", "rows128", "pipelined", "wide"};
    return names[ab_fwd_variant(hs)];
}

const char *cuda_attention_bf16_dq_name(int hs) {
    static const char *const names[] = {"kernel", "fused", "atomic"};
    return names[ab_dq_mode(hs, ab_bwd_stages(hs, (size_t)cuda_smem_optin()))];
}

int cuda_attention_bf16_bias_fused(void) { return ab_bias_fused(); }

} /* extern "C" */
