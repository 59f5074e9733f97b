/* The checks of the CUDA kernels that need the launchers (engine/cuda/cuda_kernels.h) or
 * the emulator of tests/cuda_emu themselves (emu_runtime.c says what it can and cannot
 * catch); every op's results against the CPU op, with misaligned buffers and odd sizes,
 * are tests/test_cuda_ops.c, which runs on this emulator as test_cuda_ops_emu. Here:
 *  - the shapes the attention launchers refuse (head size above 128, a bf16 head size
 *    that is not a multiple of 8) come back as launch errors; through the op table such an
 *    error ends the process (cuda_backend.c), so test_cuda_ops cannot see it;
 *  - one emulated mma.sync (mma_check.cu, a kernel of this test) against a plain product:
 *    the fragment layout of emu_mma.h, on which the bf16 attention kernels' results
 *    on the emulator rest;
 *  - cp.async and ldmatrix on one warp (the same file), each lane checking what it sees
 *    against the PTX ISA's statements: the fragments of ldmatrix and its .trans, the
 *    groups of cp.async.wait_group, src-size 0's zero fill;
 *  - a 3-D grid (grid_check.cu) runs each block once with its own blockIdx, and one past
 *    the z limit is refused (the attention grids are 3-D);
 *  - a launch's arguments are those at the launch, though its grid runs later (the same
 *    file, on a stream of its own);
 *  - race_check.cu's kernels made safe (unsafe, "race 0" to "race 3", "race 6" and
 *    "race 7" are what the racecheck build must report, ctest test_cuda_emu_race*_reported,
 *    and "race 4" and "race 5" what the emulator must stop at, test_cuda_emu_sync*_reported);
 *  - fill_nan, which is no op of the op table (tests poison with it), aligned and not;
 *  - wait_flag and set_flag, the host flags of host_tasks.c, on host memory;
 *  - lazy module loading: a kernel's first launch waits for a kernel spinning on another
 *    stream, as loading its module may on a GPU (host_tasks.c says why it matters), and
 *    its later launches do not.
 * Everything else runs on the NULL stream, which the emulator runs before a launch
 * returns, so results are read at once. A few milliseconds, under GPTC_SANITIZE=address too. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "engine/bf16.h"
#include "engine/cuda/cuda_kernels.h"
#include "engine/rng.h"

/* mma_check.cu: d[16][8] = a[16][16] b[16][8] + c on one emulated mma.sync */
void emu_mma_check(float *d, const float *a, const float *b, const float *c);

/* mma_check.cu: cp.async and ldmatrix on one warp, mismatches per lane in bad[32] */
void emu_cp_async_ldsm_check(int *bad, const uint16_t *m);

/* grid_check.cu: a grid of gx x gy x gz blocks; each adds 1 to count[z][y][x] and writes
 * the coordinates it saw to coords[z][y][x][0..2] */
void emu_grid_check(int *count, int *coords, unsigned int gx, unsigned int gy,
                    unsigned int gz);
/* grid_check.cu: *out = what an argument read at the launch, though the grid ran after it
 * changed; -1 when the check could not run */
int emu_arg_check(int *out);

/* race_check.cu: kernel which (0: shared memory, 1: cp.async, 2: blocks writing, 3: blocks
 * adding, 4: a skipped __syncthreads, 5: half a warp at a shuffle), safe or not; out[32] =
 * v[32] (+ 1 for kernel 0), out[32 b + t] = v[t] + b for b < 4 (kernel 2), out[32] +=
 * 4 v[32] (kernel 3), out[t] = v[t % 32] + 2 for t < 64 (kernel 4), out[t] = v[t ^ 1]
 * for t < 32 and v[t - 32] for 32 <= t < 64 (kernel 5), out[t] = v[t ^ 1] for t < 32
 * (kernel 6), out[t] += 2 v[t] and out[32 + t] = v[t] for t < 32 (kernel 7) */
void emu_race_check(int which, int safe, float *out, const float *v);

static int g_failures;

/* A launch error (cudaGetLastError) is a failure of the check that launched. */
static void check_launch(const char *what) {
    int e = cuda_check_launch();
    if (e) {
        printf("FAIL %-28s launch error %d\n", what, e);
        g_failures++;
    }
}

/* After a launch that should have been refused: a launch error, and a reason that holds
 * word (cuda_launch_why, which the backend prints) */
static void check_refused(const char *what, const char *word) {
    int e = cuda_check_launch();
    const char *why = cuda_launch_why();
    int ok = e != 0 && strstr(why, word) != NULL;
    printf("%s %-28s launch error %d: %s\n", ok ? "ok  " : "FAIL", what, e, why);
    if (!ok) g_failures++;
}

