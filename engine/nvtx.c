#include "engine/nvtx.h"

#include <nvtx3/nvToolsExt.h>

static int g_on;

void nvtx_enable(int on) { g_on = on; }

void nvtx_push(const char *name) {
    if (g_on) nvtxRangePushA(name);
}

void nvtx_pop(void) {
    if (g_on) nvtxRangePop();
}
