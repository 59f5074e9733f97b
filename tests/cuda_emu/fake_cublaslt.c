/* Test tool, not part of the engine: a fake cuBLASLt (cublasLt.h of tests/cuda_emu) for
 * gptc-train-emu, so that engine/cuda/cuda_matmul.c's mapping of row-major products onto
 * a column-major library is checked against the CPU backend's OpenBLAS products.
 *
 * cublasLtMatmul computes, as cuBLASLt defines it, everything column-major:
 *     D = alpha * op(A) @ op(B) + beta * C   (+ bias[i] on every column j: EPILOGUE_BIAS)
 * and with the GELU epilogues, as this fake assumes the real library defines them (the
 * tanh approximation, as gptc's GELU; a GPU run of test_cuda_ops shows whether it does):
 *     GELU_AUX(_BIAS): aux = that sum, D = gelu(aux);  DGELU: D = that sum * gelu'(aux),
 * aux being an m x n matrix with leading dimension EPILOGUE_AUX_LD (a multiple of 8).
 * where op(X) is X, or its transpose when the descriptor's TRANSA / TRANSB is
 * CUBLAS_OP_T; a layout (rows, cols, ld) describes the matrix as stored, before op:
 * element (i, j) lies at X[i + j * ld]. op(A) is m x k, op(B) k x n, C and D m x n.
 *
 * Types: every matrix is read as the type of its layout (CUDA_R_32F, or CUDA_R_16BF: the
 * upper half of a float), the bias as BIAS_DATA_TYPE and the aux matrix as
 * EPILOGUE_AUX_DATA_TYPE (both default to D's type, as in cuBLASLt). The sum runs over
 * l = 0..k-1 in that order, in double (sizes are small: it stands for the GPU's fp32
 * accumulator, which differs only by rounding and order), and is rounded to float once;
 * alpha, beta * C and the bias are added and the GELU or GELU' is applied to that fp32
 * value, which is then stored: a bf16 D or aux rounded once (to nearest even,
 * engine/bf16.h), as the real epilogue rounds on store. With beta = 0, C is not read, as
 * cuBLASLt does not read it. The product runs in the stream's order on the stream's thread
 * (fake_runtime.c); alpha, beta and the descriptor's attributes (the bias pointer
 * included) are read when cublasLtMatmul is called, as the real library reads them.
 *
 * Checked, each refused with a line on stderr and the status the real library would
 * give (or INVALID_VALUE): attribute sizes and values; CUBLAS_COMPUTE_32F (strict) with
 * CUDA_R_32F scales only (TF32 and the fast modes are not emulated); the type
 * combinations of cuBLASLt's table for that compute type, of which only these are
 * emulated: A, B, C, D all CUDA_R_32F; or A, B CUDA_R_16BF with C = D of CUDA_R_16BF or
 * CUDA_R_32F (mixed A and B, fp32 operands into a bf16 D and C unlike D are refused, as
 * cuBLASLt refuses them); a bias and an aux matrix of D's type; ld >= rows;
 * shapes of A, B, C and D that agree with the transposes; every matrix, the bias and the
 * workspace inside one device (or pinned) allocation over the whole extent the product
 * reads or writes; D not overlapping A, B or the bias; an in-place C == D with the same
 * layout; pointers aligned as the preference promised when the algorithm was chosen
 * (the real library picks vectorised kernels by that promise); a bias pointer with the
 * BIAS epilogue; an algorithm that came from cublasLtMatmulAlgoGetHeuristic.
 *
 * The heuristic hands out one algorithm, or with GPTC_EMU_LT_CANDIDATES = n up to n
 * (as many as asked for), which all compute alike; GPTC_EMU_LT_SLOW_FIRST = 1 makes the
 * first of them take 3 ms longer per product, so that a caller that times the
 * candidates (cuda_matmul.c's GPTC_GEMM_CANDIDATES) must pick another. */
#include "cublasLt.h"
#include "emu_internal.h"
#include "engine/bf16.h"
#include "engine/cuda/cublaslt_api.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { HANDLE_MAGIC = 0x4c544844, DESC_MAGIC = 0x4c544453, LAYOUT_MAGIC = 0x4c544c59,
       PREF_MAGIC = 0x4c545046, ALGO_MAGIC = 0x414c474f };

struct cublasLtContext {
    unsigned int magic;
};

struct cublasLtMatmulDescOpaque_st {
    unsigned int magic;
    cublasComputeType_t compute;
    cudaDataType_t scale;
    int32_t pointer_mode;
    int32_t transa, transb;
    uint32_t epilogue;
    const void *bias;
    const void *aux;
    int64_t aux_ld;
    int32_t bias_type, aux_type; /* cudaDataType; -1: D's type */
};

