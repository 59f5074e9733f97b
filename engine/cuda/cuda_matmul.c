/* cuBLASLt is column-major; our buffers are row-major, and a row-major [R,C] matrix is the
 * column-major [C,R] matrix of its transpose. So y[N,OC] = x[N,IC] @ W[IC,OC] is issued as
 * y^T (OC x N) = W^T (OC x IC) @ x^T (IC x N), with every buffer passed as it lies.
 *
 * Types: under fp32 every matrix, the bias and the aux matrix are CUDA_R_32F. Under bf16
 * the operands (inputs, weights, dout) are CUDA_R_16BF, and so are the outputs that are
 * activations (out, dinp, the GELU epilogue's pre and out, dpre), the bias and the aux
 * matrix; the weight gradient is CUDA_R_32F (C = D, accumulated with beta = 1). Both
 * compute in CUBLAS_COMPUTE_32F with fp32 scales: the epilogue (bias, GELU, GELU') acts
 * on the fp32 accumulator, and a bf16 D or aux is rounded once, when stored.
 *
 * Choosing an algorithm (the heuristic query) costs tens of microseconds, as much as a
 * small GEMM, so each distinct problem is planned once: a small table keyed by shape,
 * transposes, types, epilogue, beta and pointer alignment keeps its descriptors and
 * algorithm. The heuristic's first candidate is a prediction, not a measurement: with
 * GPTC_GEMM_CANDIDATES = n (2 to 16) the first call of each plan times its first n
 * candidates on that call's operands and keeps the fastest (tune_plan), saying which in
 * the log; under kernel timing that call's op is read as untimed (its time holds every
 * candidate's runs), so the report leaves it out. Off by default: the choice then rests
 * on timings, so two runs may pick different algorithms, which sum in different orders.
 * GPTC_GEMM_CACHE = file keeps the choices (cache_*): a later run with the same file takes
 * each product's algorithm from it without timing, so runs tuned once stay reproducible.
 * All products run on one workspace; that is safe because only the compute stream
 * issues them. */
#define _POSIX_C_SOURCE 200809L /* open, write: the GEMM cache */
#include "engine/cuda/cuda_matmul.h"

#include "engine/cuda/cublaslt_api.h"
#include "engine/cuda/cuda_internal.h"
#include "engine/cuda/cuda_kernels.h"
#include "engine/log.h"

#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { PLAN_SLOTS = 128, WORKSPACE_BYTES = 32 << 20, MAX_CANDIDATES = 16, TUNE_RUNS = 5,
       TUNE_ROUNDS = 2 };

/* what the GEMM's epilogue does besides the optional bias */
enum { EPI_NONE, EPI_GELU_AUX, EPI_DGELU };

typedef struct {
    int used;
    unsigned long last_use; /* g.use_clock at its last call: the table drops the oldest */
    int ta, tb, m, n, k, lda, ldb, ldc, bias, accumulate;
    int epi, ldaux; /* EPI_*, and the aux matrix's leading dimension */
    int unfused;    /* cuBLASLt has no algorithm with this epilogue: the caller runs it apart */
    cudaDataType_t ab_type; /* A and B (the activation type) */
    cudaDataType_t c_type;  /* C and D; the bias and the aux matrix are of this type too */
    int align[4]; /* bytes: A, B, C, bias */
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
    int n_candidates; /* heuristic results in candidates[], best predicted first */
    int tuned;        /* candidates timed (or not to be): algo is the one to run */
    cublasLtMatmulAlgo_t candidates[MAX_CANDIDATES];
} plan;

static struct {
    cublaslt_api api; /* cuBLASLt's functions (cublaslt_api.h) */
    cublasLtHandle_t lt;
    gptc_precision precision;
    cudaDataType_t act; /* the activation type: CUDA_R_32F, or CUDA_R_16BF under bf16 */
    void *workspace; /* [WORKSPACE_BYTES] */
    plan plans[PLAN_SLOTS];
    unsigned long use_clock; /* products run so far */
    long made, evicted;      /* plans made, and dropped for another (the first said) */
    int candidates;         /* GPTC_GEMM_CANDIDATES: how many to time per plan (1: none) */
    int n_tuned, n_not_first; /* plans tuned, and of those, how many the first did not win */
    int n_cached;             /* plans whose choice came from GPTC_GEMM_CACHE */
    const char *cache_path;   /* GPTC_GEMM_CACHE, or NULL */
    char cache_where[192];    /* the device and cuBLASLt version the cache's lines must name */
    char (*cache_keys)[96];   /* [n_cache] keys of the lines read, and their choices: */
    int *cache_pick;          /* [n_cache] the winner's place among the heuristic's candidates */
    int n_cache;
} g;

