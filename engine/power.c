/* NVML through dlopen: the few types and entry points gptc uses are declared here, so
 * that building needs neither nvml.h nor the driver. */
#define _POSIX_C_SOURCE 200809L
#include "engine/power.h"

#include <dlfcn.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

typedef int nvmlReturn_t;
typedef struct nvmlDevice_st *nvmlDevice_t;
enum { NVML_SUCCESS = 0, NVML_CLOCK_SM = 1 };

typedef nvmlReturn_t (*nvml_init_fn)(void);
typedef nvmlReturn_t (*nvml_shutdown_fn)(void);
typedef nvmlReturn_t (*nvml_handle_fn)(unsigned int, nvmlDevice_t *);
typedef nvmlReturn_t (*nvml_handle_pci_fn)(const char *, nvmlDevice_t *);
typedef nvmlReturn_t (*nvml_energy_fn)(nvmlDevice_t, unsigned long long *);
typedef nvmlReturn_t (*nvml_power_fn)(nvmlDevice_t, unsigned int *);
typedef nvmlReturn_t (*nvml_clock_fn)(nvmlDevice_t, int, unsigned int *);
typedef const char *(*nvml_error_string_fn)(nvmlReturn_t);

static struct {
    void *lib;          /* NULL: not open */
    int initialized;    /* nvmlInit_v2 succeeded, so nvmlShutdown is owed */
    nvmlDevice_t dev;
    nvml_init_fn init;
    nvml_shutdown_fn shutdown;
    nvml_handle_fn handle;
    nvml_energy_fn energy;  /* NULL: the GPU (or driver) has no energy counter */
    nvml_power_fn power;
    nvml_clock_fn clock;
    nvml_error_string_fn error_string;
    int begun, begin_ok;
    double t0;
    unsigned long long e0_mj;
    unsigned int p0_mw, clk0_mhz;
    char errbuf[32];    /* an NVML error code without nvmlErrorString */
} P;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static const char *nvml_error(nvmlReturn_t r) {
    const char *s = P.error_string ? P.error_string(r) : NULL;
    if (s) return s;
    snprintf(P.errbuf, sizeof(P.errbuf), "NVML error %d", r);
    return P.errbuf;
}

/* The caller prints err as one line; dlerror and NVML strings are not ours to trust. */
__attribute__((format(printf, 3, 4)))
static void fail(char *err, size_t errlen, const char *fmt, ...) {
    if (!err || errlen == 0) return;
    int n = snprintf(err, errlen, "profile.power = true: ");
    if (n < 0 || (size_t)n >= errlen) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err + n, errlen - (size_t)n, fmt, ap);
    va_end(ap);
    for (char *c = err; *c; c++)
        if (*c == '\n' || *c == '\r') *c = ' ';
}

void power_close(void) {
    if (P.initialized) P.shutdown();
    if (P.lib) dlclose(P.lib);
    memset(&P, 0, sizeof(P));
}