struct cublasLtMatrixLayoutOpaque_st {
    unsigned int magic;
    cudaDataType type;
    uint64_t rows, cols;
    int64_t ld;
};

struct cublasLtMatmulPreferenceOpaque_st {
    unsigned int magic;
    uint64_t max_workspace;
    uint32_t align[4]; /* A, B, C, D: the alignment the caller promises; 0: none */
};

static cublasStatus_t refuse(cublasStatus_t st, const char *call, const char *why) {
    fprintf(stderr, "cuda_emu (cuBLASLt): %s: %s\n", call, why);
    fflush(stderr);
    return st;
}

const char *emu_cublasLtGetStatusString(cublasStatus_t status) {
    switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    }
    return "CUBLAS_STATUS_UNKNOWN";
}

/* ------------------------------------------------------------------ handles */

/* a version of its own, so that a GPTC_GEMM_CACHE line written here names it */
size_t emu_cublasLtGetVersion(void) { return 1; }

cublasStatus_t emu_cublasLtCreate(cublasLtHandle_t *handle) {
    struct cublasLtContext *h = malloc(sizeof *h);
    if (!h) return CUBLAS_STATUS_ALLOC_FAILED;
    h->magic = HANDLE_MAGIC;
    *handle = h;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t emu_cublasLtDestroy(cublasLtHandle_t handle) {
    if (!handle || handle->magic != HANDLE_MAGIC) return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->magic = 0;
    free(handle);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t emu_cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *desc, cublasComputeType_t computeType,
                                            cudaDataType_t scaleType) {
    if (computeType != CUBLAS_COMPUTE_32F || scaleType != CUDA_R_32F)
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "cublasLtMatmulDescCreate",
                      "only CUBLAS_COMPUTE_32F with CUDA_R_32F scales is emulated");
    struct cublasLtMatmulDescOpaque_st *d = calloc(1, sizeof *d);
    if (!d) return CUBLAS_STATUS_ALLOC_FAILED;
    d->magic = DESC_MAGIC;
    d->compute = computeType;
    d->scale = scaleType;
    d->transa = d->transb = CUBLAS_OP_N;
    d->epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    d->bias_type = d->aux_type = -1;
    *desc = d;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t emu_cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
    if (!desc) return CUBLAS_STATUS_SUCCESS;
    if (desc->magic != DESC_MAGIC)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulDescDestroy", "not a live descriptor");
    desc->magic = 0;
    free(desc);
    return CUBLAS_STATUS_SUCCESS;
}

/* Copies the attribute's value, which must be exactly `want` bytes. */
static cublasStatus_t take(void *dst, size_t want, const void *buf, size_t size, const char *name) {
    char why[128];
    if (!buf || size != want) {
        snprintf(why, sizeof why, "%s takes %zu bytes, given %zu", name, want, size);
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulDescSetAttribute", why);
    }
    memcpy(dst, buf, want);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t emu_cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d,
                                                  cublasLtMatmulDescAttributes_t attr,
                                                  const void *buf, size_t size) {
    const char *call = "cublasLtMatmulDescSetAttribute";
    if (!d || d->magic != DESC_MAGIC) return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "not a live descriptor");
    cublasStatus_t st;
    int32_t v32;
    switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
    case CUBLASLT_MATMUL_DESC_TRANSB:
        if ((st = take(&v32, sizeof v32, buf, size, "TRANSA/TRANSB")) != CUBLAS_STATUS_SUCCESS) return st;
        if (v32 != CUBLAS_OP_N && v32 != CUBLAS_OP_T)
            return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "TRANSA/TRANSB must be CUBLAS_OP_N or CUBLAS_OP_T");
        if (attr == CUBLASLT_MATMUL_DESC_TRANSA) d->transa = v32;
        else d->transb = v32;
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_EPILOGUE: {
        uint32_t e;
        if ((st = take(&e, sizeof e, buf, size, "EPILOGUE")) != CUBLAS_STATUS_SUCCESS) return st;
        if (e != CUBLASLT_EPILOGUE_DEFAULT && e != CUBLASLT_EPILOGUE_BIAS && e != CUBLASLT_EPILOGUE_GELU_AUX &&
            e != CUBLASLT_EPILOGUE_GELU_AUX_BIAS && e != CUBLASLT_EPILOGUE_DGELU)
            return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call,
                          "only the DEFAULT, BIAS, GELU_AUX(_BIAS) and DGELU epilogues are emulated");
        d->epilogue = e;
        return CUBLAS_STATUS_SUCCESS;
    }
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
        return take(&d->bias, sizeof d->bias, buf, size, "BIAS_POINTER");
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER:
        return take(&d->aux, sizeof d->aux, buf, size, "EPILOGUE_AUX_POINTER");
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD:
        if ((st = take(&d->aux_ld, sizeof d->aux_ld, buf, size, "EPILOGUE_AUX_LD")) != CUBLAS_STATUS_SUCCESS)
            return st;
        if (d->aux_ld <= 0 || d->aux_ld % 8 != 0)
            return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "EPILOGUE_AUX_LD must be a positive multiple of 8");
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_POINTER_MODE:
        if ((st = take(&v32, sizeof v32, buf, size, "POINTER_MODE")) != CUBLAS_STATUS_SUCCESS) return st;
        if (v32 != 0) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call, "only host scalars are emulated");
        d->pointer_mode = v32;
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE:
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE:
        if ((st = take(&v32, sizeof v32, buf, size, "COMPUTE_TYPE/SCALE_TYPE")) != CUBLAS_STATUS_SUCCESS)
            return st;
        if (attr == CUBLASLT_MATMUL_DESC_SCALE_TYPE ? v32 != (int32_t)CUDA_R_32F
                : v32 != (int32_t)CUBLAS_COMPUTE_32F)
            return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call,
                          "only CUBLAS_COMPUTE_32F with CUDA_R_32F scales is emulated");
        if (attr == CUBLASLT_MATMUL_DESC_COMPUTE_TYPE) d->compute = (cublasComputeType_t)v32;
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE:
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE:
        if ((st = take(&v32, sizeof v32, buf, size, "BIAS_DATA_TYPE/EPILOGUE_AUX_DATA_TYPE")) !=
            CUBLAS_STATUS_SUCCESS)
            return st;
        if (v32 != (int32_t)CUDA_R_32F && v32 != (int32_t)CUDA_R_16BF)
            return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call,
                          "only CUDA_R_32F and CUDA_R_16BF biases and aux matrices are emulated");
        if (attr == CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE) d->bias_type = v32;
        else d->aux_type = v32;
        return CUBLAS_STATUS_SUCCESS;
    default:
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call, "an attribute the fake does not know");
    }
}

