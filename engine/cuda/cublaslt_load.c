/* cuBLASLt opened with dlopen (cublaslt_api.h says why): first the library CMake found
 * (GPTC_CUBLASLT_PATH, the build machine's), then by its soname (GPTC_CUBLASLT_SONAME)
 * through the loader's search path, for a binary moved to a machine whose toolkit lies
 * elsewhere. */
#define _POSIX_C_SOURCE 200809L
#include "engine/cuda/cublaslt_api.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#ifndef GPTC_CUBLASLT_PATH
#error "GPTC_CUBLASLT_PATH: CMakeLists.txt defines it as the cuBLASLt library it found"
#endif

/* the table's types are the header's (an unevaluated _Generic: no reference to link) */
_Static_assert(_Generic(cublasLtCreate, lt_create_fn *: 1, default: 0), "cublasLtCreate");
_Static_assert(_Generic(cublasLtGetStatusString, lt_status_string_fn *: 1, default: 0),
               "cublasLtGetStatusString");
_Static_assert(_Generic(cublasLtGetVersion, lt_version_fn *: 1, default: 0),
               "cublasLtGetVersion");
_Static_assert(_Generic(cublasLtMatmulDescCreate, lt_desc_create_fn *: 1, default: 0),
               "cublasLtMatmulDescCreate");
_Static_assert(_Generic(cublasLtMatmulDescDestroy, lt_desc_destroy_fn *: 1, default: 0),
               "cublasLtMatmulDescDestroy");
_Static_assert(_Generic(cublasLtMatmulDescSetAttribute, lt_desc_set_fn *: 1, default: 0),
               "cublasLtMatmulDescSetAttribute");
_Static_assert(_Generic(cublasLtMatrixLayoutCreate, lt_layout_create_fn *: 1, default: 0),
               "cublasLtMatrixLayoutCreate");
_Static_assert(_Generic(cublasLtMatrixLayoutDestroy, lt_layout_destroy_fn *: 1, default: 0),
               "cublasLtMatrixLayoutDestroy");
_Static_assert(_Generic(cublasLtMatmulPreferenceCreate, lt_pref_create_fn *: 1, default: 0),
               "cublasLtMatmulPreferenceCreate");
_Static_assert(_Generic(cublasLtMatmulPreferenceDestroy, lt_pref_destroy_fn *: 1, default: 0),
               "cublasLtMatmulPreferenceDestroy");
_Static_assert(_Generic(cublasLtMatmulPreferenceSetAttribute, lt_pref_set_fn *: 1, default: 0),
               "cublasLtMatmulPreferenceSetAttribute");
_Static_assert(_Generic(cublasLtMatmulAlgoGetHeuristic, lt_heuristic_fn *: 1, default: 0),
               "cublasLtMatmulAlgoGetHeuristic");
_Static_assert(_Generic(cublasLtMatmul, lt_matmul_fn *: 1, default: 0), "cublasLtMatmul");
_Static_assert(sizeof(void *) == sizeof(lt_matmul_fn *), "dlsym's pointers hold functions");

static const struct {
    const char *name;
    size_t at; /* the field's offset in cublaslt_api */
} ENTRIES[] = {
    {"cublasLtCreate", offsetof(cublaslt_api, create)},
    {"cublasLtGetStatusString", offsetof(cublaslt_api, status_string)},
    {"cublasLtGetVersion", offsetof(cublaslt_api, version)},
    {"cublasLtMatmulDescCreate", offsetof(cublaslt_api, desc_create)},
    {"cublasLtMatmulDescDestroy", offsetof(cublaslt_api, desc_destroy)},
    {"cublasLtMatmulDescSetAttribute", offsetof(cublaslt_api, desc_set)},
    {"cublasLtMatrixLayoutCreate", offsetof(cublaslt_api, layout_create)},
    {"cublasLtMatrixLayoutDestroy", offsetof(cublaslt_api, layout_destroy)},
    {"cublasLtMatmulPreferenceCreate", offsetof(cublaslt_api, pref_create)},
    {"cublasLtMatmulPreferenceDestroy", offsetof(cublaslt_api, pref_destroy)},
    {"cublasLtMatmulPreferenceSetAttribute", offsetof(cublaslt_api, pref_set)},
    {"cublasLtMatmulAlgoGetHeuristic", offsetof(cublaslt_api, heuristic)},
    {"cublasLtMatmul", offsetof(cublaslt_api, matmul)},
};

int cublaslt_load(cublaslt_api *api, char *err, size_t errlen) {
    /* RTLD_LOCAL: its symbols stay out of the process's namespace, as a linked library's
     * would not, so nothing else binds to them by accident */
    void *lib = dlopen(GPTC_CUBLASLT_PATH, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        char first[256];
        snprintf(first, sizeof first, "%s", dlerror());
        lib = dlopen(GPTC_CUBLASLT_SONAME, RTLD_NOW | RTLD_LOCAL);
        if (!lib) {
            snprintf(err, errlen,
                     "train.device = cuda: cannot load cuBLASLt: %s; nor by its soname: %s",
                     first, dlerror());
            return -1;
        }
    }
    memset(api, 0, sizeof *api);
    for (size_t i = 0; i < sizeof ENTRIES / sizeof ENTRIES[0]; i++) {
        void *fn = dlsym(lib, ENTRIES[i].name);
        if (!fn) {
            snprintf(err, errlen, "train.device = cuda: the cuBLASLt library has no %s (%s)",
                     ENTRIES[i].name, dlerror());
            return -1;
        }
        /* POSIX: a data pointer from dlsym holds the function's address; copied as bytes
         * into its typed field */
        memcpy((char *)api + ENTRIES[i].at, &fn, sizeof fn);
    }
    return 0;
}
