/* A stand-in for libnvidia-ml.so.1, loaded by engine/power.c through GPTC_NVML_PATH so
 * that test_power runs without a GPU. Its behaviour is read from the environment at
 * every call, so a test can change it between power_step_begin and power_step_end:
 *   FAKE_NVML_MODE      comma-separated, any of (none or empty: ok)
 *                       no_energy (no energy counter, as before Volta) | init_fails |
 *                       bad_index (no device at any index) |
 *                       read_fails (energy, power and clock readings fail) |
 *                       power_fails | clock_fails (only that reading fails) |
 *                       energy_frozen (the energy counter does not move, as between two
 *                       updates of a real one)
 *   FAKE_NVML_POWER_MW  power reading, default 250000
 *   FAKE_NVML_SM_MHZ    SM clock reading, default 1980
 * The energy counter advances by FAKE_NVML_ENERGY_STEP_MJ (1000) at every reading, so
 * two consecutive readings differ by exactly that. One device exists: index 0.
 * fake_nvml_init_depth() is for the test: nvmlInit_v2 calls not yet shut down. */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_UNKNOWN = 999,
    NVML_CLOCK_SM = 1,
    FAKE_NVML_ENERGY_STEP_MJ = 1000,
};

typedef struct nvmlDevice_st { int index; } *nvmlDevice_t;

static struct nvmlDevice_st device0 = {0};
static unsigned long long energy_mj = 123456789ULL;
static int init_depth;

static int mode_is(const char *m) {
    const char *s = getenv("FAKE_NVML_MODE");
    size_t n = strlen(m);
    for (; s && *s; s += strcspn(s, ",")) {
        s += *s == ',';
        if (strncmp(s, m, n) == 0 && (s[n] == ',' || s[n] == '\0')) return 1;
    }
    return 0;
}

static unsigned int env_uint(const char *name, unsigned int dflt) {
    const char *s = getenv(name);
    return s && *s ? (unsigned int)strtoul(s, NULL, 10) : dflt;
}

int fake_nvml_init_depth(void) { return init_depth; }

int nvmlInit_v2(void) {
    if (mode_is("init_fails")) return NVML_ERROR_DRIVER_NOT_LOADED;
    init_depth++;
    return NVML_SUCCESS;
}

int nvmlShutdown(void) {
    init_depth--;
    return NVML_SUCCESS;
}

const char *nvmlErrorString(int r) {
    switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    default: return "Unknown Error";
    }
}

int nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (mode_is("bad_index") || index != 0 || !device) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &device0;
    return NVML_SUCCESS;
}

/* device 0 sits at bus 19 (CUDA writes "0000:19:00.0", NVML "00000000:19:00.0") */
int nvmlDeviceGetHandleByPciBusId_v2(const char *bus, nvmlDevice_t *device) {
    if (!bus || !device) return NVML_ERROR_INVALID_ARGUMENT;
    if (strcasecmp(bus, "0000:19:00.0") != 0 && strcasecmp(bus, "00000000:19:00.0") != 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = &device0;
    return NVML_SUCCESS;
}

int nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t device, unsigned long long *mj) {
    if (device != &device0 || !mj) return NVML_ERROR_INVALID_ARGUMENT;
    if (mode_is("no_energy")) return NVML_ERROR_NOT_SUPPORTED;
    if (mode_is("read_fails")) return NVML_ERROR_UNKNOWN;
    *mj = energy_mj;
    if (!mode_is("energy_frozen")) energy_mj += FAKE_NVML_ENERGY_STEP_MJ;
    return NVML_SUCCESS;
}

int nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *mw) {
    if (device != &device0 || !mw) return NVML_ERROR_INVALID_ARGUMENT;
    if (mode_is("read_fails") || mode_is("power_fails")) return NVML_ERROR_UNKNOWN;
    *mw = env_uint("FAKE_NVML_POWER_MW", 250000);
    return NVML_SUCCESS;
}

int nvmlDeviceGetClockInfo(nvmlDevice_t device, int type, unsigned int *mhz) {
    if (device != &device0 || type != NVML_CLOCK_SM || !mhz) return NVML_ERROR_INVALID_ARGUMENT;
    if (mode_is("read_fails") || mode_is("clock_fails")) return NVML_ERROR_UNKNOWN;
    *mhz = env_uint("FAKE_NVML_SM_MHZ", 1980);
    return NVML_SUCCESS;
}