/* A head size above 128 has no kernel: the launchers report it as a launch error. */
static void test_attention_unsupported(void) {
    float x[4] = {0};
    uint16_t h[4] = {0};
    cuda_attention_forward(x, x, x, 1, 1, 258, 2, NULL);
    check_refused("attention hs=129 fwd refused", "258");
    cuda_attention_backward(x, x, x, x, x, x, 1, 1, 258, 2, NULL);
    check_refused("attention hs=129 bwd refused", "258");
    /* the bf16 kernels read 16-byte rows: head sizes that are multiples of 8, to 128 */
    cuda_attention_forward_bf16(h, x, h, 1, 1, 36, 3, NULL);
    check_refused("attention bf16 hs=12 fwd", "multiples of 8 up to 128");
    cuda_attention_backward_bf16(h, NULL, x, h, h, h, x, 1, 1, 36, 3, NULL);
    check_refused("attention bf16 hs=12 bwd", "multiples of 8 up to 128");
    cuda_attention_forward_bf16(h, x, h, 1, 1, 272, 2, NULL);
    check_refused("attention bf16 hs=136 fwd", "multiples of 8 up to 128");
}

/* One emulated mma.sync m16n8k16 (fragments placed by mma_check.cu from the PTX ISA's
 * formulas) against a plain product: a wrong fragment layout in emu_mma.h moves
 * elements and fails by O(1). The operands are bf16 values, so only the order of the
 * fp32 sum differs. */
static void test_mma(void) {
    float a[16 * 16], b[16 * 8], c[16 * 8], d[16 * 8], ref[16 * 8];
    for (int i = 0; i < 16 * 16; i++) a[i] = bf16_round(rng_normal(70, i));
    for (int i = 0; i < 16 * 8; i++) b[i] = bf16_round(rng_normal(71, i));
    for (int i = 0; i < 16 * 8; i++) c[i] = rng_normal(72, i), d[i] = NAN;
    emu_mma_check(d, a, b, c);
    check_launch("mma_check");
    for (int r = 0; r < 16; r++)
        for (int n = 0; n < 8; n++) {
            double s = c[r * 8 + n];
            for (int k = 0; k < 16; k++) s += (double)a[r * 16 + k] * b[k * 8 + n];
            ref[r * 8 + n] = (float)s;
        }
    /* max |d - ref| / max |ref|, as test_cuda_ops measures; NaN (an unwritten d) fails */
    double max_ref = 0, max_err = 0;
    for (int i = 0; i < 16 * 8; i++) {
        max_ref = fmax(max_ref, fabs(ref[i]));
        double e = fabs((double)d[i] - ref[i]);
        max_err = e > max_err || e != e ? e : max_err;
    }
    double rel = max_err / max_ref;
    int ok = rel <= 1e-6;
    printf("%s %-28s rel err %.3g\n", ok ? "ok  " : "FAIL", "mma m16n8k16 bf16 (emulated)", rel);
    g_failures += !ok;
}

/* A 3-D grid runs every block once with its own blockIdx (the attention grids are 3-D),
 * and one past the z limit (65535, as on a GPU) is refused with a launch error. */
static void test_grid_3d(void) {
    enum { GX = 3, GY = 2, GZ = 4, NB = GX * GY * GZ };
    int count[NB] = {0}, coords[3 * NB], bad = 0;
    for (int i = 0; i < 3 * NB; i++) coords[i] = -1;
    emu_grid_check(count, coords, GX, GY, GZ);
    check_launch("grid_check 3 x 2 x 4");
    for (int z = 0; z < GZ; z++)
        for (int y = 0; y < GY; y++)
            for (int x = 0; x < GX; x++) {
                int i = (z * GY + y) * GX + x;
                bad += count[i] != 1 || coords[3 * i] != x || coords[3 * i + 1] != y ||
                       coords[3 * i + 2] != z;
            }
    printf("%s %-28s %d of %d blocks wrong\n", bad ? "FAIL" : "ok  ", "3-D grid", bad, NB);
    g_failures += bad != 0;
    emu_grid_check(count, coords, 1, 1, 65536);
    int e = cuda_check_launch();
    printf("%s %-28s launch error %d\n", e ? "ok  " : "FAIL", "grid z 65536 refused", e);
    g_failures += !e;
}

/* A launch's arguments are evaluated when it is made (as CUDA copies them then), not when
 * its grid runs on the stream's thread: a launcher's locals may be gone by then. */
