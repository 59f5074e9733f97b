/* engine/cuda/cublaslt_load.c on the real cuBLASLt, without a GPU (CUDA builds only):
 * the process starts without the library (nothing links it: its start-up is what the
 * loader saves), the load brings it in and fills every entry, and the entries called
 * answer as the header's library would (the version's major is the header's, a status
 * is described). */
#define _GNU_SOURCE /* RTLD_NOLOAD */
#include "engine/cuda/cublaslt_api.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

static int failures;

static void check(int ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "FAIL: %s\n", what);
        failures++;
    }
}

static int loaded(void) {
    void *h = dlopen(GPTC_CUBLASLT_SONAME, RTLD_NOW | RTLD_NOLOAD);
    if (h) dlclose(h);
    return h != NULL;
}

int main(void) {
    check(!loaded(), "cuBLASLt is in the process before cublaslt_load (linked again?)");
    cublaslt_api api;
    memset(&api, 0, sizeof api);
    char err[512] = "";
    int rc = cublaslt_load(&api, err, sizeof err);
    if (rc != 0) fprintf(stderr, "%s\n", err);
    check(rc == 0, "cublaslt_load failed");
    if (rc != 0) return 1;
    check(loaded(), "cuBLASLt is not in the process after cublaslt_load");
    void *entries[sizeof api / sizeof(void *)];
    memcpy(entries, &api, sizeof api);
    for (size_t i = 0; i < sizeof entries / sizeof entries[0]; i++) {
        char what[64];
        snprintf(what, sizeof what, "entry %zu of cublaslt_api is empty", i);
        check(entries[i] != NULL, what);
    }
    size_t version = api.version();
    printf("cuBLASLt version %zu (the header's: %d)\n", version, CUBLAS_VERSION);
    check(version / 10000 == CUBLAS_VER_MAJOR, "the library's major version is not the header's");
    const char *name = api.status_string(CUBLAS_STATUS_NOT_SUPPORTED);
    printf("CUBLAS_STATUS_NOT_SUPPORTED: %s\n", name ? name : "(null)");
    check(name && strstr(name, "not supported") != NULL,
          "cublasLtGetStatusString does not say CUBLAS_STATUS_NOT_SUPPORTED is not supported");
    /* a second load (a backend started again in one process) fills the same table */
    cublaslt_api again;
    check(cublaslt_load(&again, err, sizeof err) == 0 && memcmp(&again, &api, sizeof api) == 0,
          "a second cublaslt_load gives another table");
    if (failures) return 1;
    printf("test_cublaslt_load: ok\n");
    return 0;
}
