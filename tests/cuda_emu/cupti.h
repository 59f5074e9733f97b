/* Test tool, not part of the engine: the part of CUPTI's <cupti.h> that
 * engine/cuda/timer_cupti.c uses, for the fake CUPTI of tests/cuda_emu (fake_cupti.c).
 * Enum values and the offsets of the record fields the engine reads are the real
 * library's (CUDA 13); the rest of each record is padding. Symbols are renamed to emu_*
 * so that a build that also links the real library never mixes the two. */
#ifndef GPTC_CUDA_EMU_CUPTI_H
#define GPTC_CUDA_EMU_CUPTI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CUPTIAPI

typedef struct CUctx_st *CUcontext;

typedef enum {
    CUPTI_SUCCESS = 0,
    CUPTI_ERROR_INVALID_PARAMETER = 1,
    CUPTI_ERROR_MAX_LIMIT_REACHED = 12,
    CUPTI_ERROR_NOT_INITIALIZED = 15,
    CUPTI_ERROR_INVALID_KIND = 21,
    CUPTI_ERROR_NOT_SUPPORTED = 27,
    CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED = 39,
    CUPTI_ERROR_UNKNOWN = 999
} CUptiResult;

typedef enum {
    CUPTI_ACTIVITY_KIND_INVALID = 0,
    CUPTI_ACTIVITY_KIND_MEMCPY = 1,
    CUPTI_ACTIVITY_KIND_MEMSET = 2,
    CUPTI_ACTIVITY_KIND_KERNEL = 3,
    CUPTI_ACTIVITY_KIND_DRIVER = 4,
    CUPTI_ACTIVITY_KIND_RUNTIME = 5,
    CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL = 10,
    CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION = 39
} CUpti_ActivityKind;

typedef enum {
    CUPTI_EXTERNAL_CORRELATION_KIND_INVALID = 0,
    CUPTI_EXTERNAL_CORRELATION_KIND_UNKNOWN = 1,
    CUPTI_EXTERNAL_CORRELATION_KIND_OPENACC = 2,
    CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0 = 3,
    CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM1 = 4,
    CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM2 = 5
} CUpti_ExternalCorrelationKind;

typedef enum { CUPTI_ACTIVITY_FLAG_NONE = 0, CUPTI_ACTIVITY_FLAG_FLUSH_FORCED = 1 } CUpti_ActivityFlag;

typedef struct {
    CUpti_ActivityKind kind;
} CUpti_Activity;

/* start at 16, end at 24, correlationId at 92, name at 104, as in every
 * CUpti_ActivityKernelN */
typedef struct {
    CUpti_ActivityKind kind;
    uint8_t pad0[12];
    uint64_t start, end;
    uint8_t pad1[60];
    uint32_t correlationId;
    uint8_t pad2[8];
    const char *name;
    uint8_t pad3[24];
} CUpti_ActivityKernel4;

/* copyKind at 4 (a memcpy's), start at 16, end at 24, correlationId at 44, as in every
 * Memcpy and Memset record */
typedef struct {
    CUpti_ActivityKind kind;
    uint8_t copyKind;
    uint8_t pad0[11];
    uint64_t start, end;
    uint8_t pad1[12];
    uint32_t correlationId;
    uint8_t pad2[16];
} CUpti_ActivityMemcpy;
typedef CUpti_ActivityMemcpy CUpti_ActivityMemset;

/* a runtime or driver API call (CUpti_ActivityAPI) */
typedef struct {
    CUpti_ActivityKind kind;
    uint32_t cbid;
    uint64_t start, end;
    uint32_t processId, threadId;
    uint32_t correlationId;
    uint32_t returnValue;
} CUpti_ActivityAPI;

typedef struct {
    CUpti_ActivityKind kind;
    CUpti_ExternalCorrelationKind externalKind;
    uint64_t externalId;
    uint32_t correlationId;
    uint32_t reserved;
} CUpti_ActivityExternalCorrelation;

typedef void (*CUpti_BuffersCallbackRequestFunc)(uint8_t **buffer, size_t *size, size_t *maxNumRecords);
typedef void (*CUpti_BuffersCallbackCompleteFunc)(CUcontext context, uint32_t streamId, uint8_t *buffer,
                                                  size_t size, size_t validSize);

#define cuptiGetResultString emu_cuptiGetResultString
#define cuptiActivityRegisterCallbacks emu_cuptiActivityRegisterCallbacks
#define cuptiActivityEnable emu_cuptiActivityEnable
#define cuptiActivityDisable emu_cuptiActivityDisable
#define cuptiActivityFlushAll emu_cuptiActivityFlushAll
#define cuptiGetTimestamp emu_cuptiGetTimestamp
#define cuptiActivityPushExternalCorrelationId emu_cuptiActivityPushExternalCorrelationId
#define cuptiActivityPopExternalCorrelationId emu_cuptiActivityPopExternalCorrelationId
#define cuptiActivityGetNextRecord emu_cuptiActivityGetNextRecord
#define cuptiActivityGetNumDroppedRecords emu_cuptiActivityGetNumDroppedRecords

CUptiResult emu_cuptiGetResultString(CUptiResult result, const char **str);
CUptiResult emu_cuptiActivityRegisterCallbacks(CUpti_BuffersCallbackRequestFunc request,
                                               CUpti_BuffersCallbackCompleteFunc complete);
CUptiResult emu_cuptiActivityEnable(CUpti_ActivityKind kind);
CUptiResult emu_cuptiActivityDisable(CUpti_ActivityKind kind);
CUptiResult emu_cuptiActivityFlushAll(uint32_t flag);
CUptiResult emu_cuptiGetTimestamp(uint64_t *timestamp);
CUptiResult emu_cuptiActivityPushExternalCorrelationId(CUpti_ExternalCorrelationKind kind, uint64_t id);
CUptiResult emu_cuptiActivityPopExternalCorrelationId(CUpti_ExternalCorrelationKind kind, uint64_t *lastId);
CUptiResult emu_cuptiActivityGetNextRecord(uint8_t *buffer, size_t validBufferSizeBytes,
                                           CUpti_Activity **record);
CUptiResult emu_cuptiActivityGetNumDroppedRecords(CUcontext context, uint32_t streamId, size_t *dropped);

#ifdef __cplusplus
}
#endif

#endif