cublasStatus_t emu_cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *layout, cudaDataType type,
                                              uint64_t rows, uint64_t cols, int64_t ld) {
    const char *call = "cublasLtMatrixLayoutCreate";
    char why[160];
    if (type != CUDA_R_32F && type != CUDA_R_16BF)
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call, "only CUDA_R_32F and CUDA_R_16BF are emulated");
    if (ld < 1 || (uint64_t)ld < rows) {
        snprintf(why, sizeof why, "column-major %llu x %llu with ld %lld: ld must be >= rows",
                 (unsigned long long)rows, (unsigned long long)cols, (long long)ld);
        return refuse(CUBLAS_STATUS_INVALID_VALUE, call, why);
    }
    struct cublasLtMatrixLayoutOpaque_st *l = malloc(sizeof *l);
    if (!l) return CUBLAS_STATUS_ALLOC_FAILED;
    *l = (struct cublasLtMatrixLayoutOpaque_st){LAYOUT_MAGIC, type, rows, cols, ld};
    *layout = l;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t emu_cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
    if (!layout) return CUBLAS_STATUS_SUCCESS;
    if (layout->magic != LAYOUT_MAGIC)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatrixLayoutDestroy", "not a live layout");
    layout->magic = 0;
    free(layout);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t emu_cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref) {
    struct cublasLtMatmulPreferenceOpaque_st *p = calloc(1, sizeof *p);
    if (!p) return CUBLAS_STATUS_ALLOC_FAILED;
    p->magic = PREF_MAGIC;
    *pref = p;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t emu_cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
    if (!pref) return CUBLAS_STATUS_SUCCESS;
    if (pref->magic != PREF_MAGIC)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulPreferenceDestroy", "not a live preference");
    pref->magic = 0;
    free(pref);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t emu_cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                        cublasLtMatmulPreferenceAttributes_t attr,
                                                        const void *buf, size_t size) {
    const char *call = "cublasLtMatmulPreferenceSetAttribute";
    if (!p || p->magic != PREF_MAGIC) return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "not a live preference");
    switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
        if (!buf || size != sizeof(uint64_t))
            return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "MAX_WORKSPACE_BYTES takes 8 bytes");
        memcpy(&p->max_workspace, buf, sizeof(uint64_t));
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: {
        uint32_t a;
        if (!buf || size != sizeof a)
            return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "MIN_ALIGNMENT_*_BYTES takes 4 bytes");
        memcpy(&a, buf, sizeof a);
        if (a & (a - 1)) return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "an alignment that is not a power of two");
        p->align[attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES] = a;
        return CUBLAS_STATUS_SUCCESS;
    }
    case CUBLASLT_MATMUL_PREF_SEARCH_MODE:
        return CUBLAS_STATUS_SUCCESS;
    default:
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call, "an attribute the fake does not know");
    }
}

