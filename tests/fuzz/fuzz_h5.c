/* libFuzzer target: any bytes as a token file and as a checkpoint. The loaders must turn
 * every malformed file into an error message (never a crash, a hang or a leak of our
 * own); HDF5 reads the bytes from a temporary file, as it would a user's. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "data/tokens.h"
#include "engine/checkpoint.h"
#include "engine/watchdog.h"

/* The loader marks its progress for the watchdog of a multi-rank run (engine/watchdog.c,
 * which needs MPI); this single-process target has none to tell. */
void watchdog_beat(void) {}
void watchdog_test_slow_read(void) {}

static void try_tokens(const char *path) {
    char err[1024];
    token_file *f = tokens_open(path, 0, err, sizeof(err));
    if (!f) return;
    long n = tokens_count(f);
    int32_t buf[64];
    tokens_read(f, 0, n < 64 ? n : 64, buf, err, sizeof(err));
    tokens_close(f);
}

static void try_checkpoint(const char *path) {
    char err[1024];
    ckpt_meta meta;
    int has_optim = 0;
    long t = 0;
    ckpt_file *f = ckpt_open(path, &meta, &has_optim, &t, err, sizeof(err));
    if (!f) return;
    long shape1[1] = {meta.d_model}, shape2[2] = {meta.vocab_size, meta.d_model};
    if (meta.d_model > 0 && meta.d_model <= 4096) {
        float *x = malloc(sizeof(float) * (size_t)meta.d_model); /* [C] */
        if (x) ckpt_read(f, "model", "ln_f.weight", 1, shape1, NULL, NULL, x, err, sizeof(err));
        free(x);
    }
    if (meta.d_model > 0 && meta.d_model <= 4096 && meta.vocab_size > 0 &&
        meta.vocab_size <= (1L << 20) / meta.d_model) {
        float *x = malloc(sizeof(float) * (size_t)(meta.vocab_size * meta.d_model)); /* [V,C] */
        if (x) ckpt_read(f, "model", "wte", 2, shape2, NULL, NULL, x, err, sizeof(err));
        free(x);
    }
    ckpt_close(f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* the input as a file, in GPTC_FUZZ_TMP (run.sh's folder, removed with it: an input
     * that crashes in libhdf5 leaves its file) */
    const char *dir = getenv("GPTC_FUZZ_TMP");
    char path[4096];
    snprintf(path, sizeof(path), "%s/gptc_fuzz_%ld.h5", dir && dir[0] ? dir : "/tmp",
             (long)getpid());
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    fwrite(data, 1, size, f);
    fclose(f);
    try_tokens(path);
    try_checkpoint(path);
    unlink(path);
    return 0;
}
