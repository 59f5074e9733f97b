/* GPU power readings (engine/power.c) against tests/fake_nvml.c, whose path is argv[1]:
 * the energy counter gives the known per-step energy and power = energy / step time; a
 * GPU without the counter falls back to the mean of the two end power samples; the SM
 * clock is the mean of begin and end; failed readings give -1 and NANs; a library that
 * cannot be loaded, a failing nvmlInit_v2 and a bad device index give -1 and a one-line
 * "profile.power = true: ..." error, leaving NVML shut down; close and reopen work.
 * Exit 0 = pass. */
#define _POSIX_C_SOURCE 200809L
#include "engine/power.h"
#include "tests/check.h"

#include <dlfcn.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

enum { ENERGY_STEP_MJ = 1000 }; /* tests/fake_nvml.c: counter advance per reading */
static const double SLEEP_S = 0.020; /* a step's sleep */

static int (*init_depth)(void); /* the fake's count of nvmlInit_v2 not yet shut down */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void set_env(const char *name, const char *value) {
    if (value) setenv(name, value, 1);
    else unsetenv(name);
}

/* One step of ~20 ms. The *_begin / *_end values are the fake's power (mW) and clock
 * (MHz) for the readings at each end (NULL: its defaults). Returns power_step_end's
 * result; *elapsed is the wall time around begin..end. */
static int step(power_sample *s, double *elapsed, const char *mw_begin, const char *mw_end,
                const char *mhz_begin, const char *mhz_end) {
    set_env("FAKE_NVML_POWER_MW", mw_begin);
    set_env("FAKE_NVML_SM_MHZ", mhz_begin);
    double t0 = now_s();
    power_step_begin();
    nanosleep(&(struct timespec){0, (long)(SLEEP_S * 1e9)}, NULL);
    set_env("FAKE_NVML_POWER_MW", mw_end);
    set_env("FAKE_NVML_SM_MHZ", mhz_end);
    int rc = power_step_end(s);
    *elapsed = now_s() - t0;
    set_env("FAKE_NVML_POWER_MW", NULL);
    set_env("FAKE_NVML_SM_MHZ", NULL);
    return rc;
}

static int within(double got, double want, double rel) { return fabs(got - want) <= rel * fabs(want); }

/* The engine times the step between its own readings: after t0, before t0 + elapsed, and
 * around the 20 ms sleep. The rate of an amount over that time (per_j: J) lies between
 * per_j / elapsed and per_j / 20 ms; the amount at a rate over it (per_s: W) between
 * per_s * 20 ms and per_s * elapsed. (Not within 10% of elapsed: a thread descheduled for
 * 2 ms of it, as on a loaded machine, failed that.) */
static int rate_over_step(double got, double per_j, double elapsed) {
    return got >= per_j / elapsed * (1 - 1e-9) && got <= per_j / SLEEP_S * (1 + 1e-9);
}
static int amount_over_step(double got, double per_s, double elapsed) {
    return got >= per_s * SLEEP_S * (1 - 1e-9) && got <= per_s * elapsed * (1 + 1e-9);
}

static void check_method(const char *what, const char *want) {
    const char *got = power_method();
    check(got && strcmp(got, want) == 0, "%s: power_method() = \"%s\", expected \"%s\"", what,
          got ? got : "(null)", want);
}

static void check_depth(const char *what, int want) {
    int got = init_depth();
    check(got == want, "%s: NVML initialized %d time(s) not shut down, expected %d", what, got, want);
}

/* The GPU by PCI bus id when set (as the trainer opens it), else by index. */
static const char *g_bus;