/* ------------------------------------------------------------------ the problem */

typedef struct {
    int ta, tb;
    uint64_t m, n, k;
} problem;

static int layout_ok(cublasLtMatrixLayout_t l) { return l && l->magic == LAYOUT_MAGIC; }

/* The shapes as cuBLASLt reads them: 0, or -1 with why. */
static int shape_of(cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t A, cublasLtMatrixLayout_t B,
                    cublasLtMatrixLayout_t C, cublasLtMatrixLayout_t D, problem *p, char *why, size_t n) {
    if (!d || d->magic != DESC_MAGIC) {
        snprintf(why, n, "not a live matmul descriptor");
        return -1;
    }
    if (!layout_ok(A) || !layout_ok(B) || !layout_ok(C) || !layout_ok(D)) {
        snprintf(why, n, "a layout that is not live");
        return -1;
    }
    p->ta = d->transa == CUBLAS_OP_T;
    p->tb = d->transb == CUBLAS_OP_T;
    p->m = p->ta ? A->cols : A->rows;
    p->k = p->ta ? A->rows : A->cols;
    uint64_t kb = p->tb ? B->cols : B->rows;
    p->n = p->tb ? B->rows : B->cols;
    if (kb != p->k || C->rows != p->m || C->cols != p->n || D->rows != p->m || D->cols != p->n) {
        snprintf(why, n, "shapes disagree: op(A) is %llu x %llu (A %llu x %llu, %s), op(B) %llu x %llu "
                 "(B %llu x %llu, %s), C %llu x %llu, D %llu x %llu",
                 (unsigned long long)p->m, (unsigned long long)p->k, (unsigned long long)A->rows,
                 (unsigned long long)A->cols, p->ta ? "T" : "N", (unsigned long long)kb,
                 (unsigned long long)p->n, (unsigned long long)B->rows, (unsigned long long)B->cols,
                 p->tb ? "T" : "N", (unsigned long long)C->rows, (unsigned long long)C->cols,
                 (unsigned long long)D->rows, (unsigned long long)D->cols);
        return -1;
    }
    return 0;
}

static const char *type_name(int32_t t) {
    return t == CUDA_R_32F ? "CUDA_R_32F" : t == CUDA_R_16BF ? "CUDA_R_16BF" : "another type";
}

/* The bias's and the aux matrix's types (their defaults resolved to D's) */
static int32_t bias_type(cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t D) {
    return d->bias_type < 0 ? (int32_t)D->type : d->bias_type;
}
static int32_t aux_type(cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t D) {
    return d->aux_type < 0 ? (int32_t)D->type : d->aux_type;
}

/* The type combination is one cuBLASLt runs (and this fake emulates) with
 * CUBLAS_COMPUTE_32F: 0, or -1 with why. */
static int types_ok(cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t A, cublasLtMatrixLayout_t B,
                    cublasLtMatrixLayout_t C, cublasLtMatrixLayout_t D, char *why, size_t n) {
    int ok = A->type == B->type && C->type == D->type &&
             (A->type == CUDA_R_32F ? D->type == CUDA_R_32F
                                    : D->type == CUDA_R_16BF || D->type == CUDA_R_32F);
    if (!ok) {
        snprintf(why, n, "A %s, B %s, C %s, D %s: not a combination cuBLASLt runs with "
                 "CUBLAS_COMPUTE_32F (or not emulated)", type_name(A->type), type_name(B->type),
                 type_name(C->type), type_name(D->type));
        return -1;
    }
    if (bias_type(d, D) != (int32_t)D->type) {
        snprintf(why, n, "a %s bias with a %s D (the bias takes D's type)",
                 type_name(bias_type(d, D)), type_name(D->type));
        return -1;
    }
    if (aux_type(d, D) != (int32_t)D->type) {
        snprintf(why, n, "a %s aux matrix with a %s D (the GELU aux takes D's type)",
                 type_name(aux_type(d, D)), type_name(D->type));
        return -1;
    }
    return 0;
}

/* the types of A, C, D, the bias and the aux matrix in one word, for the algorithm */
static uint64_t types_word(cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t A,
                           cublasLtMatrixLayout_t C, cublasLtMatrixLayout_t D) {
    return (uint64_t)A->type | (uint64_t)C->type << 8 | (uint64_t)D->type << 16 |
           (uint64_t)bias_type(d, D) << 24 | (uint64_t)aux_type(d, D) << 32;
}

/* What cublasLtMatmulAlgoGetHeuristic hands out: it remembers the promise it was made
 * (the preference's alignments) and the problem it was chosen for. */
enum { ALGO_TA, ALGO_TB, ALGO_M, ALGO_N, ALGO_K };
enum { ALGO_INDEX_SHIFT = 8 }; /* data[6]: the candidate's index above the transposes */

