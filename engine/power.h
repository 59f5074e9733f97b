/* GPU energy, power and SM clock per training step (profile.power = true), read through
 * NVML. NVML is loaded at run time so that gptc builds and runs on machines without the
 * NVIDIA driver; only a run that asks for power readings needs libnvidia-ml.so.1
 * (GPTC_NVML_PATH names another library, which the tests use to load a fake NVML).
 *
 * Energy comes from the GPU's energy counter where the GPU has one; older GPUs lack it,
 * and then the step's energy is its wall time times the mean of two power samples, one
 * at each end of the step, which misses spikes shorter than the step. */
#ifndef GPTC_POWER_H
#define GPTC_POWER_H

#include <stddef.h>

/* The GPU is pci_bus_id (as CUDA writes it, e.g. "0000:19:00.0") when not NULL, else
 * NVML's device_index. 0 on success; on failure -1 and a one-line reason in err, e.g.
 * "profile.power = true: cannot load libnvidia-ml.so.1 (...dlerror...)". Reads every
 * quantity once, so that a GPU that cannot report them fails here, not in every step. */
int power_open(int device_index, const char *pci_bus_id, char *err, size_t errlen);
/* Safe to call when not open; power_open may be called again afterwards. */
void power_close(void);
/* "energy_counter" or "power_samples" (see above); "none" when not open. */
const char *power_method(void);

typedef struct {
    double energy_j;     /* joules the GPU used during the step */
    double power_w;      /* energy_j / the step's wall seconds */
    double sm_clock_mhz; /* mean of the SM clock read at the step's begin and end */
} power_sample;

/* Reads the energy counter (or a power sample), the SM clock and the time. */
void power_step_begin(void);
/* 0, or -1 (fields NAN) when not open, without a matching power_step_begin, or when a
 * reading failed (also a counter that went backwards: the driver was reloaded). */
int power_step_end(power_sample *out);

#endif