static void lt_check(cublasStatus_t rc, const char *what) {
    if (rc == CUBLAS_STATUS_SUCCESS) return;
    log_error("rank %d: cuBLASLt error in %s: %s", log_rank(), what, g.api.status_string(rc));
    exit(EXIT_FAILURE);
}

void cuda_matmul_set_precision(gptc_precision p) {
    g.precision = p;
    g.act = p == GPTC_BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

/* ---- GPTC_GEMM_CACHE: a line per product,
 *   gptc-gemm 1 | DEVICE | cuBLASLt VERSION | KEY | PICK
 * KEY the plan's fields and the count of candidates asked for (plan_key), PICK the
 * fastest candidate's place (from 0) among the heuristic's, which orders them the same way
 * for the same request on the same device and cuBLASLt. Lines of another device or
 * version are passed over; of a key's lines, the first whose PICK is among the candidates
 * counts. Each rank appends the choices it times, one write a line (O_APPEND keeps the
 * ranks' lines whole); a last line cut short (a rank killed while writing it) is passed
 * over with a warning. */

/* the fields find_plan compares and GPTC_GEMM_CANDIDATES, as text (under 96 characters) */
static void plan_key(const plan *p, char key[96]) {
    snprintf(key, 96, "%d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d n%d", p->ta,
             p->tb, p->m, p->n, p->k, p->lda, p->ldb, p->ldc, p->bias, p->accumulate, p->epi,
             p->ldaux, (int)p->ab_type, (int)p->c_type, p->align[0], p->align[1], p->align[2],
             p->align[3], g.candidates);
}

/* keeps key's choice pick in memory (the file's lines, and those this run adds) */
static void cache_keep(const char key[96], int pick) {
    g.cache_keys = log_realloc(g.cache_keys, sizeof *g.cache_keys * (size_t)(g.n_cache + 1),
                               "the GEMM cache");
    g.cache_pick = log_realloc(g.cache_pick, sizeof *g.cache_pick * (size_t)(g.n_cache + 1),
                               "the GEMM cache");
    memcpy(g.cache_keys[g.n_cache], key, 96);
    g.cache_pick[g.n_cache++] = pick;
}

/* Reads the cache's lines for this device and cuBLASLt; 0, or -1 with err set on a line
 * that is not a cache line (a missing file is an empty cache). */
static int cache_load(char *err, size_t errlen) {
    int dev = 0;
    struct cudaDeviceProp prop;
    memset(&prop, 0, sizeof prop);
    if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess)
        (void)cudaGetLastError();
    snprintf(g.cache_where, sizeof g.cache_where, "%.120s | cuBLASLt %zu", prop.name,
             g.api.version());
    FILE *f = fopen(g.cache_path, "r");
    if (!f) return 0;
    char line[512];
    int at = 0;
    while (fgets(line, sizeof line, f)) {
        at++;
        if (!strchr(line, '\n') && feof(f)) { /* a last line cut short */
            log_info("GPTC_GEMM_CACHE %s: line %d has no end (a write cut short): passed "
                     "over\n", g.cache_path, at);
            break;
        }
        char *bar[4], *q = line;
        int n = 0;
        while (n < 4 && (q = strstr(q, " | "))) bar[n++] = q, q += 3;
        if (n != 4 || strncmp(line, "gptc-gemm 1 | ", 14) != 0) {
            snprintf(err, errlen, "GPTC_GEMM_CACHE %s: line %d is not a gptc-gemm 1 line",
                     g.cache_path, at);
            fclose(f);
            return -1;
        }
        /* this device and version: the text between the first and the third bar */
        size_t wl = (size_t)(bar[2] - (bar[0] + 3));
        if (wl != strlen(g.cache_where) || strncmp(bar[0] + 3, g.cache_where, wl) != 0) continue;
        char key[96];
        size_t kl = (size_t)(bar[3] - (bar[2] + 3));
        int pick;
        if (kl >= sizeof key || sscanf(bar[3] + 3, "%d", &pick) != 1 || pick < 0) {
            snprintf(err, errlen, "GPTC_GEMM_CACHE %s: line %d has no key or choice",
                     g.cache_path, at);
            fclose(f);
            return -1;
        }
        memset(key, 0, sizeof key);
        memcpy(key, bar[2] + 3, kl);
        cache_keep(key, pick);
    }
    fclose(f);
    return 0;
}