cublasStatus_t emu_cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t h, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t A, cublasLtMatrixLayout_t B,
    cublasLtMatrixLayout_t C, cublasLtMatrixLayout_t D, cublasLtMatmulPreference_t pref,
    int requested, cublasLtMatmulHeuristicResult_t results[], int *returned) {
    const char *call = "cublasLtMatmulAlgoGetHeuristic";
    char why[512];
    problem p;
    *returned = 0;
    if (!h || h->magic != HANDLE_MAGIC) return refuse(CUBLAS_STATUS_NOT_INITIALIZED, call, "not a live handle");
    if (!pref || pref->magic != PREF_MAGIC) return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "not a live preference");
    if (requested < 1) return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "requestedAlgoCount < 1");
    if (shape_of(d, A, B, C, D, &p, why, sizeof why) != 0) return refuse(CUBLAS_STATUS_INVALID_VALUE, call, why);
    if (types_ok(d, A, B, C, D, why, sizeof why) != 0) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call, why);
    /* GPTC_EMU_LT_NO_GELU=1: no algorithm has the GELU epilogues, as cuBLASLt answers for
     * a type or shape it has no such kernel for (NOT_SUPPORTED, nothing returned) */
    const char *e = getenv("GPTC_EMU_LT_NO_GELU");
    if (e && strcmp(e, "1") == 0 &&
        (d->epilogue == CUBLASLT_EPILOGUE_GELU_AUX || d->epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ||
         d->epilogue == CUBLASLT_EPILOGUE_DGELU))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    const char *nc = getenv("GPTC_EMU_LT_CANDIDATES");
    int n = nc && atoi(nc) > 1 ? atoi(nc) : 1;
    if (n > requested) n = requested;
    for (int i = 0; i < n; i++) {
        memset(&results[i], 0, sizeof results[i]);
        uint64_t *a = results[i].algo.data;
        a[0] = ALGO_MAGIC;
        a[1] = ((uint64_t)pref->align[0] << 32) | pref->align[1];
        a[2] = ((uint64_t)pref->align[2] << 32) | pref->align[3];
        a[3] = p.m, a[4] = p.n, a[5] = p.k;
        a[6] = (uint64_t)i << ALGO_INDEX_SHIFT | (uint64_t)p.ta << 1 | (uint64_t)p.tb;
        a[7] = types_word(d, A, C, D);
        results[i].workspaceSize = 0;
        results[i].state = CUBLAS_STATUS_SUCCESS;
        results[i].wavesCount = 1.0f;
    }
    *returned = n;
    return CUBLAS_STATUS_SUCCESS;
}

/* ------------------------------------------------------------------ the product */

typedef struct {
    problem p;
    float alpha, beta;
    const void *A, *B, *C, *bias;
    void *D;
    int64_t lda, ldb, ldc, ldd;
    int32_t ta_, tc, td, tbias, taux; /* the types of A (and B), C, D, the bias, aux */
    uint32_t corr; /* CUPTI's correlation id (of the kernel the real library launches) */
    int gelu;      /* 0, or EPI_GELU / EPI_DGELU */
    void *aux;     /* m x n, leading dimension aux_ld */
    int64_t aux_ld;
    int slow; /* GPTC_EMU_LT_SLOW_FIRST and the first candidate: 3 ms more */
} gemm_job;

enum { EPI_GELU = 1, EPI_DGELU = 2 };

static size_t type_size(int32_t t) { return t == CUDA_R_16BF ? 2 : 4; }

/* element i of a matrix or vector of type t, exactly */
static float load(const void *x, size_t i, int32_t t) {
    return t == CUDA_R_16BF ? bf16_to_float(((const uint16_t *)x)[i]) : ((const float *)x)[i];
}

/* stores the fp32 value v as element i of type t: a bf16 is rounded here, once */
static void store(void *x, size_t i, int32_t t, float v) {
    if (t == CUDA_R_16BF) ((uint16_t *)x)[i] = bf16_bits(v);
    else ((float *)x)[i] = v;
}

/* the tanh-approximated GELU and its derivative, in double */
static double gelu(double x) {
    return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}
static double gelu_grad(double x) {
    double th = tanh(0.7978845608028654 * (x + 0.044715 * x * x * x));
    return 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * 0.7978845608028654 * (1.0 + 3 * 0.044715 * x * x);
}

/* The sums' inner loop, over run_gemm's own copies of the operands only: not checked by
 * ASan, UBSan or TSan, which made it a fifth of a sanitized emulated training step (UBSan's
 * pointer-overflow checks were most of what was left of it). The
 * operands themselves are read by load(), checked, and checked against their registered
 * blocks by emu_cublasLtMatmul. acc[c * m + i] += x[i] * b[c] for the nc columns c of a
 * pass (GEMM_COLS at most) and every row i: each element's sum takes one more term, so it
 * still runs over l in order, and a pass reads each x (a column of op(A)) once for all of
 * its columns. */
