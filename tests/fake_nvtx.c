/* An NVTX tool, as Nsight Systems is one: NVTX_INJECTION64_PATH names this library, whose
 * InitializeInjectionNvtx2 the NVTX headers in gptc call at its first range. It takes the
 * core module's RangePushA and RangePop and writes each as a line, "push TID NAME" and
 * "pop TID", to the file $GPTC_FAKE_NVTX_OUT.<pid> (one a rank), so that a test can read
 * which ranges gptc opened, on which thread, and whether each was closed. */
#define _GNU_SOURCE
#include <nvtx3/nvToolsExt.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

static FILE *g_out;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

static long thread_id(void) { return (long)syscall(SYS_gettid); }

static int NVTX_API push(const char *name) {
    pthread_mutex_lock(&g_mu);
    fprintf(g_out, "push %ld %s\n", thread_id(), name ? name : "(null)");
    fflush(g_out);
    pthread_mutex_unlock(&g_mu);
    return 0;
}

static int NVTX_API pop(void) {
    pthread_mutex_lock(&g_mu);
    fprintf(g_out, "pop %ld\n", thread_id());
    fflush(g_out);
    pthread_mutex_unlock(&g_mu);
    return 0;
}

/* 1: the tool took the two functions; 0: NVTX stays off in this process */
int NVTX_API InitializeInjectionNvtx2(NvtxGetExportTableFunc_t get_table) {
    const char *base = getenv("GPTC_FAKE_NVTX_OUT");
    if (!base || !get_table) return 0;
    const NvtxExportTableCallbacks *cb = get_table(NVTX_ETID_CALLBACKS);
    NvtxFunctionTable table = NULL;
    unsigned int size = 0;
    if (!cb || !cb->GetModuleFunctionTable ||
        !cb->GetModuleFunctionTable(NVTX_CB_MODULE_CORE, &table, &size) || !table ||
        size <= NVTX_CBID_CORE_RangePop)
        return 0;
    char path[4096];
    snprintf(path, sizeof path, "%s.%ld", base, (long)getpid());
    g_out = fopen(path, "w");
    if (!g_out) return 0;
    *table[NVTX_CBID_CORE_RangePushA] = (NvtxFunctionPointer)push;
    *table[NVTX_CBID_CORE_RangePop] = (NvtxFunctionPointer)pop;
    return 1;
}