/* the cached choice for p's key that names one of its candidates, or -1 */
static int cache_find(const plan *p) {
    char key[96];
    plan_key(p, key);
    for (int i = 0; i < g.n_cache; i++)
        if (strcmp(g.cache_keys[i], key) == 0 && g.cache_pick[i] < p->n_candidates)
            return g.cache_pick[i];
    return -1;
}

/* appends p's choice to the cache file (a failure is said, and the run goes on) */
static void cache_add(const plan *p, int pick) {
    char key[96], line[512];
    plan_key(p, key);
    int len = snprintf(line, sizeof line, "gptc-gemm 1 | %s | %s | %d\n", g.cache_where, key,
                       pick);
    cache_keep(key, pick); /* a plan made again later in this run takes it too */
    int fd = open(g.cache_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd < 0 || write(fd, line, (size_t)len) != len)
        log_info("rank %d: GPTC_GEMM_CACHE %s: cannot append the %d x %d x %d product's "
                 "choice\n", log_rank(), g.cache_path, p->m, p->n, p->k);
    if (fd >= 0) close(fd);
}

/* GPTC_GEMM_CANDIDATES: 1 when unset or empty, -1 when it is no count from 1 to
 * MAX_CANDIDATES */
static long candidates_from_env(void) {
    const char *env = getenv("GPTC_GEMM_CANDIDATES");
    if (!env || !env[0]) return 1;
    char *end;
    long n = strtol(env, &end, 10);
    return *end || n < 1 || n > MAX_CANDIDATES ? -1 : n;
}

const char *cuda_backend_gemm_cache(void) {
    const char *cache = getenv("GPTC_GEMM_CACHE");
    return cache && cache[0] && candidates_from_env() > 1 ? cache : NULL;
}

int cuda_matmul_init(char *err, size_t errlen) {
    cuda_matmul_set_precision(GPTC_FP32);
    if (cublaslt_load(&g.api, err, errlen) != 0) return -1;
    const char *env = getenv("GPTC_GEMM_CANDIDATES");
    long n = candidates_from_env();
    if (n < 0) {
        snprintf(err, errlen, "GPTC_GEMM_CANDIDATES = %s: give a count from 1 to %d", env,
                 MAX_CANDIDATES);
        return -1;
    }
    g.candidates = (int)n;
    const char *cache = getenv("GPTC_GEMM_CACHE");
    g.cache_path = cuda_backend_gemm_cache();
    if (cache && cache[0] && !g.cache_path)
        log_warn("GPTC_GEMM_CACHE = %s has no effect: the cache keeps the choices of "
                 "GPTC_GEMM_CANDIDATES >= 2, which is %s", cache,
                 env && env[0] ? env : "not set");
    struct stat st; /* a FIFO's open waits for a writer */
    if (g.cache_path && stat(g.cache_path, &st) == 0 && !S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "GPTC_GEMM_CACHE %s: not a regular file", g.cache_path);
        return -1;
    }
    if (g.cache_path && cache_load(err, errlen) != 0) return -1;
    if (g.cache_path)
        log_info("GPTC_GEMM_CACHE %s: %d product choice(s) for %s; the others are timed and "
                 "added\n", g.cache_path, g.n_cache, g.cache_where);
    cublasStatus_t rc = g.api.create(&g.lt);
    if (rc != CUBLAS_STATUS_SUCCESS) {
        snprintf(err, errlen, "train.device = cuda: cuBLASLt failed to start (%s)",
                 g.api.status_string(rc));
        return -1;
    }
    if (cudaMalloc(&g.workspace, WORKSPACE_BYTES) != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(err, errlen, "train.device = cuda: no GPU memory for the GEMM workspace");
        return -1;
    }
    return 0;
}

/* The largest power of two (up to 256) dividing the address: cuBLASLt picks its
 * vectorised kernels by the alignment it is promised. A bf16 view may lie on 2 bytes. */
static int alignment(const void *p) {
    uintptr_t a = (uintptr_t)p;
    int bytes = 256;
    while (bytes > 2 && a % (uintptr_t)bytes) bytes /= 2;
    return bytes;
}

static void set_op(cublasLtMatmulDesc_t op, cublasLtMatmulDescAttributes_t attr, const void *v,
                   size_t size) {
    lt_check(g.api.desc_set(op, attr, v, size), "cublasLtMatmulDescSetAttribute");
}

