/* Test tool, not part of the engine: the part of cuBLASLt's <cublasLt.h> that
 * engine/cuda/cuda_matmul.c uses, for the fake cuBLASLt of tests/cuda_emu
 * (fake_cublaslt.c, which says what it computes and checks). Enum values are the real
 * library's. Symbols are renamed to emu_* so that a build that also links the real
 * library never mixes the two. */
#ifndef GPTC_CUDA_EMU_CUBLASLT_H
#define GPTC_CUDA_EMU_CUBLASLT_H

#include "cuda_runtime_api.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_ALLOC_FAILED = 3,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_ARCH_MISMATCH = 8,
    CUBLAS_STATUS_MAPPING_ERROR = 11,
    CUBLAS_STATUS_EXECUTION_FAILED = 13,
    CUBLAS_STATUS_INTERNAL_ERROR = 14,
    CUBLAS_STATUS_NOT_SUPPORTED = 15
} cublasStatus_t;

/* library_types.h */
typedef enum cudaDataType_t { CUDA_R_32F = 0, CUDA_R_64F = 1, CUDA_R_16F = 2, CUDA_R_16BF = 14 } cudaDataType;
typedef cudaDataType cudaDataType_t;

typedef enum {
    CUBLAS_COMPUTE_16F = 64,
    CUBLAS_COMPUTE_32F = 68,
    CUBLAS_COMPUTE_32F_FAST_16F = 74,
    CUBLAS_COMPUTE_32F_FAST_16BF = 75,
    CUBLAS_COMPUTE_32F_FAST_TF32 = 77,
    CUBLAS_COMPUTE_64F = 70
} cublasComputeType_t;

typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1, CUBLAS_OP_C = 2 } cublasOperation_t;

typedef enum {
    CUBLASLT_MATMUL_DESC_COMPUTE_TYPE = 0,
    CUBLASLT_MATMUL_DESC_SCALE_TYPE = 1,
    CUBLASLT_MATMUL_DESC_POINTER_MODE = 2,
    CUBLASLT_MATMUL_DESC_TRANSA = 3,
    CUBLASLT_MATMUL_DESC_TRANSB = 4,
    CUBLASLT_MATMUL_DESC_TRANSC = 5,
    CUBLASLT_MATMUL_DESC_FILL_MODE = 6,
    CUBLASLT_MATMUL_DESC_EPILOGUE = 7,
    CUBLASLT_MATMUL_DESC_BIAS_POINTER = 8,
    CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER = 11,
    CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD = 12,
    CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE = 22,
    CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE = 26
} cublasLtMatmulDescAttributes_t;

typedef enum {
    CUBLASLT_EPILOGUE_DEFAULT = 1,
    CUBLASLT_EPILOGUE_RELU = 2,
    CUBLASLT_EPILOGUE_BIAS = 4,
    CUBLASLT_EPILOGUE_RELU_BIAS = 6,
    CUBLASLT_EPILOGUE_GELU = 32,
    CUBLASLT_EPILOGUE_GELU_BIAS = 36,
    CUBLASLT_EPILOGUE_GELU_AUX = 160,
    CUBLASLT_EPILOGUE_GELU_AUX_BIAS = 164,
    CUBLASLT_EPILOGUE_DGELU = 192
} cublasLtEpilogue_t;

typedef enum {
    CUBLASLT_MATMUL_PREF_SEARCH_MODE = 0,
    CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 6,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 7,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 8
} cublasLtMatmulPreferenceAttributes_t;

typedef struct cublasLtContext *cublasLtHandle_t;
typedef struct cublasLtMatmulDescOpaque_st *cublasLtMatmulDesc_t;
typedef struct cublasLtMatrixLayoutOpaque_st *cublasLtMatrixLayout_t;
typedef struct cublasLtMatmulPreferenceOpaque_st *cublasLtMatmulPreference_t;

/* opaque, copied by value as in the real library (8 x 64 bits there too) */
typedef struct {
    uint64_t data[8];
} cublasLtMatmulAlgo_t;

typedef struct {
    cublasLtMatmulAlgo_t algo;
    size_t workspaceSize;
    cublasStatus_t state;
    float wavesCount;
    int reserved[4];
} cublasLtMatmulHeuristicResult_t;

#define cublasLtCreate emu_cublasLtCreate
#define cublasLtDestroy emu_cublasLtDestroy
#define cublasLtGetStatusString emu_cublasLtGetStatusString
#define cublasLtGetVersion emu_cublasLtGetVersion
#define cublasLtMatmulDescCreate emu_cublasLtMatmulDescCreate
#define cublasLtMatmulDescDestroy emu_cublasLtMatmulDescDestroy
#define cublasLtMatmulDescSetAttribute emu_cublasLtMatmulDescSetAttribute
#define cublasLtMatrixLayoutCreate emu_cublasLtMatrixLayoutCreate
#define cublasLtMatrixLayoutDestroy emu_cublasLtMatrixLayoutDestroy
#define cublasLtMatmulPreferenceCreate emu_cublasLtMatmulPreferenceCreate
#define cublasLtMatmulPreferenceDestroy emu_cublasLtMatmulPreferenceDestroy
#define cublasLtMatmulPreferenceSetAttribute emu_cublasLtMatmulPreferenceSetAttribute
#define cublasLtMatmulAlgoGetHeuristic emu_cublasLtMatmulAlgoGetHeuristic
#define cublasLtMatmul emu_cublasLtMatmul

cublasStatus_t emu_cublasLtCreate(cublasLtHandle_t *handle);
cublasStatus_t emu_cublasLtDestroy(cublasLtHandle_t handle);
const char *emu_cublasLtGetStatusString(cublasStatus_t status);
size_t emu_cublasLtGetVersion(void);
cublasStatus_t emu_cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *desc, cublasComputeType_t computeType,
                                            cudaDataType_t scaleType);
cublasStatus_t emu_cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc);
cublasStatus_t emu_cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                                  cublasLtMatmulDescAttributes_t attr,
                                                  const void *buf, size_t sizeInBytes);
cublasStatus_t emu_cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *layout, cudaDataType type,
                                              uint64_t rows, uint64_t cols, int64_t ld);
cublasStatus_t emu_cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout);
cublasStatus_t emu_cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref);
cublasStatus_t emu_cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref);
cublasStatus_t emu_cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                        cublasLtMatmulPreferenceAttributes_t attr,
                                                        const void *buf, size_t sizeInBytes);
cublasStatus_t emu_cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc, cublasLtMatrixLayout_t Adesc,
    cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
    cublasLtMatmulPreference_t preference, int requestedAlgoCount,
    cublasLtMatmulHeuristicResult_t heuristicResultsArray[], int *returnAlgoCount);
cublasStatus_t emu_cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc,
                                  const void *alpha, const void *A, cublasLtMatrixLayout_t Adesc,
                                  const void *B, cublasLtMatrixLayout_t Bdesc, const void *beta,
                                  const void *C, cublasLtMatrixLayout_t Cdesc, void *D,
                                  cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t *algo,
                                  void *workspace, size_t workspaceSizeInBytes, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