enum { GEMM_COLS = 4 };
__attribute__((no_sanitize("address", "thread", "undefined")))
static void add_scaled(double *acc, const double *x, const double *b, int nc, uint64_t m) {
    if (nc == GEMM_COLS) { /* four separate rows of sums, so that the loop vectorises */
        double *restrict a0 = acc, *restrict a1 = acc + m, *restrict a2 = acc + 2 * m;
        double *restrict a3 = acc + 3 * m;
        const double *restrict xr = x;
        double b0 = b[0], b1 = b[1], b2 = b[2], b3 = b[3];
        for (uint64_t i = 0; i < m; i++) {
            double xi = xr[i];
            a0[i] += xi * b0;
            a1[i] += xi * b1;
            a2[i] += xi * b2;
            a3[i] += xi * b3;
        }
        return;
    }
    for (int c = 0; c < nc; c++) {
        double *restrict ac = acc + (uint64_t)c * m;
        const double *restrict xr = x;
        double bc = b[c];
        for (uint64_t i = 0; i < m; i++) ac[i] += xr[i] * bc;
    }
}

/* GEMM_COLS columns of D at a time: those columns of op(B) gathered first, then the sum of
 * op(A)'s columns scaled by them (add_scaled), each element's over l in order. A is read
 * once, into doubles, column l of op(A) contiguous (each element would otherwise be
 * converted once per column of B). */
static void run_gemm(void *arg) {
    gemm_job *g = arg;
    const problem *p = &g->p;
    uint64_t t0 = emu_cupti_now();
    /* [k][GEMM_COLS] op(B)'s columns of the pass, [GEMM_COLS][m] sums, [k][m] op(A) */
    double *bcol = malloc((GEMM_COLS * (p->k + p->m) + p->m * p->k) * sizeof(double) + 1);
    if (!bcol) emu_fail("cublasLtMatmul: out of host memory");
    double *acc = bcol + GEMM_COLS * p->k, *a = acc + GEMM_COLS * p->m;
    if (p->ta) { /* op(A)(i, l) is A's element (l, i): i outer, so that A is read in order */
        for (uint64_t i = 0; i < p->m; i++)
            for (uint64_t l = 0; l < p->k; l++)
                a[l * p->m + i] = load(g->A, l + i * g->lda, g->ta_);
    } else {
        for (uint64_t l = 0; l < p->k; l++)
            for (uint64_t i = 0; i < p->m; i++)
                a[l * p->m + i] = load(g->A, i + l * g->lda, g->ta_);
    }
    for (uint64_t j0 = 0; j0 < p->n; j0 += GEMM_COLS) {
        int nc = p->n - j0 < GEMM_COLS ? (int)(p->n - j0) : GEMM_COLS;
        for (int c = 0; c < nc; c++)
            for (uint64_t l = 0; l < p->k; l++) {
                uint64_t j = j0 + (uint64_t)c;
                bcol[l * GEMM_COLS + c] =
                    load(g->B, p->tb ? j + l * g->ldb : l + j * g->ldb, g->ta_);
            }
        for (uint64_t i = 0; i < (uint64_t)nc * p->m; i++) acc[i] = 0;
        for (uint64_t l = 0; l < p->k; l++)
            add_scaled(acc, a + l * p->m, bcol + l * GEMM_COLS, nc, p->m);
        for (int c = 0; c < nc; c++) {
            uint64_t j = j0 + (uint64_t)c;
            for (uint64_t i = 0; i < p->m; i++) {
                double d = (double)g->alpha * (double)(float)acc[(uint64_t)c * p->m + i];
                if (g->beta != 0.0f) d += (double)g->beta * load(g->C, i + j * g->ldc, g->tc);
                if (g->bias) d += load(g->bias, i, g->tbias);
                if (g->gelu == EPI_GELU) {
                    store(g->aux, i + j * g->aux_ld, g->taux, (float)d);
                    d = gelu((double)(float)d);
                } else if (g->gelu == EPI_DGELU) {
                    d *= gelu_grad((double)load(g->aux, i + j * g->aux_ld, g->taux));
                }
                store(g->D, i + j * g->ldd, g->td, (float)d);
            }
        }
    }
    free(bcol);
    if (g->slow) {
        struct timespec pause = {0, 3000000};
        nanosleep(&pause, NULL);
    }
    /* named as cuBLAS names its kernels (C symbols), by what this one computed */
    const char *kname = g->gelu == EPI_GELU    ? "emu_gemm_gelu_aux"
                        : g->gelu == EPI_DGELU ? "emu_gemm_dgelu"
                        : g->bias              ? "emu_gemm_bias"
                                               : "emu_gemm";
    emu_cupti_work(EMU_CUPTI_KERNEL, g->corr, kname, 1, t0, emu_cupti_now());
    free(g);
}