static plan *make_plan(const plan *key) {
    plan *p = NULL;
    for (int i = 0; i < PLAN_SLOTS; i++) {
        plan *q = &g.plans[i];
        if (!q->used) {
            p = q;
            break;
        }
    }
    if (!p) {
        /* full (a run has a few dozen distinct products): the plan used longest ago goes,
         * the others keep their algorithms (a re-made plan asks, and times, again) */
        p = &g.plans[0];
        for (int i = 1; i < PLAN_SLOTS; i++)
            if (g.plans[i].last_use < p->last_use) p = &g.plans[i];
        g.api.desc_destroy(p->op);
        g.api.layout_destroy(p->a);
        g.api.layout_destroy(p->b);
        g.api.layout_destroy(p->c);
        if (!g.evicted++)
            log_info("cuBLASLt: more than %d distinct products: the plans used longest ago are "
                     "made again when needed%s\n", PLAN_SLOTS,
                     g.candidates > 1 && !g.cache_path ? " (and their candidates timed again)"
                                                       : "");
    }
    *p = *key;
    g.made++;
    /* strict fp32 accumulation (no TF32) for fp32 and bf16 operands alike */
    lt_check(g.api.desc_create(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
    cublasOperation_t ta = key->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t tb = key->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    set_op(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    set_op(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    cublasLtEpilogue_t epi = key->bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    if (key->epi == EPI_GELU_AUX) epi = key->bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    if (key->epi == EPI_DGELU) epi = CUBLASLT_EPILOGUE_DGELU;
    set_op(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
    if (key->bias) { /* the default (D's type) is ours too, but a wrong guess reads garbage */
        int32_t bt = (int32_t)key->c_type;
        set_op(p->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt);
    }
    if (key->epi != EPI_NONE) { /* the aux matrix takes D's type, the default */
        int64_t ld = key->ldaux;
        set_op(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld);
    }
    /* stored shapes: op(A) is m x k, op(B) is k x n */
    lt_check(g.api.layout_create(&p->a, key->ab_type, key->ta ? key->k : key->m,
                                        key->ta ? key->m : key->k, key->lda), "layout A");
    lt_check(g.api.layout_create(&p->b, key->ab_type, key->tb ? key->n : key->k,
                                        key->tb ? key->k : key->n, key->ldb), "layout B");
    lt_check(g.api.layout_create(&p->c, key->c_type, key->m, key->n, key->ldc), "layout C");

    cublasLtMatmulPreference_t pref;
    lt_check(g.api.pref_create(&pref), "cublasLtMatmulPreferenceCreate");
    size_t ws = WORKSPACE_BYTES;
    uint32_t al[4] = {(uint32_t)key->align[0], (uint32_t)key->align[1], (uint32_t)key->align[2],
                      (uint32_t)key->align[3]};
    lt_check(g.api.pref_set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                  &ws, sizeof ws), "preference");
    lt_check(g.api.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                  &al[0], sizeof al[0]), "preference");
    lt_check(g.api.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                  &al[1], sizeof al[1]), "preference");
    lt_check(g.api.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                  &al[2], sizeof al[2]), "preference");
    lt_check(g.api.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                  &al[2], sizeof al[2]), "preference");
    cublasLtMatmulHeuristicResult_t found[MAX_CANDIDATES];
    int n_found = 0;
    cublasStatus_t rc = g.api.heuristic(g.lt, p->op, p->a, p->b, p->c, p->c, pref,
                                                       g.candidates, found, &n_found);
    /* cuBLASLt says "no algorithm" both ways: no result, or NOT_SUPPORTED (e.g. an epilogue
     * it has no kernel for with these types) */
    if (rc == CUBLAS_STATUS_NOT_SUPPORTED) n_found = 0;
    else lt_check(rc, "cublasLtMatmulAlgoGetHeuristic");
    g.api.pref_destroy(pref);
    p->n_candidates = 0;
    for (int i = 0; i < n_found; i++) /* a result is valid only where its state says so */
        if (found[i].state == CUBLAS_STATUS_SUCCESS) p->candidates[p->n_candidates++] = found[i].algo;
    n_found = p->n_candidates;
    if (n_found == 0 && key->epi != EPI_NONE) {
        /* said when the plan is made (once a shape, but for a plan dropped from a full
         * table and made again): an unfused GELU costs a pass over the activations and
         * their gradient each way, a slowdown to look for in the timing report */
        log_info("cuBLASLt has no %s epilogue for the %d x %d x %d product: GEMM and GELU "
                 "run as separate kernels\n", key->epi == EPI_GELU_AUX ? "GELU" : "DGELU",
                 key->m, key->n, key->k);
        p->unfused = 1; /* the caller runs the GEMM plain and the activation on its own */
        p->used = 1;
        return p;
    }
    if (n_found == 0) {
        log_error("rank %d: cuBLASLt has no algorithm for a %d x %d x %d product", log_rank(),
                  key->m, key->n, key->k);
        exit(EXIT_FAILURE);
    }
    p->algo = p->candidates[0];
    p->tuned = p->n_candidates < 2;
    p->used = 1;
    return p;
}