/* Energy counter: energy is the counter's delta in joules, power = energy / step time. */
static void check_energy_counter(void) {
    set_env("FAKE_NVML_MODE", "ok");
    char err[256] = "";
    int rc = power_open(0, g_bus, err, sizeof(err));
    check(rc == 0, "ok: power_open = %d, expected 0 (err: %s)", rc, err);
    if (rc != 0) return;
    check_method("ok", "energy_counter");
    check_depth("ok after open", 1);
    for (int i = 0; i < 2; i++) {
        power_sample s;
        double elapsed;
        rc = step(&s, &elapsed, NULL, NULL, NULL, NULL);
        double want_j = ENERGY_STEP_MJ * 1e-3;
        check(rc == 0, "ok step %d: power_step_end = %d, expected 0", i, rc);
        check(within(s.energy_j, want_j, 1e-12), "ok step %d: energy_j = %.9g, expected %.9g", i,
              s.energy_j, want_j);
        check(rate_over_step(s.power_w, want_j, elapsed),
              "ok step %d: power_w = %.6g, expected energy / step time, %.6g J over 20 ms to "
              "%.6g s", i, s.power_w, want_j, elapsed);
        check(s.sm_clock_mhz == 1980.0, "ok step %d: sm_clock_mhz = %.9g, expected 1980", i,
              s.sm_clock_mhz);
    }

    /* The clock is the mean of its two readings, not either one. */
    power_sample s;
    double elapsed;
    rc = step(&s, &elapsed, NULL, NULL, "1900", "2100");
    check(rc == 0 && s.sm_clock_mhz == 2000.0,
          "clock 1900 -> 2100 MHz: rc %d, sm_clock_mhz = %.9g, expected 0 and the mean 2000", rc,
          s.sm_clock_mhz);

    /* A failed reading gives -1 and NANs, and the next step is unaffected. */
    power_step_begin();
    set_env("FAKE_NVML_MODE", "read_fails");
    rc = power_step_end(&s);
    check(rc == -1 && isnan(s.energy_j) && isnan(s.power_w) && isnan(s.sm_clock_mhz),
          "reading fails at the end: rc %d, %g J, %g W, %g MHz; expected -1 and NANs", rc,
          s.energy_j, s.power_w, s.sm_clock_mhz);
    set_env("FAKE_NVML_MODE", "ok");
    power_step_begin();
    set_env("FAKE_NVML_MODE", "clock_fails");
    rc = power_step_end(&s);
    check(rc == -1 && isnan(s.energy_j) && isnan(s.power_w) && isnan(s.sm_clock_mhz),
          "clock reading fails at the end: rc %d, %g J, %g W, %g MHz; expected -1 and NANs", rc,
          s.energy_j, s.power_w, s.sm_clock_mhz);
    set_env("FAKE_NVML_MODE", "read_fails");
    power_step_begin();
    set_env("FAKE_NVML_MODE", "ok");
    rc = power_step_end(&s);
    check(rc == -1 && isnan(s.energy_j) && isnan(s.power_w) && isnan(s.sm_clock_mhz),
          "reading fails at the begin: rc %d, %g J, %g W, %g MHz; expected -1 and NANs", rc,
          s.energy_j, s.power_w, s.sm_clock_mhz);
    rc = power_step_end(&s);
    check(rc == -1 && isnan(s.energy_j), "power_step_end without begin: rc %d, %g J; expected -1, NAN",
          rc, s.energy_j);
    rc = step(&s, &elapsed, NULL, NULL, NULL, NULL);
    check(rc == 0 && within(s.energy_j, ENERGY_STEP_MJ * 1e-3, 1e-12),
          "step after failed readings: rc %d, %.9g J; expected 0, %.9g J", rc, s.energy_j,
          ENERGY_STEP_MJ * 1e-3);

    power_close();
    check_depth("ok after close", 0);
    check_method("after close", "none");
    rc = power_step_end(&s);
    check(rc == -1 && isnan(s.energy_j), "power_step_end when closed: rc %d, %g J; expected -1, NAN",
          rc, s.energy_j);
}