static void test_launch_args(void) {
    int out = 0, rc = emu_arg_check(&out);
    int ok = rc == 0 && out == 7;
    printf("%s %-28s the grid saw %d (7 at the launch, 9 when it ran)\n", ok ? "ok  " : "FAIL",
           "arguments at the launch", out);
    g_failures += !ok;
}

/* cp.async and ldmatrix as emulated (emu_mma.h, emu_runtime.c) against the PTX ISA's
 * statements, which cp_async_ldsm_check_kernel checks lane by lane: a wrong lane or half
 * in emu_ldsm_x4, a copy made before its wait, or no zero fill gives mismatches. The
 * elements are the integers 1..256 (exact in bf16), all different. */
static void test_cp_async_ldsm(void) {
    uint16_t m[16 * 16];
    int bad[32], total = 0;
    for (int i = 0; i < 16 * 16; i++) m[i] = bf16_bits((float)(i + 1));
    for (int i = 0; i < 32; i++) bad[i] = -1;
    emu_cp_async_ldsm_check(bad, m);
    check_launch("cp_async_ldsm_check");
    for (int i = 0; i < 32; i++) total += bad[i] < 0 ? 1000 : bad[i];
    printf("%s %-28s %d mismatches\n", total ? "FAIL" : "ok  ", "cp.async + ldmatrix (emulated)",
           total);
    g_failures += total != 0;
}

/* fill_nan on x[n] of random values; offset 1 puts x one float into its allocation, for
 * the scalar path */
static void test_fill_nan(size_t n, int offset) {
    float *x0 = malloc((n + offset) * sizeof(float)); /* [offset + n] */
    for (size_t i = 0; i < n + offset; i++) x0[i] = rng_normal(40, i);
    float *x = x0 + offset;
    cuda_fill_nan(x, n, NULL);
    check_launch("fill_nan");
    size_t not_nan = 0;
    for (size_t i = 0; i < n; i++) not_nan += !isnan(x[i]);
    int spilled = offset && isnan(x0[0]); /* wrote before the view */
    char name[64];
    snprintf(name, sizeof name, "fill_nan n=%zu%s", n, offset ? " unaligned" : "");
    printf("%s %-28s %zu of %zu not NaN%s\n", not_nan || spilled ? "FAIL" : "ok  ", name, not_nan,
           n, spilled ? ", wrote before the buffer" : "");
    g_failures += not_nan || spilled;
    free(x0);
}

/* wait_flag with the flag already at (or past) the target returns at once; set_flag
 * stores its value (on the NULL stream, before the launch returns). */
static void test_host_flags(void) {
    volatile unsigned int flag = 5;
    cuda_wait_flag(&flag, 5, NULL);
    cuda_wait_flag(&flag, 2, NULL);
    int e = cuda_check_launch();
    printf("%s %-28s launch error %d\n", e ? "FAIL" : "ok  ", "wait_flag", e);
    g_failures += e != 0;
    cuda_set_flag(&flag, 9, NULL);
    e = cuda_check_launch();
    int ok = !e && flag == 9;
    printf("%s %-28s launch error %d, flag %u\n", ok ? "ok  " : "FAIL", "set_flag", e, flag);
    g_failures += !ok;
}

typedef struct {
    volatile unsigned int *flag;
    unsigned int value;
} later_set;

static void *set_later(void *arg) {
    const later_set *l = arg;
    struct timespec pause = {1, 0}; /* long past a launch that goes on at once */
    nanosleep(&pause, NULL);
    __atomic_store_n(l->flag, l->value, __ATOMIC_RELEASE); /* as host_tasks.c's worker */
    return NULL;
}

/* Under lazy module loading (main starts CUDA with CUDA_MODULE_LOADING unset) the first
 * launch of to_act waits until the kernel spinning on stream s ends, which a thread ends
 * 1 s later; its second launch, behind a second spin, returns before the thread ends that
 * one. Both on the NULL stream, which does not wait for a non-blocking stream itself. */