/* Runs candidate algo once on the plan's operands; 0, or -1 when it cannot run (the
 * runtime's error, if the library left one, cleared: the next launch must not take it
 * for its own). */
static int run_candidate(const plan *p, const cublasLtMatmulAlgo_t *algo, const void *A,
                         const void *B, void *C, float beta, cudaStream_t s) {
    float alpha = 1.0f;
    if (g.api.matmul(g.lt, p->op, &alpha, A, p->a, B, p->b, &beta, C, p->c, C, p->c, algo,
                       g.workspace, WORKSPACE_BYTES, s) == CUBLAS_STATUS_SUCCESS)
        return 0;
    (void)cudaGetLastError();
    return -1;
}

/* One candidate's mean time over TUNE_RUNS runs, in ms (INFINITY when it fails). */
static float time_candidate(const plan *p, const cublasLtMatmulAlgo_t *algo, const void *A,
                            const void *B, void *C, float beta, cudaEvent_t ev[2],
                            cudaStream_t s) {
    float ms = INFINITY;
    if (cudaEventRecord(ev[0], s) != cudaSuccess) {
        (void)cudaGetLastError();
        return INFINITY;
    }
    for (int r = 0; r < TUNE_RUNS; r++)
        if (run_candidate(p, algo, A, B, C, beta, s) != 0) return INFINITY;
    if (cudaEventRecord(ev[1], s) == cudaSuccess && cudaEventSynchronize(ev[1]) == cudaSuccess &&
        cudaEventElapsedTime(&ms, ev[0], ev[1]) == cudaSuccess)
        return ms / TUNE_RUNS;
    (void)cudaGetLastError();
    return INFINITY;
}

/* GPTC_GEMM_CANDIDATES > 1, a plan's first call: times its candidates on this call's
 * operands (the bias and aux pointers already set) and keeps the fastest. Every candidate
 * runs once before any is timed (the first timed must not pay for clocks still rising),
 * then each is timed in TUNE_ROUNDS rounds, its best round counting. The runs write what
 * the real call then writes again, except where the product accumulates (beta 1): those
 * run on a zeroed scratch C, allocated and freed in the stream's order (no cudaFree, which
 * would wait for the whole device, comm streams included, in the middle of a step). */
