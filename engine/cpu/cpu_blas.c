#define _GNU_SOURCE /* setenv, dlopen */
#include "engine/cpu/cpu_blas.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

typedef void (*sgemm_fn)(enum CBLAS_ORDER, enum CBLAS_TRANSPOSE, enum CBLAS_TRANSPOSE, int, int,
                         int, float, const float *, int, const float *, int, float, float *, int);
typedef char *(*corename_fn)(void);

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static sgemm_fn g_sgemm;
static corename_fn g_corename;
static int g_status = -1;
static char g_why[512]; /* why the load failed */

/* The newest kernel family of OpenBLAS 0.3.x that this CPU can run, or NULL to let
 * OpenBLAS decide. */
static const char *core_for_this_cpu(void) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512cd"))
        return "SkylakeX";
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
    return NULL;
}

static void load(void) {
    /* a user's OPENBLAS_CORETYPE stands (the start-up line names the family that runs); an
     * empty one is unset, which OpenBLAS would take for "detect it" */
    const char *core = core_for_this_cpu(), *set = getenv("OPENBLAS_CORETYPE");
    if (core && (!set || !*set)) setenv("OPENBLAS_CORETYPE", core, 1);
    else if (set && !*set) unsetenv("OPENBLAS_CORETYPE");
    const char *candidates[] = {GPTC_OPENBLAS_PATH, "libopenblas.so.0", "libopenblas.so"};
    void *lib = NULL;
    char first[384] = ""; /* why the build's own OpenBLAS did not load */
    for (size_t i = 0; i < sizeof(candidates) / sizeof(candidates[0]) && !lib; i++) {
        lib = dlopen(candidates[i], RTLD_NOW | RTLD_GLOBAL);
        const char *e = lib ? NULL : dlerror();
        if (i == 0 && e) snprintf(first, sizeof first, "%s", e);
    }
    if (!lib) {
        snprintf(g_why, sizeof g_why, "cannot load OpenBLAS: %s", first);
        return;
    }
    g_sgemm = (sgemm_fn)dlsym(lib, "cblas_sgemm");
    g_corename = (corename_fn)dlsym(lib, "openblas_get_corename");
    if (!g_sgemm) {
        snprintf(g_why, sizeof g_why, "%s has no cblas_sgemm", GPTC_OPENBLAS_PATH);
        return;
    }
    g_status = 0;
}

int cpu_blas_init(void) {
    pthread_once(&g_once, load);
    return g_status;
}

const char *cpu_blas_error(void) { return g_why; }

const char *cpu_blas_corename(void) {
    return g_corename ? g_corename() : "unknown";
}

void cpu_sgemm(enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int M, int N, int K,
               float alpha, const float *A, int lda, const float *B, int ldb, float beta,
               float *C, int ldc) {
    g_sgemm(CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
