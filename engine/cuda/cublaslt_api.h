/* The cuBLASLt entry points cuda_matmul.c calls, reached through a table filled at the
 * CUDA backend's start instead of linked: libcublasLt's static constructors cost every
 * process that links it 0.4 s of start-up (an empty program linked against it alone,
 * on CI's 2-core machine), GPU or not, and most processes of a CUDA build never multiply
 * on the GPU (every CPU run, every test). cublaslt_load.c fills it with dlopen; the
 * emulator's fake cuBLASLt (tests/cuda_emu/fake_cublaslt.c) with its own functions. The
 * function types are cublasLt.h's: cublaslt_load.c checks them against it at compile
 * time. */
#ifndef GPTC_CUBLASLT_API_H
#define GPTC_CUBLASLT_API_H

#include <cublasLt.h>
#include <stddef.h>
#include <stdint.h>

typedef cublasStatus_t lt_create_fn(cublasLtHandle_t *handle);
typedef const char *lt_status_string_fn(cublasStatus_t status);
typedef size_t lt_version_fn(void);
typedef cublasStatus_t lt_desc_create_fn(cublasLtMatmulDesc_t *desc, cublasComputeType_t compute,
                                         cudaDataType_t scale);
typedef cublasStatus_t lt_desc_destroy_fn(cublasLtMatmulDesc_t desc);
typedef cublasStatus_t lt_desc_set_fn(cublasLtMatmulDesc_t desc,
                                      cublasLtMatmulDescAttributes_t attr, const void *buf,
                                      size_t size);
typedef cublasStatus_t lt_layout_create_fn(cublasLtMatrixLayout_t *layout, cudaDataType type,
                                           uint64_t rows, uint64_t cols, int64_t ld);
typedef cublasStatus_t lt_layout_destroy_fn(cublasLtMatrixLayout_t layout);
typedef cublasStatus_t lt_pref_create_fn(cublasLtMatmulPreference_t *pref);
typedef cublasStatus_t lt_pref_destroy_fn(cublasLtMatmulPreference_t pref);
typedef cublasStatus_t lt_pref_set_fn(cublasLtMatmulPreference_t pref,
                                      cublasLtMatmulPreferenceAttributes_t attr, const void *buf,
                                      size_t size);
typedef cublasStatus_t lt_heuristic_fn(cublasLtHandle_t lt, cublasLtMatmulDesc_t desc,
                                       cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                       cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                       cublasLtMatmulPreference_t pref, int requested,
                                       cublasLtMatmulHeuristicResult_t results[], int *returned);
typedef cublasStatus_t lt_matmul_fn(cublasLtHandle_t lt, cublasLtMatmulDesc_t desc,
                                    const void *alpha, const void *A, cublasLtMatrixLayout_t a,
                                    const void *B, cublasLtMatrixLayout_t b, const void *beta,
                                    const void *C, cublasLtMatrixLayout_t c, void *D,
                                    cublasLtMatrixLayout_t d, const cublasLtMatmulAlgo_t *algo,
                                    void *workspace, size_t workspace_bytes, cudaStream_t stream);

/* each field the cuBLASLt function of its name: create is cublasLtCreate, desc_* are
 * cublasLtMatmulDesc*, layout_* cublasLtMatrixLayout*, pref_* cublasLtMatmulPreference*,
 * heuristic cublasLtMatmulAlgoGetHeuristic */
typedef struct {
    lt_create_fn *create;
    lt_status_string_fn *status_string;
    lt_version_fn *version;
    lt_desc_create_fn *desc_create;
    lt_desc_destroy_fn *desc_destroy;
    lt_desc_set_fn *desc_set;
    lt_layout_create_fn *layout_create;
    lt_layout_destroy_fn *layout_destroy;
    lt_pref_create_fn *pref_create;
    lt_pref_destroy_fn *pref_destroy;
    lt_pref_set_fn *pref_set;
    lt_heuristic_fn *heuristic;
    lt_matmul_fn *matmul;
} cublaslt_api;

/* Fills api; 0, or -1 with err set to one line naming the library or the entry point
 * that could not be found. */
int cublaslt_load(cublaslt_api *api, char *err, size_t errlen);

#endif