static void tune_plan(plan *p, const void *A, const void *B, void *C, float beta,
                      cudaStream_t s) {
    p->tuned = 1;
    int cached = g.cache_path ? cache_find(p) : -1;
    if (cached >= 0) {
        p->algo = p->candidates[cached];
        g.n_cached++;
        g.n_not_first += cached != 0;
        return;
    }
    /* the candidates' output when the product adds to C (beta != 0), so that timing them
     * leaves C as it was: [ldc * n] of C's type, and 256 bytes to align it */
    void *scratch = NULL, *target = C;
    if (beta != 0.0f) {
        size_t bytes = (size_t)p->ldc * p->n * (p->c_type == CUDA_R_32F ? 4 : 2);
        if (cudaMallocAsync(&scratch, bytes + 256, s) != cudaSuccess ||
            cudaMemsetAsync(scratch, 0, bytes + 256, s) != cudaSuccess) {
            (void)cudaGetLastError();
            if (scratch) cudaFreeAsync(scratch, s);
            log_info("cuBLASLt: no GPU memory (or no stream-ordered allocator) to time the "
                     "%d x %d x %d product's candidates: the heuristic's first runs\n", p->m,
                     p->n, p->k);
            return;
        }
        /* on 256 bytes: any alignment a plan may have been promised */
        target = (char *)scratch + (256 - (uintptr_t)scratch % 256) % 256;
    }
    cuda_timer_spoil_op();
    cudaEvent_t ev[2];
    cuda_check(cudaEventCreate(&ev[0]), "cudaEventCreate");
    cuda_check(cudaEventCreate(&ev[1]), "cudaEventCreate");
    float best_of[MAX_CANDIDATES];
    for (int i = 0; i < p->n_candidates; i++)
        best_of[i] = run_candidate(p, &p->candidates[i], A, B, target, beta, s) == 0 ? INFINITY : -1;
    for (int round = 0; round < TUNE_ROUNDS; round++)
        for (int i = 0; i < p->n_candidates; i++) {
            if (best_of[i] < 0) continue; /* could not run at all */
            float ms = time_candidate(p, &p->candidates[i], A, B, target, beta, ev, s);
            if (ms < best_of[i]) best_of[i] = ms;
        }
    cudaEventDestroy(ev[0]);
    cudaEventDestroy(ev[1]);
    if (scratch) cudaFreeAsync(scratch, s);
    int pick = 0;
    for (int i = 1; i < p->n_candidates; i++)
        if (best_of[i] >= 0 && (best_of[pick] < 0 || best_of[i] < best_of[pick])) pick = i;
    if (best_of[pick] < 0 || best_of[pick] == INFINITY) {
        log_info("cuBLASLt: the %d x %d x %d product's candidates could not be timed: the "
                 "heuristic's first runs\n", p->m, p->n, p->k);
        return;
    }
    p->algo = p->candidates[pick];
    g.n_tuned++;
    g.n_not_first += pick != 0;
    if (g.cache_path) cache_add(p, pick);
    char first[32] = "could not run";
    if (best_of[0] >= 0 && best_of[0] != INFINITY) snprintf(first, sizeof first, "%.4f ms", best_of[0]);
    log_info("cuBLASLt: the %d x %d x %d product%s: candidate %d of %d is the fastest, %.4f ms "
             "(the heuristic's first: %s)\n", p->m, p->n, p->k,
             p->epi == EPI_GELU_AUX ? " + GELU" : p->epi == EPI_DGELU ? " * GELU'" : "",
             pick + 1, p->n_candidates, best_of[pick], first);
}

void cuda_matmul_plans(long *made, long *dropped) {
    *made = g.made;
    *dropped = g.evicted;
}

void cuda_matmul_tuning(int *tuned, int *cached, int *not_first) {
    *tuned = g.n_tuned;
    *cached = g.n_cached;
    *not_first = g.n_not_first;
}

static plan *find_plan(const plan *key) {
    for (int i = 0; i < PLAN_SLOTS; i++) {
        plan *q = &g.plans[i];
        if (q->used && q->ta == key->ta && q->tb == key->tb && q->m == key->m && q->n == key->n &&
            q->k == key->k && q->lda == key->lda && q->ldb == key->ldb && q->ldc == key->ldc &&
            q->bias == key->bias && q->accumulate == key->accumulate && q->ab_type == key->ab_type &&
            q->c_type == key->c_type &&
            q->epi == key->epi && q->ldaux == key->ldaux &&
            memcmp(q->align, key->align, sizeof q->align) == 0) {
            q->last_use = ++g.use_clock;
            return q;
        }
    }
    plan *p = make_plan(key);
    p->last_use = ++g.use_clock;
    return p;
}

/* 1 when every matrix of the product has rows of whole 16-byte groups on 16 bytes */
static int rows_aligned16(int m, const void *A, int lda, const void *B, int ldb, const void *C,
                          int ldc) {
    return m % 8 == 0 && lda % 8 == 0 && ldb % 8 == 0 && ldc % 8 == 0 && alignment(A) >= 16 &&
           alignment(B) >= 16 && alignment(C) >= 16;
}

/* C (m x n, column-major, of type c_type) = op(A) @ op(B) (+ C when accumulate)
 * (+ bias[m] per column), A and B of the activation type, the bias of C's, through the
 * epilogue epi with its aux matrix (m x n, leading dimension ldaux, of C's type): for
 * EPI_GELU_AUX, aux = the product (+ bias) and C = gelu(aux); for EPI_DGELU,
 * C = product * gelu'(aux). Returns 0 when cuBLASLt cannot fuse that epilogue here (then
 * nothing ran), else 1. */