/* No energy counter: power is the mean of the begin and end samples, energy = power * time. */
static void check_power_samples(void) {
    set_env("FAKE_NVML_MODE", "no_energy");
    char err[256] = "";
    int rc = power_open(0, g_bus, err, sizeof(err));
    check(rc == 0, "no_energy: power_open = %d, expected 0 (err: %s)", rc, err);
    if (rc != 0) return;
    check_method("no_energy", "power_samples");

    power_sample s;
    double elapsed;
    rc = step(&s, &elapsed, NULL, NULL, NULL, NULL);
    check(rc == 0, "no_energy: power_step_end = %d, expected 0", rc);
    check(fabs(s.power_w - 250.0) <= 1e-9, "no_energy: power_w = %.12g, expected 250", s.power_w);
    check(amount_over_step(s.energy_j, 250.0, elapsed),
          "no_energy: energy_j = %.6g, expected 250 W over 20 ms to %.6g s", s.energy_j, elapsed);
    check(s.sm_clock_mhz == 1980.0, "no_energy: sm_clock_mhz = %.9g, expected 1980", s.sm_clock_mhz);

    rc = step(&s, &elapsed, "200000", "300000", NULL, NULL);
    check(rc == 0 && fabs(s.power_w - 250.0) <= 1e-9,
          "no_energy, 200 W -> 300 W: rc %d, power_w = %.12g; expected 0 and the mean 250", rc, s.power_w);
    check(amount_over_step(s.energy_j, 250.0, elapsed),
          "no_energy, 200 W -> 300 W: energy_j = %.6g, expected 250 W over 20 ms to %.6g s",
          s.energy_j, elapsed);
    power_step_begin();
    set_env("FAKE_NVML_MODE", "no_energy,power_fails");
    rc = power_step_end(&s);
    set_env("FAKE_NVML_MODE", "no_energy");
    check(rc == -1 && isnan(s.energy_j) && isnan(s.power_w) && isnan(s.sm_clock_mhz),
          "no_energy, power sample fails at the end: rc %d, %g J, %g W, %g MHz; expected -1 and NANs",
          rc, s.energy_j, s.power_w, s.sm_clock_mhz);
    power_close();
    check_depth("no_energy after close", 0);
}

/* An energy counter that did not move during the step (a real one moves every few tens of
 * ms, and a small model's step is shorter): the step is measured by the end's power
 * reading, not reported as 0 J; a later step that sees the counter move uses it again. */
static void check_frozen_counter(void) {
    set_env("FAKE_NVML_MODE", "energy_frozen");
    char err[256] = "";
    int rc = power_open(0, g_bus, err, sizeof(err));
    check(rc == 0, "energy_frozen: power_open = %d, expected 0 (err: %s)", rc, err);
    if (rc != 0) return;
    check_method("energy_frozen", "energy_counter");
    power_sample s;
    double elapsed;
    rc = step(&s, &elapsed, "100000", "300000", NULL, NULL);
    check(rc == 0 && fabs(s.power_w - 300.0) <= 1e-9,
          "energy_frozen: rc %d, power_w = %.12g; expected 0 and the end's reading, 300", rc, s.power_w);
    check(amount_over_step(s.energy_j, 300.0, elapsed),
          "energy_frozen: energy_j = %.6g, expected 300 W over 20 ms to %.6g s", s.energy_j,
          elapsed);
    set_env("FAKE_NVML_MODE", "ok");
    rc = step(&s, &elapsed, NULL, NULL, NULL, NULL);
    check(rc == 0 && within(s.energy_j, ENERGY_STEP_MJ * 1e-3, 1e-12),
          "counter moving again: rc %d, %.9g J; expected 0, %.9g J", rc, s.energy_j,
          ENERGY_STEP_MJ * 1e-3);
    set_env("FAKE_NVML_MODE", "energy_frozen,power_fails");
    power_step_begin();
    rc = power_step_end(&s);
    check(rc == -1 && isnan(s.energy_j),
          "energy_frozen, power reading fails: rc %d, %g J; expected -1, NAN", rc, s.energy_j);
    set_env("FAKE_NVML_MODE", "ok");
    power_close();
    check_depth("energy_frozen after close", 0);
}