static void test_lazy_loading(void) {
    static volatile unsigned int flag;
    float src[4] = {1, 2, 3, 4}, dst[4];
    cudaStream_t s;
    int ok = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess, waited = 0,
        went_on = 0;
    for (unsigned int round = 1; ok && round <= 2; round++) {
        later_set l = {&flag, round};
        pthread_t t;
        cuda_wait_flag(&flag, round, s);
        if (pthread_create(&t, NULL, set_later, &l) != 0) {
            ok = 0;
            break;
        }
        cuda_to_act(dst, src, 4, GPTC_FP32, NULL);
        unsigned int now = __atomic_load_n(&flag, __ATOMIC_ACQUIRE);
        if (round == 1) waited = now >= 1;
        else went_on = now < 2;
        pthread_join(t, NULL);
    }
    ok = ok && cudaStreamSynchronize(s) == cudaSuccess && cuda_check_launch() == 0;
    if (ok) cudaStreamDestroy(s);
    ok = ok && waited && went_on && memcmp(dst, src, sizeof src) == 0;
    printf("%s %-28s first launch waited for the spinning stream: %s, the second: %s\n",
           ok ? "ok  " : "FAIL", "lazy module loading", waited ? "yes" : "no",
           went_on ? "no" : "yes");
    g_failures += !ok;
}

/* race_check.cu's kernels made safe, and their results */
static void test_race_check_kernels(void) {
    static const char *const name[8] = {"race_check shared, barrier", "race_check cp.async, barrier",
                                        "race_check blocks, indexed", "race_check blocks, atomicAdd",
                                        "sync_check all at barrier",  "sync_check whole-warp shuffle",
                                        "race_check warp, barrier",   "race_check far blocks, atomic"};
    for (int which = 0; which < 8; which++) {
        float v[32], out[4 * 32], want[4 * 32];
        int n = which == 2 ? 4 * 32 : which == 4 || which == 5 || which == 7 ? 64 : 32;
        for (int i = 0; i < 32; i++) v[i] = (float)i;
        for (int i = 0; i < 4 * 32; i++) out[i] = which == 3 || which == 7 ? 0.0f : NAN;
        for (int i = 0; i < n; i++)
            want[i] = which == 0 ? v[i] + 1.0f : which == 1 ? v[i]
                    : which == 2 ? v[i % 32] + (float)(i / 32) : which == 3 ? 4.0f * v[i]
                    : which == 4 ? v[i % 32] + 2.0f
                    : which == 7 ? (i < 32 ? 2.0f * v[i] : v[i - 32])
                    : i < 32 ? v[i ^ 1] : v[i - 32];
        emu_race_check(which, 1, out, v);
        check_launch(name[which]);
        int bad = 0;
        for (int i = 0; i < n; i++) bad += out[i] != want[i];
        printf("%s %-28s %d of %d wrong\n", bad ? "FAIL" : "ok  ", name[which], bad, n);
        g_failures += bad != 0;
    }
}

/* race_check.cu's kernel `which` unsafe. Kernels 0 to 3, 6 and 7 are races, which a racecheck
 * build (GPTC_SANITIZE=thread) reports; elsewhere the emulator runs them without a word.
 * Kernels 4 and 5 are barriers that not every thread reaches, where the emulator stops
 * the process (a message, then abort): they run in a child, and this one exits 0 only if
 * the child was so stopped (ctest takes an abort for a failure whatever the output). */
static int run_unsafe(int which) {
    float v[32] = {0}, out[4 * 32] = {0};
    if (which < 4 || which >= 6) {
        emu_race_check(which, 0, out, v);
        printf("ran race_check kernel %d unsafe\n", which);
        return 0;
    }
    fflush(NULL);
    pid_t child = fork();
    if (child == 0) {
        emu_race_check(which, 0, out, v);
        printf("race_check kernel %d ran to its end: the emulator did not stop it\n", which);
        _exit(0);
    }
    int status;
    if (child < 0 || waitpid(child, &status, 0) != child) return 1;
    int stopped = WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT;
    printf("%s race_check kernel %d %s\n", stopped ? "ok  " : "FAIL", which,
           stopped ? "stopped by the emulator" : "not stopped");
    return stopped ? 0 : 1;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0); /* in order with the emulator's messages on stderr */
    if (argc == 3 && strcmp(argv[1], "race") == 0) return run_unsafe(atoi(argv[2]));
    unsetenv("CUDA_MODULE_LOADING"); /* before the first CUDA call: lazy, CUDA's default */
    test_attention_unsupported();
    test_race_check_kernels();
    test_mma();
    test_grid_3d();
    test_launch_args();
    test_cp_async_ldsm();
    /* 100003: several grid-stride passes */
    test_fill_nan(100003, 0);
    test_fill_nan(1003, 1);
    test_host_flags();
    test_lazy_loading();
    if (g_failures) {
        printf("%d check(s) failed\n", g_failures);
        return 1;
    }
    printf("all launcher and emulator checks pass\n");
    return 0;
}