static int gemm_epi(int ta, int tb, int m, int n, int k, const gptc_act *A, int lda,
                    const gptc_act *B, int ldb, void *C, int ldc, cudaDataType_t c_type,
                    int accumulate, const gptc_act *bias, int epi, const gptc_act *aux, int ldaux,
                    cudaStream_t s) {
    if (m == 0 || n == 0) return 1;
    /* cuBLASLt wants the aux leading dimension divisible by 8 elements (fp32 or bf16
     * alike) and, for its vector loads, an aux matrix on 16 bytes */
    if (epi != EPI_NONE && (ldaux % 8 != 0 || alignment(aux) < 16)) return 0;
    /* nor, under bf16, with rows of partial 16-byte groups, whose kernels round the product
     * before the epilogue (gemm) */
    if (epi != EPI_NONE && g.act == CUDA_R_16BF && !rows_aligned16(m, A, lda, B, ldb, C, ldc))
        return 0;
    /* nor with a bias off 16 bytes (gemm) */
    if (epi != EPI_NONE && bias && alignment(bias) < 16) return 0;
    plan key = {0};
    key.ta = ta, key.tb = tb, key.m = m, key.n = n, key.k = k;
    key.lda = lda, key.ldb = ldb, key.ldc = ldc, key.bias = bias != NULL;
    key.accumulate = accumulate;
    key.epi = epi, key.ldaux = epi != EPI_NONE ? ldaux : 0;
    key.ab_type = g.act, key.c_type = c_type;
    key.align[0] = alignment(A), key.align[1] = alignment(B), key.align[2] = alignment(C);
    key.align[3] = bias ? alignment(bias) : 0;
    plan *p = find_plan(&key);
    if (p->unfused) return 0;
    if (bias) set_op(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
    if (epi != EPI_NONE) set_op(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux);
    float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    if (!p->tuned) tune_plan(p, A, B, C, beta, s);
    lt_check(g.api.matmul(g.lt, p->op, &alpha, A, p->a, B, p->b, &beta, C, p->c, C, p->c,
                            &p->algo, g.workspace, WORKSPACE_BYTES, s), "cublasLtMatmul");
    return 1;
}

/* op(A) @ op(B) into a new fp32 scratch (column-major m x n, packed, m and n > 0), for an
 * epilogue a kernel does; the caller frees it (cudaFreeAsync on s) */
static float *gemm_fp32(int ta, int tb, int m, int n, int k, const gptc_act *A, int lda,
                        const gptc_act *B, int ldb, cudaStream_t s) {
    float *tmp = NULL; /* [n, m] the unrounded product */
    cuda_check(cudaMallocAsync((void **)&tmp, (size_t)m * n * sizeof(float), s),
               "cudaMallocAsync (a product's fp32 scratch)");
    gemm_epi(ta, tb, m, n, k, A, lda, B, ldb, tmp, m, CUDA_R_32F, 0, NULL, EPI_NONE, NULL, 0, s);
    return tmp;
}

/* an activation-type product: C of the activation type, overwritten.
 * The bias gets a pass of its own (the product to an fp32 scratch, then cuda_bias_round
 * adds the bias and rounds once) where cuBLASLt's epilogue would not do: under bf16, for
 * matrices whose rows are not whole 16-byte groups, cuBLASLt 13's kernels add the bias to
 * the product already rounded to bf16 (an H200 run of test_cuda_ops: 33x7x5 with bias
 * 4.6x one rounding off, 37x45x100 36x, where the bias cancels most of the product); and
 * for a bias off 16 bytes, which the plan's alignment preferences (A, B, C, D) do not
 * cover and a kernel loading it 16 bytes at a time would fault on. GPT-2's shapes, with
 * the buffers' tensors on 256 bytes (layers/gpt.c: cut_buckets), take neither. */
static void gemm(int ta, int tb, int m, int n, int k, const gptc_act *A, int lda,
                 const gptc_act *B, int ldb, gptc_act *C, int ldc, const gptc_act *bias,
                 cudaStream_t s) {
    if (bias && m > 0 && n > 0 &&
        (alignment(bias) < 16 ||
         (g.act == CUDA_R_16BF && !rows_aligned16(m, A, lda, B, ldb, C, ldc)))) {
        float *tmp = gemm_fp32(ta, tb, m, n, k, A, lda, B, ldb, s); /* [n, m] */
        cuda_bias_round(C, ldc, tmp, bias, m, n, g.precision, s);
        cuda_check(cudaFreeAsync(tmp, s), "cudaFreeAsync");
        return;
    }
    gemm_epi(ta, tb, m, n, k, A, lda, B, ldb, C, ldc, g.act, 0, bias, EPI_NONE, NULL, 0, s);
}

/* a weight gradient: fp32 C += op(A) @ op(B) */
static void gemm_grad(int ta, int tb, int m, int n, int k, const gptc_act *A, int lda,
                      const gptc_act *B, int ldb, float *C, int ldc, cudaStream_t s) {
    gemm_epi(ta, tb, m, n, k, A, lda, B, ldb, C, ldc, CUDA_R_32F, 1, NULL, EPI_NONE, NULL, 0, s);
}

void cuda_matmul_forward(gptc_act *out, const gptc_act *inp, const gptc_act *w,
                         const gptc_act *bias, int N, int IC, int OC, int w_rows_out,
                         cudaStream_t s) {
    /* out^T (OC x N) = W^T (OC x IC) @ inp^T (IC x N) */
    if (w_rows_out) /* w is [OC,IC]: column-major IC x OC, transposed */
        gemm(1, 0, OC, N, IC, w, IC, inp, IC, out, OC, bias, s);
    else            /* w is [IC,OC]: column-major OC x IC as it lies */
        gemm(0, 0, OC, N, IC, w, OC, inp, IC, out, OC, bias, s);
}

void cuda_matmul_backward(gptc_act *dinp, float *dw, const gptc_act *dout, const gptc_act *inp,
                          const gptc_act *w, int N, int IC, int OC, int w_rows_out,
                          cudaStream_t s) {
    if (dinp) { /* dinp^T (IC x N) = W (IC x OC) @ dout^T (OC x N) */
        if (w_rows_out)
            gemm(0, 0, IC, N, OC, w, IC, dout, OC, dinp, IC, NULL, s);
        else
            gemm(1, 0, IC, N, OC, w, OC, dout, OC, dinp, IC, NULL, s);
    }
    if (dw) {
        if (w_rows_out) /* dw [OC,IC] = column-major IC x OC: inp^T (IC x N) @ dout (N x OC) */
            gemm_grad(0, 1, IC, OC, N, inp, IC, dout, OC, dw, IC, s);
        else            /* dw [IC,OC] = column-major OC x IC: dout^T (OC x N) @ inp (N x IC) */
            gemm_grad(0, 1, OC, IC, N, dout, OC, inp, IC, dw, OC, s);
    }
}

void cuda_matmul_gelu_forward(gptc_act *out, gptc_act *pre, const gptc_act *inp,
                              const gptc_act *w, const gptc_act *bias, int N, int IC, int OC,
                              cudaStream_t s) {
    /* out^T = gelu(W^T @ inp^T + bias), pre^T the argument: both column-major OC x N */
    if (gemm_epi(0, 0, OC, N, IC, w, OC, inp, IC, out, OC, g.act, 0, bias, EPI_GELU_AUX, pre,
                 OC, s))
        return;
    if (g.act == CUDA_R_16BF && N > 0 && OC > 0) {
        /* the GELU of the fp32 sum, as the epilogue takes it, not of pre rounded */
        float *tmp = gemm_fp32(0, 0, OC, N, IC, w, OC, inp, IC, s); /* [N, OC] */
        cuda_bias_gelu_round(out, pre, tmp, bias, OC, (size_t)N * OC, g.precision, s);
        cuda_check(cudaFreeAsync(tmp, s), "cudaFreeAsync");
        return;
    }
    gemm(0, 0, OC, N, IC, w, OC, inp, IC, pre, OC, bias, s); /* fp32: pre is the sum itself */
    cuda_gelu_forward(out, pre, (size_t)N * OC, g.precision, s);
}

void cuda_matmul_dgelu_backward(gptc_act *dpre, const gptc_act *dout, const gptc_act *w,
                                const gptc_act *pre, int N, int IC, int OC, cudaStream_t s) {
    /* dpre^T (IC x N) = (W (IC x OC) @ dout^T (OC x N)) * gelu'(pre^T) */
    if (gemm_epi(1, 0, IC, N, OC, w, OC, dout, OC, dpre, IC, g.act, 0, NULL, EPI_DGELU, pre, IC,
                 s))
        return;
    if (g.act == CUDA_R_16BF && N > 0 && IC > 0) {
        /* gelu' times the fp32 product, as the epilogue takes it, not the product rounded */
        float *tmp = gemm_fp32(1, 0, IC, N, OC, w, OC, dout, OC, s); /* [N, IC] */
        cuda_dgelu_round(dpre, tmp, pre, (size_t)N * IC, g.precision, s);
        cuda_check(cudaFreeAsync(tmp, s), "cudaFreeAsync");
        return;
    }
    gemm(1, 0, IC, N, OC, w, OC, dout, OC, dpre, IC, NULL, s); /* fp32: exact as it is */
    cuda_gelu_backward(dpre, pre, dpre, (size_t)N * IC, g.precision, s);
}