/* power_open fails with -1 and a one-line error naming the cause; NVML is left shut down. */
static void check_open_fails(const char *what, const char *mode, const char *path, int index,
                             const char *must_contain) {
    const char *prefix = "profile.power = true:";
    set_env("FAKE_NVML_MODE", mode);
    char *saved = NULL;
    if (path) {
        saved = strdup(getenv("GPTC_NVML_PATH"));
        setenv("GPTC_NVML_PATH", path, 1);
    }
    char err[256] = "";
    int rc = power_open(index, g_bus, err, sizeof(err));
    if (saved) {
        setenv("GPTC_NVML_PATH", saved, 1);
        free(saved);
    }
    check(rc == -1, "%s: power_open = %d, expected -1", what, rc);
    check(strncmp(err, prefix, strlen(prefix)) == 0, "%s: error \"%s\" does not start with \"%s\"", what,
          err, prefix);
    check(!strchr(err, '\n'), "%s: error is not one line: \"%s\"", what, err);
    check(strstr(err, must_contain) != NULL, "%s: error \"%s\" does not name \"%s\"", what, err,
          must_contain);
    check_depth(what, 0);
    check_method(what, "none");
    printf("%s: %s\n", what, err);
    if (rc == 0) power_close();
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: test_power PATH_TO_FAKE_NVML\n");
        return 2;
    }
    /* Held open for the whole test, so the fake's state lives across power_close. */
    void *fake = dlopen(argv[1], RTLD_NOW);
    if (!fake) {
        fprintf(stderr, "cannot load %s: %s\n", argv[1], dlerror());
        return 2;
    }
    init_depth = (int (*)(void))dlsym(fake, "fake_nvml_init_depth");
    if (!init_depth) {
        fprintf(stderr, "%s has no fake_nvml_init_depth\n", argv[1]);
        return 2;
    }
    setenv("GPTC_NVML_PATH", argv[1], 1);

    check_method("before open", "none");
    check_energy_counter();
    check_power_samples();
    check_frozen_counter();
    check_open_fails("init_fails", "init_fails", NULL, 0, "nvmlInit_v2 failed: Driver Not Loaded");
    check_open_fails("bad_index", "bad_index", NULL, 0,
                     "nvmlDeviceGetHandleByIndex_v2(0) failed: Invalid Argument");
    check_open_fails("index 3", "ok", NULL, 3, "nvmlDeviceGetHandleByIndex_v2(3) failed: Invalid Argument");
    /* a FIFO: dlopen's open waited for a writer, for ever */
    char fifo[64];
    snprintf(fifo, sizeof fifo, "/tmp/gptc_power_fifo.%ld", (long)getpid());
    unlink(fifo); /* an earlier run's, killed (with this pid: pids come round) */
    check(mkfifo(fifo, 0600) == 0, "cannot make the FIFO %s", fifo);
    check_open_fails("a FIFO", "ok", fifo, 0, "not a regular file");
    unlink(fifo);
    check_open_fails("missing library", "ok", "/nonexistent/libnvidia-ml.so.1", 0,
                     "cannot load /nonexistent/libnvidia-ml.so.1 (");
    /* After close and after failed opens, a new open works as the first did. */
    check_energy_counter();
    /* by PCI bus id, as CUDA names the GPU: the fake's device 0 is at bus 19 */
    g_bus = "0000:19:00.0";
    check_energy_counter();
    g_bus = "0000:42:00.0";
    check_open_fails("unknown bus id", "ok", NULL, 0,
                     "nvmlDeviceGetHandleByPciBusId_v2(0000:42:00.0) failed: Invalid Argument");
    g_bus = NULL;

    power_close();
    dlclose(fake);
    if (failures) {
        fprintf(stderr, "test_power: %d check(s) failed\n", failures);
        return 1;
    }
    printf("test_power: all checks passed\n");
    return 0;
}