int power_open(int device_index, const char *pci_bus_id, char *err, size_t errlen) {
    power_close();
    const char *path = getenv("GPTC_NVML_PATH");
    if (!path || !*path) path = "libnvidia-ml.so.1";
    struct stat st; /* a path (not a name the loader looks up): a FIFO's open would wait */
    if (strchr(path, '/') && stat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
        fail(err, errlen, "cannot load %s (not a regular file)", path);
        return -1;
    }
    P.lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!P.lib) {
        const char *why = dlerror();
        fail(err, errlen, "cannot load %s (%s)", path, why ? why : "unknown reason");
        return -1;
    }
    /* Function pointers from dlsym: POSIX guarantees the conversion. */
    P.init = (nvml_init_fn)dlsym(P.lib, "nvmlInit_v2");
    P.shutdown = (nvml_shutdown_fn)dlsym(P.lib, "nvmlShutdown");
    P.handle = (nvml_handle_fn)dlsym(P.lib, "nvmlDeviceGetHandleByIndex_v2");
    nvml_handle_pci_fn by_pci = (nvml_handle_pci_fn)dlsym(P.lib, "nvmlDeviceGetHandleByPciBusId_v2");
    P.energy = (nvml_energy_fn)dlsym(P.lib, "nvmlDeviceGetTotalEnergyConsumption");
    P.power = (nvml_power_fn)dlsym(P.lib, "nvmlDeviceGetPowerUsage");
    P.clock = (nvml_clock_fn)dlsym(P.lib, "nvmlDeviceGetClockInfo");
    P.error_string = (nvml_error_string_fn)dlsym(P.lib, "nvmlErrorString");
    const char *missing = !P.init ? "nvmlInit_v2"
                        : !P.shutdown ? "nvmlShutdown"
                        : !P.handle ? "nvmlDeviceGetHandleByIndex_v2"
                        : pci_bus_id && !by_pci ? "nvmlDeviceGetHandleByPciBusId_v2"
                        : !P.power ? "nvmlDeviceGetPowerUsage"
                        : !P.clock ? "nvmlDeviceGetClockInfo"
                        : NULL;
    if (missing) {
        fail(err, errlen, "%s has no %s (driver too old?)", path, missing);
        power_close();
        return -1;
    }
    nvmlReturn_t r = P.init();
    if (r != NVML_SUCCESS) {
        fail(err, errlen, "nvmlInit_v2 failed: %s", nvml_error(r));
        power_close();
        return -1;
    }
    P.initialized = 1;
    if (!pci_bus_id && device_index < 0) {
        fail(err, errlen, "nvmlDeviceGetHandleByIndex_v2(%d): negative device index", device_index);
        power_close();
        return -1;
    }
    if (pci_bus_id) {
        /* CUDA and NVML number GPUs differently (CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER);
         * the PCI bus id names the same board in both */
        r = by_pci(pci_bus_id, &P.dev);
        if (r != NVML_SUCCESS) {
            fail(err, errlen, "nvmlDeviceGetHandleByPciBusId_v2(%s) failed: %s", pci_bus_id,
                 nvml_error(r));
            power_close();
            return -1;
        }
    } else if ((r = P.handle((unsigned int)device_index, &P.dev)) != NVML_SUCCESS) {
        fail(err, errlen, "nvmlDeviceGetHandleByIndex_v2(%d) failed: %s", device_index, nvml_error(r));
        power_close();
        return -1;
    }
    unsigned long long mj;
    if (P.energy && P.energy(P.dev, &mj) != NVML_SUCCESS) P.energy = NULL; /* pre-Volta */
    unsigned int v;
    if (!P.energy && (r = P.power(P.dev, &v)) != NVML_SUCCESS) {
        fail(err, errlen, "GPU %d has no energy counter and nvmlDeviceGetPowerUsage failed: %s",
             device_index, nvml_error(r));
        power_close();
        return -1;
    }
    if ((r = P.clock(P.dev, NVML_CLOCK_SM, &v)) != NVML_SUCCESS) {
        fail(err, errlen, "nvmlDeviceGetClockInfo(GPU %d, SM) failed: %s", device_index, nvml_error(r));
        power_close();
        return -1;
    }
    return 0;
}

const char *power_method(void) {
    if (!P.lib) return "none";
    return P.energy ? "energy_counter" : "power_samples";
}

void power_step_begin(void) {
    if (!P.lib) return;
    P.begun = 1;
    P.begin_ok = (P.energy ? P.energy(P.dev, &P.e0_mj) : P.power(P.dev, &P.p0_mw)) == NVML_SUCCESS &&
                 P.clock(P.dev, NVML_CLOCK_SM, &P.clk0_mhz) == NVML_SUCCESS;
    /* Last, so that the readings' own cost is outside the step, as it is at the end. */
    P.t0 = now_s();
}

int power_step_end(power_sample *out) {
    double t1 = now_s();
    *out = (power_sample){NAN, NAN, NAN};
    int ok = P.lib && P.begun && P.begin_ok;
    P.begun = 0;
    if (!ok) return -1;
    double dt = t1 - P.t0;
    unsigned int clk1;
    if (P.clock(P.dev, NVML_CLOCK_SM, &clk1) != NVML_SUCCESS || !(dt > 0)) return -1;
    double energy_j, power_w;
    unsigned long long e1 = 0;
    if (P.energy && (P.energy(P.dev, &e1) != NVML_SUCCESS || e1 < P.e0_mj)) return -1;
    if (P.energy && e1 > P.e0_mj) {
        energy_j = (double)(e1 - P.e0_mj) * 1e-3;
        power_w = energy_j / dt;
    } else if (P.energy) {
        /* The counter moves in steps (tens of ms apart on an H200): a step shorter than
         * that may see none, and is measured by the power reading instead (the step that
         * sees the counter move gets its whole increment). */
        unsigned int p1;
        if (P.power(P.dev, &p1) != NVML_SUCCESS) return -1;
        power_w = 1e-3 * (double)p1;
        energy_j = power_w * dt;
    } else {
        unsigned int p1;
        if (P.power(P.dev, &p1) != NVML_SUCCESS) return -1;
        power_w = 0.5e-3 * ((double)P.p0_mw + (double)p1);
        energy_j = power_w * dt;
    }
    out->energy_j = energy_j;
    out->power_w = power_w;
    out->sm_clock_mhz = 0.5 * ((double)P.clk0_mhz + (double)clk1);
    return 0;
}