/* Bytes a column-major rows x cols matrix of type t with leading dimension ld spans. */
static size_t extent(uint64_t rows, uint64_t cols, int64_t ld, int32_t t) {
    if (rows == 0 || cols == 0) return 0;
    return ((size_t)(cols - 1) * (size_t)ld + rows) * type_size(t);
}

static int overlaps(const void *x, size_t xb, const void *y, size_t yb) {
    const char *a = x, *b = y;
    return xb && yb && a < b + yb && b < a + xb;
}

static int align_of(const void *p) {
    uintptr_t a = (uintptr_t)p;
    int bytes = 256;
    while (bytes > 1 && a % (uintptr_t)bytes) bytes /= 2;
    return bytes;
}

cublasStatus_t emu_cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void *alpha,
                                  const void *A, cublasLtMatrixLayout_t Ad, const void *B,
                                  cublasLtMatrixLayout_t Bd, const void *beta, const void *C,
                                  cublasLtMatrixLayout_t Cd, void *D, cublasLtMatrixLayout_t Dd,
                                  const cublasLtMatmulAlgo_t *algo, void *workspace,
                                  size_t workspace_bytes, cudaStream_t stream) {
    const char *call = "cublasLtMatmul";
    char why[512];
    problem p;
    if (!h || h->magic != HANDLE_MAGIC) return refuse(CUBLAS_STATUS_NOT_INITIALIZED, call, "not a live handle");
    if (shape_of(d, Ad, Bd, Cd, Dd, &p, why, sizeof why) != 0) return refuse(CUBLAS_STATUS_INVALID_VALUE, call, why);
    if (types_ok(d, Ad, Bd, Cd, Dd, why, sizeof why) != 0) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, call, why);
    if (!emu_stream_valid(stream)) return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "not a live stream");
    if (!algo || algo->data[0] != ALGO_MAGIC)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "an algorithm that did not come from the heuristic");
    const uint64_t *a = algo->data;
    if (a[3] != p.m || a[4] != p.n || a[5] != p.k ||
        (a[6] & ((1u << ALGO_INDEX_SHIFT) - 1)) != ((uint64_t)p.ta << 1 | (uint64_t)p.tb) ||
        a[7] != types_word(d, Ad, Cd, Dd))
        return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "the algorithm was chosen for another problem");
    if (!alpha || !beta) return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "alpha or beta is NULL");
    gemm_job g = {p, *(const float *)alpha, *(const float *)beta, A, B, C, NULL, D,
                  Ad->ld, Bd->ld, Cd->ld, Dd->ld, (int32_t)Ad->type, (int32_t)Cd->type,
                  (int32_t)Dd->type, bias_type(d, Dd), aux_type(d, Dd), 0, 0, NULL, 0, 0};
    int with_bias = d->epilogue == CUBLASLT_EPILOGUE_BIAS || d->epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    if (with_bias && !d->bias)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "the BIAS epilogue without a bias pointer");
    if (with_bias) g.bias = d->bias;
    g.gelu = d->epilogue == CUBLASLT_EPILOGUE_DGELU ? EPI_DGELU
           : d->epilogue == CUBLASLT_EPILOGUE_GELU_AUX || d->epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ? EPI_GELU
           : 0;
    if (g.gelu && (!d->aux || d->aux_ld < (int64_t)p.m))
        return refuse(CUBLAS_STATUS_INVALID_VALUE, call,
                      "a GELU epilogue without an aux pointer, or with EPILOGUE_AUX_LD below m");
    g.aux = (void *)d->aux, g.aux_ld = d->aux_ld;
    const char *slow = getenv("GPTC_EMU_LT_SLOW_FIRST");
    g.slow = slow && strcmp(slow, "1") == 0 && (a[6] >> ALGO_INDEX_SHIFT) == 0;
    if (p.m == 0 || p.n == 0) return CUBLAS_STATUS_SUCCESS;

    /* every operand lies in memory the GPU can reach, over its whole extent */
    size_t bytes_a = extent(Ad->rows, Ad->cols, Ad->ld, Ad->type);
    size_t bytes_b = extent(Bd->rows, Bd->cols, Bd->ld, Bd->type);
    size_t bytes_c = g.beta != 0.0f ? extent(Cd->rows, Cd->cols, Cd->ld, Cd->type) : 0;
    size_t bytes_d = extent(Dd->rows, Dd->cols, Dd->ld, Dd->type);
    size_t bytes_bias = with_bias ? p.m * type_size(g.tbias) : 0;
    size_t bytes_aux = g.gelu ? extent(p.m, p.n, g.aux_ld, g.taux) : 0;
    if (emu_check_device_range(A, p.k ? bytes_a : 0, "A", why, sizeof why) != 0 ||
        emu_check_device_range(B, p.k ? bytes_b : 0, "B", why, sizeof why) != 0 ||
        emu_check_device_range(C, bytes_c, "C", why, sizeof why) != 0 ||
        emu_check_device_range(D, bytes_d, "D", why, sizeof why) != 0 ||
        emu_check_device_range(g.bias, bytes_bias, "the bias", why, sizeof why) != 0 ||
        emu_check_device_range(g.aux, bytes_aux, "the aux matrix", why, sizeof why) != 0 ||
        emu_check_device_range(workspace, workspace_bytes, "the workspace", why, sizeof why) != 0)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, call, why);
    if (overlaps(D, bytes_d, A, p.k ? bytes_a : 0) || overlaps(D, bytes_d, B, p.k ? bytes_b : 0) ||
        overlaps(D, bytes_d, g.bias, bytes_bias) || overlaps(D, bytes_d, g.aux, bytes_aux))
        return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "D overlaps A, B, the bias or the aux matrix");
    if (bytes_c && C != D && overlaps(D, bytes_d, C, bytes_c))
        return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "D partly overlaps C");
    if (bytes_c && C == D && Cd->ld != Dd->ld)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, call, "in place (C == D) with different layouts");
    /* the alignments the algorithm was chosen for; every pointer on its element size */
    uint32_t promised[4] = {(uint32_t)(a[1] >> 32), (uint32_t)a[1], (uint32_t)(a[2] >> 32), (uint32_t)a[2]};
    const void *ptr[4] = {A, B, C, D};
    const int32_t type[4] = {Ad->type, Bd->type, Cd->type, Dd->type};
    static const char *const name[4] = {"A", "B", "C", "D"};
    for (int i = 0; i < 4; i++) {
        if (i == 2 && !bytes_c) continue;
        if (promised[i] && align_of(ptr[i]) < (int)promised[i]) {
            snprintf(why, sizeof why, "%s = %p is %d-byte aligned, but the algorithm was chosen for "
                     "%u-byte alignment", name[i], ptr[i], align_of(ptr[i]), promised[i]);
            return refuse(CUBLAS_STATUS_INVALID_VALUE, call, why);
        }
        if (align_of(ptr[i]) < (int)type_size(type[i])) {
            snprintf(why, sizeof why, "%s = %p is not aligned on its %s elements", name[i], ptr[i],
                     type_name(type[i]));
            return refuse(CUBLAS_STATUS_INVALID_VALUE, call, why);
        }
    }
    gemm_job *job = malloc(sizeof *job);
    if (!job) return CUBLAS_STATUS_ALLOC_FAILED;
    /* cuBLASLt's kernels load as ours do: one a kind of problem (types, epilogue, the
     * algorithm's index and transposes), its bit 63 set to keep it apart from our
     * kernels' addresses */
    uint64_t kind = (a[7] * 0x9E3779B97F4A7C15u) ^ (a[6] << 16) ^ (uint64_t)d->epilogue;
    emu_module_first_use((uint64_t)1 << 63 | kind, "a cuBLASLt kernel");
    *job = g;
    job->corr = emu_cupti_api();
    emu_stream_run(stream, run_gemm, job, "cublasLtMatmul");
    return CUBLAS_STATUS_SUCCESS;
}

/* engine/cuda/cublaslt_api.h's table, filled with this fake's functions instead of
 * engine/cuda/cublaslt_load.c's dlopen of the real library (the emulator's builds compile
 * this file in its place); the assignments check the fake's types against the table's */
int cublaslt_load(cublaslt_api *api, char *err, size_t errlen) {
    (void)err, (void)errlen;
    api->create = cublasLtCreate;
    api->status_string = cublasLtGetStatusString;
    api->version = cublasLtGetVersion;
    api->desc_create = cublasLtMatmulDescCreate;
    api->desc_destroy = cublasLtMatmulDescDestroy;
    api->desc_set = cublasLtMatmulDescSetAttribute;
    api->layout_create = cublasLtMatrixLayoutCreate;
    api->layout_destroy = cublasLtMatrixLayoutDestroy;
    api->pref_create = cublasLtMatmulPreferenceCreate;
    api->pref_destroy = cublasLtMatmulPreferenceDestroy;
    api->pref_set = cublasLtMatmulPreferenceSetAttribute;
    api->heuristic = cublasLtMatmulAlgoGetHeuristic;
    api->matmul = cublasLtMatmul;
    return 0;
}
