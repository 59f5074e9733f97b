/* Token files and the batch loader: window order, row slices, the shuffle permutation,
 * the prefetch path against synchronous reads, uint8/uint32 files and every refusal.
 * With argv[1] = path to gptc-data it instead converts small text files with that
 * binary and reads them back through the loader. Writes its files under a temp dir. */
#define _POSIX_C_SOURCE 200809L
#include "data/tokens.h"
#include "engine/watchdog.h"
#include "tests/check.h"

#include <dirent.h>
#include <fcntl.h>
#include <hdf5.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char tmpdir[256];
static char made[128][320]; /* paths this run created, removed at the end */
static int n_made;

static const char *tmp_path(const char *name) {
    if (n_made == (int)(sizeof made / sizeof made[0])) {
        fprintf(stderr, "test_tokens: too many temp files\n");
        exit(2);
    }
    snprintf(made[n_made], sizeof made[0], "%s/%s", tmpdir, name);
    return made[n_made++];
}

/* 1 when tmpdir holds a temporary file of gptc-data's output base (base.tmp.<pid>) */
static int tmp_left(const char *base) {
    char prefix[320];
    snprintf(prefix, sizeof prefix, "%s.tmp.", base);
    DIR *d = opendir(tmpdir);
    int found = 0;
    for (struct dirent *e; d && (e = readdir(d)) != NULL;)
        found |= strncmp(e->d_name, prefix, strlen(prefix)) == 0;
    if (d) closedir(d);
    return found;
}

static void cleanup(void) {
    for (int i = 0; i < n_made; i++) remove(made[i]);
    rmdir(tmpdir);
}

enum { VOCAB_NONE, VOCAB_ROOT, VOCAB_DATASET, VOCAB_BOTH };

typedef struct {
    hid_t type;          /* file element type, e.g. H5T_STD_U16LE */
    int two_d;           /* store as [n/2, 2] instead of [n] */
    int vocab_where;     /* VOCAB_* */
    long long vocab;     /* value of the attribute (root gets vocab/2 with VOCAB_BOTH) */
    const char *dataset; /* name of the dataset, "tokens" normally */
} file_spec;

static void write_attr(hid_t loc, long long v) {
    hid_t space = H5Screate(H5S_SCALAR);
    hid_t attr = H5Acreate2(loc, "vocab_size", H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(attr, H5T_NATIVE_LLONG, &v);
    H5Aclose(attr);
    H5Sclose(space);
}

/* Writes vals[n] as dataset spec->dataset. Exits on failure: the test cannot go on. */
static void write_file(const char *path, const file_spec *spec, const uint32_t *vals,
                       hsize_t n) {
    tokens_hdf5_lock();
    hid_t file = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    hsize_t dims[2] = {spec->two_d ? n / 2 : n, 2};
    hid_t space = H5Screate_simple(spec->two_d ? 2 : 1, dims, NULL);
    hid_t dset = H5Dcreate2(file, spec->dataset, spec->type, space, H5P_DEFAULT, H5P_DEFAULT,
                            H5P_DEFAULT);
    if (file < 0 || space < 0 || dset < 0 ||
        H5Dwrite(dset, H5T_NATIVE_UINT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, vals) < 0) {
        fprintf(stderr, "test_tokens: cannot write %s\n", path);
        exit(2);
    }
    if (spec->vocab_where == VOCAB_ROOT) write_attr(file, spec->vocab);
    if (spec->vocab_where == VOCAB_DATASET) write_attr(dset, spec->vocab);
    if (spec->vocab_where == VOCAB_BOTH) {
        write_attr(file, spec->vocab / 2);
        write_attr(dset, spec->vocab);
    }
    H5Dclose(dset);
    H5Sclose(space);
    H5Fclose(file);
    tokens_hdf5_unlock();
}

/* Writes tokens[i] = i + base, i < n, as uint16 (or type) with vocab on the root. */
static const char *write_ramp(const char *name, hid_t type, long n, uint32_t base,
                              long long vocab) {
    uint32_t *vals = malloc((size_t)n * sizeof *vals); /* [n] */
    for (long i = 0; i < n; i++) vals[i] = base + (uint32_t)i;
    file_spec spec = {type, 0, VOCAB_ROOT, vocab, "tokens"};
    const char *path = tmp_path(name);
    write_file(path, &spec, vals, (hsize_t)n);
    free(vals);
    return path;
}

/* Checks that row r of (inputs, targets)[rows, T] holds window w of a ramp file. */
static int row_is_window(const int32_t *inputs, const int32_t *targets, int r, int T, long w,
                         uint32_t base) {
    for (int t = 0; t < T; t++) {
        if (inputs[r * T + t] != (int32_t)(base + w * T + t)) return 0;
        if (targets[r * T + t] != (int32_t)(base + w * T + t + 1)) return 0;
    }
    return 1;
}

static void test_order_no_shuffle(void) {
    enum { T = 4, B = 3 };
    const char *path = write_ramp("ramp.h5", H5T_STD_U16LE, 10 * T + 3, 0, 65536); /* W=10 */
    char err[512] = "";
    batch_loader *l = loader_create(path, T, B, 0, B, 0, 0, 1, err, sizeof err);
    check(l != NULL, "order: loader_create failed: %s", err);
    if (!l) return;
    check(loader_windows(l) == 10, "order: W = %ld, expected 10", loader_windows(l));
    int32_t in[B * T], tg[B * T]; /* [B, T] */
    for (long s = 1; s <= 9; s++) { /* 27 rows: wraps past W twice */
        int rc = loader_get(l, s, in, tg, err, sizeof err);
        check(rc == 0, "order: step %ld failed: %s", s, err);
        for (int j = 0; j < B; j++) {
            long w = ((s - 1) * B + j) % 10;
            check(loader_window(l, s, j) == w, "order: loader_window(%ld, %d) != %ld", s, j, w);
            check(row_is_window(in, tg, j, T, w, 0), "order: step %ld row %d is not window %ld",
                  s, j, w);
        }
    }
    loader_destroy(l);

    /* exactly 10 T tokens: the last window would need one token past the end (its last
     * target), so 9 windows; every one of them reads (window 8 is step 3's row 2) */
    path = write_ramp("ramp_exact.h5", H5T_STD_U16LE, 10 * T, 0, 65536);
    l = loader_create(path, T, B, 0, B, 0, 0, 1, err, sizeof err);
    check(l != NULL, "order, 10 T tokens: loader_create failed: %s", err);
    if (!l) return;
    check(loader_windows(l) == 9, "order, 10 T tokens: W = %ld, expected 9", loader_windows(l));
    for (long s = 1; s <= 3; s++)
        check(loader_get(l, s, in, tg, err, sizeof err) == 0, "order, 10 T tokens: step %ld: %s",
              s, err);
    check(row_is_window(in, tg, 2, T, 8, 0), "order, 10 T tokens: step 3 row 2 is not window 8");
    loader_destroy(l);
}

/* rows [begin, end) of a loader equal the same rows of the full-batch loader. */
static void test_slices(int shuffle) {
    enum { T = 5, B = 6 };
    const char *path = write_ramp(shuffle ? "slices_s.h5" : "slices.h5", H5T_STD_U16LE,
                                  23 * T + 2, 0, 65536);
    char err[512] = "";
    batch_loader *full = loader_create(path, T, B, 0, B, 65536, shuffle, 7, err, sizeof err);
    check(full != NULL, "slices: full loader failed: %s", err);
    const int ranges[3][2] = {{0, 2}, {2, 5}, {5, 6}};
    for (int k = 0; full && k < 3; k++) {
        int b = ranges[k][0], e = ranges[k][1];
        batch_loader *part = loader_create(path, T, B, b, e, 65536, shuffle, 7, err, sizeof err);
        check(part != NULL, "slices: loader rows [%d,%d) failed: %s", b, e, err);
        if (!part) continue;
        int32_t fin[B * T], ftg[B * T], pin[B * T], ptg[B * T]; /* [B, T], [e-b, T] used */
        for (long s = 1; s <= 12; s++) {
            int rc = loader_get(full, s, fin, ftg, err, sizeof err) |
                     loader_get(part, s, pin, ptg, err, sizeof err);
            size_t off = (size_t)b * T, len = (size_t)(e - b) * T * sizeof(int32_t);
            check(rc == 0 && memcmp(pin, fin + off, len) == 0 && memcmp(ptg, ftg + off, len) == 0,
                  "slices (shuffle %d): rows [%d,%d) of step %ld differ from the full batch",
                  shuffle, b, e, s);
        }
        loader_destroy(part);
    }
    loader_destroy(full);
}

/* Windows of epoch e, in global-row order: out[W]. */
static void epoch_windows(const batch_loader *l, int B, long e, long *out) {
    long W = loader_windows(l);
    for (long i = 0; i < W; i++) {
        long g = e * W + i;
        out[i] = loader_window(l, g / B + 1, (int)(g % B));
    }
}

static int is_permutation(const long *v, long W) {
    char *seen = calloc((size_t)W, 1); /* [W] */
    int ok = 1;
    for (long i = 0; i < W && ok; i++) {
        if (v[i] < 0 || v[i] >= W || seen[v[i]]) ok = 0;
        else seen[v[i]] = 1;
    }
    free(seen);
    return ok;
}

static void test_shuffle(void) {
    enum { T = 3, B = 5, W = 37 };
    const char *path = write_ramp("shuffle.h5", H5T_STD_U16LE, W * T + 2, 0, 65536);
    char err[512] = "";
    batch_loader *a = loader_create(path, T, B, 0, B, 0, 1, 1234, err, sizeof err);
    batch_loader *a2 = loader_create(path, T, B, 0, B, 0, 1, 1234, err, sizeof err);
    batch_loader *c = loader_create(path, T, B, 0, B, 0, 1, 99, err, sizeof err);
    check(a && a2 && c, "shuffle: loader_create failed: %s", err);
    if (!a || !a2 || !c) return;
    long e0[W], e1[W], again[W], other[W];
    epoch_windows(a, B, 0, e0);
    epoch_windows(a, B, 1, e1);
    check(is_permutation(e0, W), "shuffle: epoch 0 is not a permutation of [0, W)");
    check(is_permutation(e1, W), "shuffle: epoch 1 is not a permutation of [0, W)");
    check(memcmp(e0, e1, sizeof e0) != 0, "shuffle: epochs 0 and 1 have the same order");
    long fixed = 0;
    for (long i = 0; i < W; i++) fixed += e0[i] == i;
    check(fixed < W / 2, "shuffle: epoch 0 leaves %ld of %d windows in place", fixed, (int)W);
    epoch_windows(a2, B, 1, again);
    check(memcmp(e1, again, sizeof e1) == 0, "shuffle: same seed gave a different order");
    epoch_windows(c, B, 1, other);
    check(memcmp(e1, other, sizeof e1) != 0, "shuffle: seeds 1234 and 99 gave the same order");
    int32_t in[B * T], tg[B * T]; /* [B, T] */
    for (long s = 1; s <= 16; s++) { /* 80 rows: crosses into epoch 2 */
        int rc = loader_get(a, s, in, tg, err, sizeof err);
        check(rc == 0, "shuffle: step %ld failed: %s", s, err);
        for (int j = 0; j < B; j++)
            check(row_is_window(in, tg, j, T, loader_window(a, s, j), 0),
                  "shuffle: step %ld row %d does not hold its window", s, j);
    }
    loader_destroy(a);
    loader_destroy(a2);
    loader_destroy(c);

    /* Tiny W (1 and 2) still permutes. */
    for (long w = 1; w <= 2; w++) {
        const char *p = write_ramp(w == 1 ? "w1.h5" : "w2.h5", H5T_STD_U16LE, w * T + 1, 0, 256);
        batch_loader *t = loader_create(p, T, 3, 0, 3, 0, 1, 5, err, sizeof err);
        check(t && loader_windows(t) == w, "shuffle: W=%ld loader failed: %s", w, err);
        if (!t) continue;
        long v[2];
        for (long e = 0; e < 4; e++) {
            epoch_windows(t, 3, e, v);
            check(is_permutation(v, w), "shuffle: W=%ld epoch %ld is not a permutation", w, e);
        }
        loader_destroy(t);
    }
}

/* Sequential gets (the prefetch path) against the same steps in a scattered order. */
static void test_prefetch(int shuffle) {
    enum { T = 8, B = 4, STEPS = 20 };
    const char *path = write_ramp(shuffle ? "prefetch_s.h5" : "prefetch.h5", H5T_STD_U32LE,
                                  29 * T + 5, 1000, 1 << 20);
    char err[512] = "";
    batch_loader *seq = loader_create(path, T, B, 1, 4, 0, shuffle, 3, err, sizeof err);
    batch_loader *rnd = loader_create(path, T, B, 1, 4, 0, shuffle, 3, err, sizeof err);
    check(seq && rnd, "prefetch: loader_create failed: %s", err);
    if (!seq || !rnd) return;
    enum { ROWS = 3 };
    static int32_t in[STEPS][ROWS * T], tg[STEPS][ROWS * T]; /* [steps, rows, T] */
    for (int s = 1; s <= STEPS; s++) {
        int rc = loader_get(seq, s, in[s - 1], tg[s - 1], err, sizeof err);
        check(rc == 0, "prefetch: sequential step %d failed: %s", s, err);
    }
    const int order[STEPS] = {17, 3, 11, 20, 1, 8, 14, 5, 19, 2, 12, 7, 16, 10, 4, 18, 9, 13, 6, 15};
    for (int k = 0; k < STEPS; k++) {
        int s = order[k];
        int32_t rin[ROWS * T], rtg[ROWS * T]; /* [rows, T] */
        int rc = loader_get(rnd, s, rin, rtg, err, sizeof err);
        check(rc == 0 && memcmp(rin, in[s - 1], sizeof rin) == 0 &&
                  memcmp(rtg, tg[s - 1], sizeof rtg) == 0,
              "prefetch (shuffle %d): step %d read sequentially differs from a direct read",
              shuffle, s);
        for (int r = 0; r < ROWS; r++)
            check(row_is_window(in[s - 1], tg[s - 1], r, T, loader_window(seq, s, 1 + r), 1000),
                  "prefetch (shuffle %d): step %d row %d is not its window", shuffle, s, r);
    }
    /* Asking for the step already prefetched twice, then jumping back, still works. */
    int32_t rin[ROWS * T], rtg[ROWS * T]; /* [rows, T] */
    int rc = loader_get(seq, STEPS, rin, rtg, err, sizeof err) |
             loader_get(seq, 2, rin, rtg, err, sizeof err);
    check(rc == 0 && memcmp(rin, in[1], sizeof rin) == 0, "prefetch: jump back to step 2 differs");
    loader_destroy(seq);
    loader_destroy(rnd);
}

/* uint32 tokens above 65535 and uint8 tokens come back as the int32 values written. */
static void test_widths(void) {
    char err[512] = "";
    const char *p32 = write_ramp("u32.h5", H5T_STD_U32LE, 50, 100000, 200000);
    token_file *f = tokens_open(p32, 0, err, sizeof err);
    check(f != NULL, "uint32: open failed: %s", err);
    if (f) {
        int32_t buf[50]; /* [50] */
        check(tokens_count(f) == 50 && tokens_vocab(f) == 200000, "uint32: count/vocab wrong");
        check(tokens_read(f, 0, 50, buf, err, sizeof err) == 0, "uint32: read failed: %s", err);
        for (int i = 0; i < 50; i++)
            check(buf[i] == 100000 + i, "uint32: token %d is %d", i, (int)buf[i]);
        tokens_close(f);
    }
    const char *p8 = write_ramp("u8.h5", H5T_STD_U8LE, 200, 10, 256);
    batch_loader *l = loader_create(p8, 16, 2, 0, 2, 256, 0, 0, err, sizeof err);
    check(l != NULL, "uint8: loader failed: %s", err);
    if (l) {
        int32_t in[2 * 16], tg[2 * 16]; /* [B, T] */
        int rc = loader_get(l, 3, in, tg, err, sizeof err);
        check(rc == 0 && row_is_window(in, tg, 0, 16, 4, 10) && row_is_window(in, tg, 1, 16, 5, 10),
              "uint8: step 3 rows are not windows 4 and 5: %s", err);
        loader_destroy(l);
    }
    /* vocab_size on the dataset wins over the one on the root. */
    uint32_t vals[40]; /* [40] */
    for (int i = 0; i < 40; i++) vals[i] = (uint32_t)i * 7;
    file_spec both = {H5T_STD_U16LE, 0, VOCAB_BOTH, 600, "tokens"};
    const char *pb = tmp_path("both.h5");
    write_file(pb, &both, vals, 40);
    f = tokens_open(pb, 0, err, sizeof err);
    check(f && tokens_vocab(f) == 600, "vocab on dataset: expected 600: %s", err);
    tokens_close(f);
}

/* loader_create(path) must fail with every key in err. */
static void expect_create_error(const char *what, const char *path, int T, long model_vocab,
                                const char *const *keys) {
    char err[512] = "";
    batch_loader *l = loader_create(path, T, 2, 0, 2, model_vocab, 0, 0, err, sizeof err);
    check(l == NULL, "%s: loader_create succeeded", what);
    loader_destroy(l);
    for (int k = 0; keys[k]; k++)
        check(strstr(err, keys[k]) != NULL, "%s: error \"%s\" lacks \"%s\"", what, err, keys[k]);
    check(strchr(err, '\n') == NULL, "%s: error is not one line", what);
}

static void error_file(const char *name, const file_spec *spec, long n) {
    uint32_t *vals = calloc((size_t)n, sizeof *vals); /* [n] */
    write_file(tmp_path(name), spec, vals, (hsize_t)n);
    free(vals);
}

static void test_open_errors(void) {
    expect_create_error("missing file", tmp_path("missing.h5"), 4, 0,
                        (const char *const[]){"data.path", "missing.h5", "No such file", NULL});

    const char *txt = tmp_path("notes.txt");
    FILE *fp = fopen(txt, "w");
    fputs("this is not HDF5\n", fp);
    fclose(fp);
    expect_create_error("not HDF5", txt, 4, 0,
                        (const char *const[]){"notes.txt", "not an HDF5 file", NULL});

    file_spec other = {H5T_STD_U16LE, 0, VOCAB_ROOT, 256, "other"};
    error_file("notokens.h5", &other, 100);
    expect_create_error("no /tokens", made[n_made - 1], 4, 0,
                        (const char *const[]){"notokens.h5", "no dataset /tokens", NULL});

    /* /tokens an external link to a file that is not there: named, with where it leads
     * (it said only "/tokens is not a dataset") */
    const char *dangling = tmp_path("dangling.h5");
    hid_t df = H5Fcreate(dangling, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    H5Lcreate_external("nosuch_target.h5", "tokens", df, "tokens", H5P_DEFAULT, H5P_DEFAULT);
    H5Fclose(df);
    expect_create_error("external link to a missing file", dangling, 4, 0,
                        (const char *const[]){"dangling.h5", "external link", "nosuch_target.h5",
                                              "cannot be opened", NULL});

    file_spec two_d = {H5T_STD_U16LE, 1, VOCAB_ROOT, 256, "tokens"};
    error_file("twod.h5", &two_d, 100);
    expect_create_error("2-D", made[n_made - 1], 4, 0,
                        (const char *const[]){"twod.h5", "2 dimensions", "expected 1", NULL});

    const struct {
        const char *file;
        hid_t type;
        const char *key;
    } types[] = {{"float.h5", H5T_IEEE_F32LE, "32-bit floats"},
                 {"signed.h5", H5T_STD_I16LE, "signed 16-bit"},
                 {"u64.h5", H5T_STD_U64LE, "unsigned 64-bit"}};
    for (int i = 0; i < 3; i++) {
        file_spec s = {types[i].type, 0, VOCAB_ROOT, 256, "tokens"};
        error_file(types[i].file, &s, 100);
        expect_create_error(types[i].file, made[n_made - 1], 4, 0,
                            (const char *const[]){types[i].file, types[i].key,
                                                  "expected unsigned 8-, 16- or 32-bit", NULL});
    }

    file_spec novocab = {H5T_STD_U16LE, 0, VOCAB_NONE, 0, "tokens"};
    error_file("novocab.h5", &novocab, 100);
    expect_create_error("no vocab_size", made[n_made - 1], 4, 0,
                        (const char *const[]){"novocab.h5", "no vocab_size attribute", NULL});


    /* an unsigned 64-bit vocab_size past LLONG_MAX: said as it is (HDF5's conversion to
     * long long had clipped it to 9223372036854775807) */
    error_file("u64vocab.h5", &novocab, 100);
    hid_t uf = H5Fopen(made[n_made - 1], H5F_ACC_RDWR, H5P_DEFAULT);
    hid_t us = H5Screate(H5S_SCALAR);
    hid_t ua = H5Acreate2(uf, "vocab_size", H5T_STD_U64LE, us, H5P_DEFAULT, H5P_DEFAULT);
    unsigned long long most = ~0ull;
    H5Awrite(ua, H5T_NATIVE_ULLONG, &most);
    H5Aclose(ua), H5Sclose(us), H5Fclose(uf);
    expect_create_error("vocab 2^64 - 1", made[n_made - 1], 4, 0,
                        (const char *const[]){"u64vocab.h5", "vocab_size 18446744073709551615",
                                              "outside", NULL});

    file_spec zero = {H5T_STD_U16LE, 0, VOCAB_ROOT, 0, "tokens"};
    error_file("zerovocab.h5", &zero, 100);
    expect_create_error("vocab 0", made[n_made - 1], 4, 0,
                        (const char *const[]){"zerovocab.h5", "vocab_size 0", NULL});

    const char *shortp = write_ramp("short.h5", H5T_STD_U16LE, 8, 0, 256);
    expect_create_error("short file", shortp, 8, 0,
                        (const char *const[]){"short.h5", "8 tokens", "fewer than one window",
                                              "9 tokens", NULL});
    char err[512] = "";
    batch_loader *ok = loader_create(shortp, 7, 2, 0, 2, 0, 0, 0, err, sizeof err);
    check(ok && loader_windows(ok) == 1, "exactly one window (N = T+1) should load: %s", err);
    loader_destroy(ok);
}

/* A token >= vocab_size at position 1234: direct read, synchronous get, prefetched get. */
static void test_bad_token(void) {
    enum { N = 2000, T = 10, B = 4 };
    uint32_t vals[N]; /* [N] */
    for (int i = 0; i < N; i++) vals[i] = (uint32_t)(i % 256);
    vals[1234] = 300;
    file_spec spec = {H5T_STD_U16LE, 0, VOCAB_ROOT, 256, "tokens"};
    const char *path = tmp_path("badtoken.h5");
    write_file(path, &spec, vals, N);
    const char *key = "badtoken.h5: token 300 at position 1234 is >= the file's vocab_size 256";
    char err[512] = "";

    token_file *f = tokens_open(path, 256, err, sizeof err);
    check(f != NULL, "bad token: open should succeed: %s", err);
    if (f) {
        int32_t buf[N]; /* [N] */
        check(tokens_read(f, 0, 1234, buf, err, sizeof err) == 0, "bad token: prefix read failed");
        err[0] = 0;
        check(tokens_read(f, 1000, 500, buf, err, sizeof err) != 0 && strstr(err, key),
              "bad token: tokens_read error \"%s\" lacks \"%s\"", err, key);
        err[0] = 0;
        check(tokens_read(f, 1990, 20, buf, err, sizeof err) != 0 && strstr(err, "outside"),
              "bad token: read past the end not refused: \"%s\"", err);
        tokens_close(f);
    }
    /* Position 1234 lies in window 123 (tokens 1230..1240) and window 122 (its target
     * 1230 is < 1234, so only 123 holds it): step 31 row 3 with B=4. */
    batch_loader *l = loader_create(path, T, B, 0, B, 256, 0, 0, err, sizeof err);
    check(l != NULL, "bad token: loader_create should succeed: %s", err);
    if (!l) return;
    int32_t in[B * T], tg[B * T]; /* [B, T] */
    err[0] = 0;
    check(loader_get(l, 31, in, tg, err, sizeof err) != 0 && strstr(err, key),
          "bad token: synchronous get error \"%s\" lacks \"%s\"", err, key);
    err[0] = 0;
    check(loader_get(l, 30, in, tg, err, sizeof err) == 0, "bad token: step 30 failed: %s", err);
    err[0] = 0;
    check(loader_get(l, 31, in, tg, err, sizeof err) != 0 && strstr(err, key),
          "bad token: prefetched get error \"%s\" lacks \"%s\"", err, key);
    err[0] = 0;
    check(loader_get(l, 32, in, tg, err, sizeof err) == 0, "bad token: step 32 after the error failed: %s",
          err);
    /* loader_check before a run: the whole file, whatever steps the run reads (steps 1..2
     * read windows 0..7 only); in parts, the part holding position 1234 fails and the
     * others pass: of 2 parts [1000, 2000), of 3 [666, 1333) and not [1333, 2000) */
    err[0] = 0;
    /* each chunk read is progress for the watchdog: a large file's check takes longer
     * than train.comm_timeout_s */
    long beats = watchdog_beats();
    check(loader_check(l, 0, 1, err, sizeof err) != 0 && strstr(err, key),
          "loader_check of the whole file: error \"%s\" lacks \"%s\"", err, key);
    check(watchdog_beats() > beats, "loader_check: no watchdog beat in its pass");
    const int parts[][3] = {{0, 2, 0}, {1, 2, 1}, {0, 3, 0}, {1, 3, 1}, {2, 3, 0}};
    for (int i = 0; i < 5; i++) {
        err[0] = 0;
        int rc = loader_check(l, parts[i][0], parts[i][1], err, sizeof err);
        check(parts[i][2] ? rc != 0 && strstr(err, key) : rc == 0,
              "loader_check part %d of %d: rc %d, \"%s\"", parts[i][0], parts[i][1], rc, err);
    }
    /* the bytes a peer may still read: the largest part's uint16 tokens and a round trip,
     * and its share of the file's bytes (tokens_watch) and a round trip */
    struct stat st;
    stat(path, &st);
    double share = ceil((double)st.st_size / 3);
    check(loader_check_bytes(l, 3) == 667 * 2 + 65536.0 + share + 65536.0,
          "loader_check_bytes of 3 parts: %g, want %g", loader_check_bytes(l, 3),
          667 * 2 + 65536.0 + share + 65536.0);
    loader_destroy(l);

    /* A file whose vocab_size (50257) is larger than the model's (256): it opens, and the
     * model's limit applies to every token read */
    file_spec big = {H5T_STD_U16LE, 0, VOCAB_DATASET, 50257, "tokens"};
    const char *bigp = tmp_path("bigvocab.h5");
    write_file(bigp, &big, vals, N);
    const char *bigkey = "bigvocab.h5: token 300 at position 1234 is >= the model's vocab_size 256";
    err[0] = 0;
    f = tokens_open(bigp, 256, err, sizeof err);
    check(f != NULL, "vocab_size above the model's: open should succeed: %s", err);
    if (f) {
        int32_t buf[N]; /* [N] */
        check(tokens_read(f, 0, 1234, buf, err, sizeof err) == 0, "big vocab: prefix read failed");
        check(tokens_read(f, 1000, 500, buf, err, sizeof err) != 0 && strstr(err, bigkey),
              "big vocab: tokens_read error \"%s\" lacks \"%s\"", err, bigkey);
        tokens_close(f);
    }
    f = tokens_open(bigp, 0, err, sizeof err); /* no model: the file's own limit, 300 fits */
    if (f) {
        int32_t buf[N]; /* [N] */
        check(tokens_read(f, 0, N, buf, err, sizeof err) == 0 && buf[1234] == 300,
              "big vocab without a model limit: %s", err);
        tokens_close(f);
    }
}

/* ---- gptc-data ---- */

static int run(const char *cmd) {
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void write_text(const char *path, const char *text, size_t len) {
    FILE *fp = fopen(path, "wb");
    if (!fp || fwrite(text, 1, len, fp) != len) {
        fprintf(stderr, "test_tokens: cannot write %s\n", path);
        exit(2);
    }
    fclose(fp);
}

/* The file's tokens equal bytes[n]; dtype_size and chunked describe /tokens. */
static void check_converted(const char *what, const char *path, const unsigned char *bytes,
                            long n, long vocab, size_t dtype_size) {
    char err[512] = "";
    token_file *f = tokens_open(path, 0, err, sizeof err);
    check(f != NULL, "%s: output does not open: %s", what, err);
    if (!f) return;
    check(tokens_count(f) == n, "%s: %ld tokens, expected %ld", what, tokens_count(f), n);
    check(tokens_vocab(f) == vocab, "%s: vocab %ld, expected %ld", what, tokens_vocab(f), vocab);
    int32_t *buf = malloc((size_t)n * sizeof *buf); /* [n] */
    if (tokens_count(f) == n && tokens_read(f, 0, n, buf, err, sizeof err) == 0) {
        long bad = -1;
        for (long i = 0; i < n && bad < 0; i++)
            if (buf[i] != bytes[i]) bad = i;
        check(bad < 0, "%s: token %ld differs from the input byte", what, bad);
    } else {
        check(0, "%s: read failed: %s", what, err);
    }
    free(buf);
    tokens_close(f);

    tokens_hdf5_lock();
    hid_t file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    hid_t dset = H5Dopen2(file, "tokens", H5P_DEFAULT);
    hid_t type = H5Dget_type(dset), dcpl = H5Dget_create_plist(dset);
    check(H5Tget_size(type) == dtype_size, "%s: element size %zu, expected %zu", what,
          H5Tget_size(type), dtype_size);
    check(H5Pget_layout(dcpl) == H5D_CHUNKED, "%s: /tokens is not chunked", what);
    int has_root_vocab = H5Aexists(file, "vocab_size") > 0;
    check(has_root_vocab, "%s: no vocab_size on the file root", what);
    H5Pclose(dcpl);
    H5Tclose(type);
    H5Dclose(dset);
    H5Fclose(file);
    tokens_hdf5_unlock();
}

static void test_cli(const char *bin) {
    static const char a[] = "Hello, world!\nThe quick brown fox.\n";
    const unsigned char b[] = {0, 1, 200, 255, '\n', 'z'};
    const char *pa = tmp_path("a.txt"), *pb = tmp_path("b.bin");
    write_text(pa, a, sizeof a - 1);
    write_text(pb, (const char *)b, sizeof b);
    unsigned char want[64]; /* [len(a) + len(b)] */
    memcpy(want, a, sizeof a - 1);
    memcpy(want + sizeof a - 1, b, sizeof b);
    long n = (long)(sizeof a - 1 + sizeof b);
    char cmd[2048];

    const char *out = tmp_path("text.h5");
    /* the temporary file of a conversion killed mid-way, whose process is gone (a child
     * that has exited and been reaped): removed by the next conversion to that name */
    pid_t gone = fork();
    if (gone == 0) _exit(0);
    waitpid(gone, NULL, 0);
    char stale_name[64];
    snprintf(stale_name, sizeof stale_name, "text.h5.tmp.%ld", (long)gone);
    const char *stale = tmp_path(stale_name);
    write_text(stale, "half\n", 5);
    /* a user's file of the name a fixed temporary file had: truncated and renamed away */
    const char *users = tmp_path("text.h5.tmp");
    write_text(users, "mine\n", 5);
    snprintf(cmd, sizeof cmd, "'%s' --out '%s' '%s' '%s' > /dev/null", bin, out, pa, pb);
    check(run(cmd) == 0, "cli: %s failed", cmd);
    check(!tmp_left("text.h5"), "cli: the temporary file was left behind, or %s was not removed",
          stale);
    check_converted("cli bytes", out, want, n, 256, 2);
    unsigned char mine[8] = {0};
    FILE *fu = fopen(users, "rb");
    check(fu && fread(mine, 1, sizeof mine, fu) == 5 && memcmp(mine, "mine\n", 5) == 0,
          "cli: a user's text.h5.tmp was changed");
    if (fu) fclose(fu);
    char err[512] = "";
    batch_loader *l = loader_create(out, 8, 2, 0, 2, 256, 0, 0, err, sizeof err);
    check(l != NULL, "cli: loader on the output failed: %s", err);
    if (l) {
        int32_t in[2 * 8], tg[2 * 8]; /* [B, T] */
        int rc = loader_get(l, 2, in, tg, err, sizeof err);
        check(rc == 0 && in[0] == want[16] && tg[15] == want[32], "cli: step 2 rows wrong: %s", err);
        loader_destroy(l);
    }

    const char *out2 = tmp_path("stdin.h5");
    snprintf(cmd, sizeof cmd, "printf 'xyz' | '%s' --vocab 70000 --out '%s' - '%s' > /dev/null",
             bin, out2, pa);
    check(run(cmd) == 0, "cli: %s failed", cmd);
    unsigned char want2[64]; /* ["xyz" + a] */
    memcpy(want2, "xyz", 3);
    memcpy(want2 + 3, a, sizeof a - 1);
    check_converted("cli stdin + uint32", out2, want2, (long)(3 + sizeof a - 1), 70000, 4);

    /* More than one 1M-token block, so the dataset is extended several times. */
    long big_n = (2L << 20) + 12345;
    unsigned char *big = malloc((size_t)big_n); /* [big_n] */
    for (long i = 0; i < big_n; i++) big[i] = (unsigned char)((i * 2654435761u) >> 13);
    const char *pbig = tmp_path("big.bin"), *out3 = tmp_path("big.h5");
    write_text(pbig, (const char *)big, (size_t)big_n);
    snprintf(cmd, sizeof cmd, "'%s' --out '%s' '%s' > /dev/null", bin, out3, pbig);
    check(run(cmd) == 0, "cli: %s failed", cmd);
    check_converted("cli big", out3, big, big_n, 256, 2);
    free(big);

    const char *bad = tmp_path("bad.h5");
    snprintf(cmd, sizeof cmd, "'%s' --out '%s' '%s' 2> /dev/null", bin, bad, tmp_path("nope.txt"));
    check(run(cmd) != 0, "cli: a missing input was accepted");
    check(access(bad, F_OK) != 0, "cli: a failed run left %s", bad);
    snprintf(cmd, sizeof cmd, "'%s' --vocab 100 --out '%s' '%s' 2> /dev/null", bin, bad, pa);
    check(run(cmd) != 0, "cli: a byte >= --vocab was accepted");
    snprintf(cmd, sizeof cmd, "'%s' --out '%s' 2> /dev/null", bin, bad);
    check(run(cmd) != 0, "cli: no inputs was accepted");
    snprintf(cmd, sizeof cmd, "'%s' --out '' '%s' 2>&1 | grep -q '^gptc-data: --out needs a value'",
             bin, pa);
    check(run(cmd) == 0, "cli: --out '' was not refused as a missing value");
    snprintf(cmd, sizeof cmd, "'%s' --bogus 2> /dev/null", bin);
    check(run(cmd) != 0, "cli: an unknown option was accepted");
    /* a name with a newline in it: the error stays one line, the newline escaped */
    snprintf(cmd, sizeof cmd,
             "test \"$('%s' --out '%s' \"$(printf 'no\\nsuch')\" 2>&1 | wc -l)\" = 1 && "
             "'%s' --out '%s' \"$(printf 'no\\nsuch')\" 2>&1 | grep -q '^gptc-data: no\\\\nsuch:'",
             bin, bad, bin, bad);
    check(run(cmd) == 0, "cli: an error naming a file with a newline is not one line");
    /* an empty input: refused, naming it */
    const char *empty = tmp_path("empty.txt");
    write_text(empty, "", 0);
    snprintf(cmd, sizeof cmd, "'%s' --out '%s' '%s' 2>&1 | grep -q 'empty.txt holds no bytes'",
             bin, bad, empty);
    check(run(cmd) == 0, "cli: an empty input was not refused by name");
    snprintf(cmd, sizeof cmd, "'%s' --help > /dev/null", bin);
    check(run(cmd) == 0, "cli: --help failed");
    check(!tmp_left("bad.h5"), "cli: a failed run left a temporary bad.h5.tmp.<pid>");

    /* --out naming an input, by another path: refused, the input untouched */
    snprintf(cmd, sizeof cmd, "cd '%s' && '%s' --out ./a.txt '%s' 2> /dev/null", tmpdir, bin, pa);
    check(run(cmd) != 0, "cli: --out over its own input was accepted");
    FILE *fa = fopen(pa, "rb");
    char back[sizeof a] = "";
    check(fa && fread(back, 1, sizeof a - 1, fa) == sizeof a - 1 && memcmp(back, a, sizeof a - 1) == 0,
          "cli: --out over its own input changed %s", pa);
    if (fa) fclose(fa);

    /* --out a FIFO (or a device: rename() would put the file in its place): refused, the
     * FIFO left as it was */
    const char *fifo = tmp_path("out.fifo");
    check(mkfifo(fifo, 0600) == 0, "cli: mkfifo %s failed", fifo);
    snprintf(cmd, sizeof cmd, "'%s' --out '%s' '%s' 2> /dev/null", bin, fifo, pa);
    check(run(cmd) != 0, "cli: --out onto a FIFO was accepted");
    struct stat st;
    check(stat(fifo, &st) == 0 && S_ISFIFO(st.st_mode), "cli: --out replaced the FIFO %s", fifo);

    /* --out onto an existing file that is not HDF5 (a typo for an input): refused, the
     * file kept; onto an earlier output (HDF5) it is replaced, as reruns want */
    const char *notes = tmp_path("notes.txt");
    write_text(notes, "mine\n", 5);
    snprintf(cmd, sizeof cmd, "'%s' --out '%s' '%s' 2> /dev/null", bin, notes, pa);
    check(run(cmd) != 0, "cli: --out onto a text file was accepted");
    FILE *fn = fopen(notes, "rb");
    char kept[8] = "";
    check(fn && fread(kept, 1, 5, fn) == 5 && memcmp(kept, "mine\n", 5) == 0,
          "cli: --out onto a text file changed it");
    if (fn) fclose(fn);
    snprintf(cmd, sizeof cmd, "'%s' --out '%s' '%s' > /dev/null", bin, out, pa);
    check(run(cmd) == 0, "cli: --out onto an earlier output was refused");

    /* an input named as a fixed temporary file of --out would be (PATH.tmp), which the run
     * truncated at its start: converted, and untouched */
    const char *as_tmp = tmp_path("corpus.tmp");
    write_text(as_tmp, a, sizeof a - 1);
    snprintf(cmd, sizeof cmd, "'%s' --out '%s' '%s' > /dev/null", bin, tmp_path("corpus"), as_tmp);
    check(run(cmd) == 0, "cli: an input named corpus.tmp, --out corpus, was refused");
    fa = fopen(as_tmp, "rb");
    check(fa && fread(back, 1, sizeof a - 1, fa) == sizeof a - 1 && memcmp(back, a, sizeof a - 1) == 0,
          "cli: an input named as --out's temporary file was changed");
    if (fa) fclose(fa);

    /* stopped by SIGINT while it waits for input (its temporary file already made): the
     * temporary file goes with it */
    const char *stopped = tmp_path("stopped.h5");
    snprintf(cmd, sizeof cmd, "sleep 1 | timeout -s INT 0.3 '%s' --out '%s' - 2> /dev/null", bin,
             stopped);
    check(run(cmd) != 0, "cli: a run stopped by SIGINT exited 0");
    check(!tmp_left("stopped.h5"), "cli: a run stopped by SIGINT left its temporary file");
    check(access(stopped, F_OK) != 0, "cli: a run stopped by SIGINT wrote %s", stopped);
}

/* A file at path whose uint16 /tokens of shape space is stored as dcpl says (a virtual
 * dataset's mappings, external files), with vocab_size 65536 on the root; the caller
 * holds the HDF5 lock. Exits on failure: the test cannot go on. */
static void create_stored_elsewhere(const char *path, hid_t space, hid_t dcpl) {
    hid_t file = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    hid_t dset = H5Dcreate2(file, "tokens", H5T_STD_U16LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    if (file < 0 || dset < 0) {
        fprintf(stderr, "test_tokens: cannot write %s\n", path);
        exit(2);
    }
    write_attr(file, 1 << 16);
    H5Dclose(dset);
    H5Fclose(file);
}

/* A virtual /tokens of n tokens in vds_name, mapped from the given parts: part k puts
 * source file files[k] (a name relative to the virtual file, or "." for itself), dataset
 * dsets[k], elements [0, src_len[k]) of a source of that extent, at tokens [at[k],
 * at[k] + src_len[k]). */
static const char *write_vds(const char *vds_name, hsize_t n, int parts,
                             const char *const *files, const char *const *dsets,
                             const hsize_t *src_len, const hsize_t *at) {
    const char *path = tmp_path(vds_name);
    tokens_hdf5_lock();
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    hid_t vspace = H5Screate_simple(1, &n, NULL);
    for (int k = 0; k < parts; k++) {
        hid_t src = H5Screate_simple(1, &src_len[k], NULL);
        H5Sselect_hyperslab(vspace, H5S_SELECT_SET, &at[k], NULL, &src_len[k], NULL);
        H5Pset_virtual(dcpl, vspace, files[k], dsets[k], src);
        H5Sclose(src);
    }
    H5Sselect_all(vspace);
    create_stored_elsewhere(path, vspace, dcpl);
    H5Sclose(vspace);
    H5Pclose(dcpl);
    tokens_hdf5_unlock();
    return path;
}

static const char *write_external_as(const char *name, const char *ext_name, hsize_t n,
                                     hsize_t have, int relative);

/* A /tokens stored in the external file ext_name (n uint16 tokens i + 1 from offset 16, of
 * which only the first have tokens are written to it); returns the HDF5 file's path. */
static const char *write_external(const char *name, const char *ext_name, hsize_t n,
                                  hsize_t have) {
    return write_external_as(name, ext_name, n, have, 0);
}

/* write_external, the external file named relative (ext_name alone: HDF5 looks for it
 * under HDF5_EXTFILE_PREFIX, else in the working directory) when relative */
static const char *write_external_as(const char *name, const char *ext_name, hsize_t n,
                                     hsize_t have, int relative) {
    const char *ext = tmp_path(ext_name);
    FILE *fp = fopen(ext, "wb");
    uint16_t pad[8] = {0};
    fwrite(pad, sizeof pad, 1, fp);
    for (hsize_t i = 0; i < have; i++) {
        uint16_t v = (uint16_t)(i + 1);
        fwrite(&v, sizeof v, 1, fp);
    }
    fclose(fp);
    const char *path = tmp_path(name);
    tokens_hdf5_lock();
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_external(dcpl, relative ? ext_name : ext, 16, n * 2);
    hid_t space = H5Screate_simple(1, &n, NULL);
    create_stored_elsewhere(path, space, dcpl);
    H5Sclose(space);
    H5Pclose(dcpl);
    tokens_hdf5_unlock();
    return path;
}

/* A virtual /tokens of 50 tokens mapped from dataset src of its own file (source file
 * "."), where a dataset "part" holds tokens 7 + i; returns the file's path. */
static const char *write_vds_self(const char *name, const char *src) {
    const char *path = tmp_path(name);
    hsize_t n = 50;
    uint32_t vals[50];
    for (int i = 0; i < 50; i++) vals[i] = 7 + (uint32_t)i;
    tokens_hdf5_lock();
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE), space = H5Screate_simple(1, &n, NULL);
    H5Pset_virtual(dcpl, space, ".", src, space);
    hid_t file = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    hid_t part = H5Dcreate2(file, "part", H5T_STD_U16LE, space, H5P_DEFAULT, H5P_DEFAULT,
                            H5P_DEFAULT);
    hid_t dset = H5Dcreate2(file, "tokens", H5T_STD_U16LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    if (file < 0 || part < 0 || dset < 0 ||
        H5Dwrite(part, H5T_NATIVE_UINT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, vals) < 0) {
        fprintf(stderr, "test_tokens: cannot write %s\n", path);
        exit(2);
    }
    write_attr(file, 1 << 16);
    H5Dclose(dset);
    H5Dclose(part);
    H5Fclose(file);
    H5Sclose(space);
    H5Pclose(dcpl);
    tokens_hdf5_unlock();
    return path;
}

/* Virtual and external /tokens: read through when every source is there; refused, naming
 * what is missing, when HDF5 would read part of it as zeros. */
static void test_sources(void) {
    /* two shards side by side: tokens 1000 + i */
    write_ramp("shard0.h5", H5T_STD_U16LE, 60, 1000, 1 << 16);
    write_ramp("shard1.h5", H5T_STD_U16LE, 40, 1060, 1 << 16);
    const char *files[] = {"shard0.h5", "shard1.h5"}, *dsets[] = {"tokens", "tokens"};
    hsize_t len[] = {60, 40}, at[] = {0, 60};
    const char *vds = write_vds("vds.h5", 100, 2, files, dsets, len, at);
    char err[512] = "";
    token_file *f = tokens_open(vds, 0, err, sizeof err);
    check(f != NULL, "vds over two shards: %s", err);
    if (f) {
        int32_t got[100]; /* every token, across the shards' boundary at 60 */
        int same = tokens_count(f) == 100 && tokens_read(f, 0, 100, got, err, sizeof err) == 0;
        for (int i = 0; same && i < 100; i++) same = got[i] == 1000 + i;
        check(same, "vds over two shards: the tokens read are not the shards' %s", err);
        tokens_close(f);
    }
    batch_loader *l;

    /* absolute source names that are gone, the files beside the virtual one (a folder
     * moved whole): HDF5 finds them by their last component, and so must the check */
    const char *moved[] = {"/gptc-nowhere/shard0.h5", "/gptc-nowhere/shard1.h5"};
    l = loader_create(write_vds("vds_moved.h5", 100, 2, moved, dsets, len, at), 9, 2, 0, 2, 0,
                      0, 0, err, sizeof err);
    check(l != NULL, "vds whose absolute sources moved beside it: %s", err);
    loader_destroy(l);

    /* a source in the virtual dataset's own file */
    l = loader_create(write_vds_self("vds_self.h5", "part"), 9, 2, 0, 2, 0, 0, 0, err,
                      sizeof err);
    check(l != NULL, "vds over a dataset of its own file: %s", err);
    if (l) {
        int32_t in[18], tg[18];
        int ok = loader_get(l, 1, in, tg, err, sizeof err) == 0;
        check(ok && in[0] == 7 + 9 * loader_window(l, 1, 0),
              "vds over a dataset of its own file: its tokens are not read: %s", err);
        loader_destroy(l);
    }
    expect_create_error("vds, missing dataset of its own file",
                        write_vds_self("vds_self_gone.h5", "absent"), 9, 0,
                        (const char *const[]){"vds_self_gone.h5", "no dataset absent", NULL});

    const char *gone[] = {"shard0.h5", "nowhere.h5"};
    expect_create_error("vds, missing source file",
                        write_vds("vds_gone.h5", 100, 2, gone, dsets, len, at), 9, 0,
                        (const char *const[]){"data.path", "vds_gone.h5", "nowhere.h5",
                                              "cannot be found", "read as 0", NULL});
    const char *wrong[] = {"tokens", "other"};
    expect_create_error("vds, missing source dataset",
                        write_vds("vds_dset.h5", 100, 2, files, wrong, len, at), 9, 0,
                        (const char *const[]){"vds_dset.h5", "shard1.h5", "no dataset other",
                                              NULL});
    hsize_t too_long[] = {60, 50}; /* shard1 holds 40 */
    expect_create_error("vds, short source",
                        write_vds("vds_short.h5", 110, 2, files, dsets, too_long, at), 9, 0,
                        (const char *const[]){"vds_short.h5", "shard1.h5", "smaller than",
                                              NULL});
    hsize_t gap_at[] = {0, 70}; /* tokens 60 .. 69 unmapped */
    expect_create_error("vds, unmapped tokens",
                        write_vds("vds_gap.h5", 110, 2, files, dsets, len, gap_at), 9, 0,
                        (const char *const[]){"vds_gap.h5", "maps no source to token 60",
                                              "of 110", NULL});

    /* /tokens mapped from itself (HDF5 would recurse until the stack ran out), and a
     * source that is itself virtual, here with a source missing: its sources are not
     * checked, so it is refused */
    expect_create_error("vds mapped from itself", write_vds_self("vds_loop.h5", "tokens"), 9, 0,
                        (const char *const[]){"vds_loop.h5", "itself a virtual dataset", NULL});
    const char *nested[] = {"vds_gone.h5"}, *nested_dset[] = {"tokens"};
    hsize_t nested_len[] = {100}, nested_at[] = {0};
    expect_create_error("vds over a vds",
                        write_vds("vds_nested.h5", 100, 1, nested, nested_dset, nested_len,
                                  nested_at),
                        9, 0,
                        (const char *const[]){"vds_nested.h5", "vds_gone.h5:tokens",
                                              "itself a virtual dataset", NULL});

    const char *ext = write_external("ext.h5", "ext.bin", 50, 50);
    l = loader_create(ext, 9, 2, 0, 2, 0, 0, 0, err, sizeof err);
    check(l != NULL, "external file: %s", err);
    loader_destroy(l);
    expect_create_error("external file too short", write_external("ext_short.h5", "ext_short.bin",
                                                                  50, 30), 9, 0,
                        (const char *const[]){"ext_short.h5", "ext_short.bin", "holds 76 bytes",
                                              "needs 100", NULL});
    /* a virtual dataset over that external one: its external file is checked too */
    const char *over_ext[] = {"ext_short.h5"};
    hsize_t ext_len[] = {50};
    expect_create_error("vds over a short external file",
                        write_vds("vds_ext.h5", 50, 1, over_ext, nested_dset, ext_len, nested_at),
                        9, 0,
                        (const char *const[]){"vds_ext.h5", "source", "ext_short.bin",
                                              "holds 76 bytes", "needs 100", NULL});
    l = loader_create(write_vds("vds_ext_ok.h5", 50, 1, (const char *const[]){"ext.h5"},
                                nested_dset, ext_len, nested_at),
                      9, 2, 0, 2, 0, 0, 0, err, sizeof err);
    check(l != NULL, "vds over an external file: %s", err);
    loader_destroy(l);

    /* a relative external name, looked for as HDF5 1.10 does (H5_combine_path): under
     * HDF5_EXTFILE_PREFIX, one prefix and no other place when it is set; a list, or the
     * working directory besides the prefix, passed the check and then failed to read */
    const char *rel = write_external_as("ext_rel.h5", "ext_rel.bin", 50, 50, 1);
    char list[1200], here[1024];
    snprintf(list, sizeof list, "/nonexistent:%s", tmpdir);
    const char *prefixes[][2] = {{tmpdir, NULL}, {list, "cannot be found as /nonexistent:"},
                                 {"/nonexistent", "cannot be found as /nonexistent/ext_rel.bin"}};
    check(getcwd(here, sizeof here) != NULL && chdir(tmpdir) == 0, "external: chdir");
    for (int i = 0; i < 3; i++) {
        setenv("HDF5_EXTFILE_PREFIX", prefixes[i][0], 1);
        err[0] = 0;
        l = loader_create(rel, 9, 2, 0, 2, 0, 0, 0, err, sizeof err);
        int32_t in[18], tg[18]; /* [rows, T] */
        int read = l && loader_get(l, 1, in, tg, err, sizeof err) == 0 &&
                   in[0] == 1 + 9 * loader_window(l, 1, 0);
        check(prefixes[i][1] ? !l && strstr(err, prefixes[i][1]) && strstr(err, "HDF5_EXTFILE_PREFIX")
                             : read,
              "external file under HDF5_EXTFILE_PREFIX=%s: %s '%s'", prefixes[i][0],
              l ? "opened" : "refused", err);
        loader_destroy(l);
    }
    /* ${ORIGIN} for a token file named without a directory: the working directory (it
     * had become "/", and the file was refused) */
    setenv("HDF5_EXTFILE_PREFIX", "${ORIGIN}", 1);
    err[0] = 0;
    l = loader_create("ext_rel.h5", 9, 2, 0, 2, 0, 0, 0, err, sizeof err);
    check(l != NULL, "external file under ${ORIGIN} of a bare file name: '%s'", err);
    loader_destroy(l);
    unsetenv("HDF5_EXTFILE_PREFIX");
    check(chdir(here) == 0, "external: chdir back");
}

/* err holds every one of want (NULL-terminated) */
static int has_all(const char *err, const char *const *want) {
    for (; *want; want++)
        if (!strstr(err, *want)) return 0;
    return 1;
}

/* tokens_read of the first 10 tokens of an open f: 0 and the ramp from base, or -1 and err
 * naming every one of want */
static void expect_read(const char *what, token_file *f, uint32_t base, const char *const *want) {
    int32_t got[10];
    char err[512] = "";
    int rc = tokens_read(f, 0, 10, got, err, sizeof err);
    if (!want) {
        check(rc == 0 && got[0] == (int32_t)base && got[9] == (int32_t)base + 9,
              "%s: read %d (%s), first token %d, want %u", what, rc, err, got[0], base);
        return;
    }
    check(rc != 0 && has_all(err, want), "%s: read %d, error '%s'", what, rc, err);
}

/* Writes token k of the uint32 file at path as v, in place, and moves its modification
 * time on (a write within the same second may keep it) */
static void poke_token(const char *path, long k, uint32_t v) {
    hid_t file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    hid_t dset = H5Dopen2(file, "tokens", H5P_DEFAULT);
    haddr_t at = H5Dget_offset(dset); /* contiguous: the tokens' first byte */
    H5Dclose(dset), H5Fclose(file);
    int fd = open(path, O_WRONLY);
    check(fd >= 0 && at != HADDR_UNDEF &&
              pwrite(fd, &v, sizeof v, (off_t)at + 4 * (off_t)k) == (ssize_t)sizeof v,
          "poke: token %ld of %s", k, path);
    if (fd >= 0) close(fd);
    struct stat st;
    stat(path, &st);
    struct timespec later[2] = {{0, UTIME_OMIT}, {st.st_mtim.tv_sec + 5, 0}};
    utimensat(AT_FDCWD, path, later, 0);
}

/* A same-size write in place between the 64 sampled spans (a large file's bytes are not
 * all in the sample): seen once the loader's check has given a rank its share of the
 * file's bytes (tokens_watch), by the rank whose share holds it; a touch still passes. */
static void test_written_between_samples(void) {
    enum { N = 200000 };                   /* 800 KB of uint32: 64 spans of 4 KB are 1/3 */
    const long k = 2048;                   /* ~8 KB in: between the first and second span */
    const char *path = write_ramp("between.h5", H5T_STD_U32LE, N, 1, 1 << 20);
    char err[512] = "";

    token_file *f = tokens_open(path, 0, err, sizeof err);
    check(f != NULL, "between samples: open: %s", err);
    if (!f) return;
    poke_token(path, k, 7);
    /* the sample alone misses it: else this test would not be about the share */
    expect_read("between samples: no share watched", f, 1, NULL);
    tokens_close(f);

    path = write_ramp("between.h5", H5T_STD_U32LE, N, 1, 1 << 20);
    f = tokens_open(path, 0, err, sizeof err);
    check(f != NULL && tokens_watch(f, 0, 1, err, sizeof err) == 0,
          "between samples: watch the whole: %s", err);
    if (!f) return;
    poke_token(path, k, 7);
    expect_read("between samples: the whole watched", f, 1,
                (const char *const[]){"between.h5", "was written to in place", NULL});
    tokens_close(f);

    for (int part = 0; part < 2; part++) { /* the write is in share 0 of 2 */
        path = write_ramp("between.h5", H5T_STD_U32LE, N, 1, 1 << 20);
        f = tokens_open(path, 0, err, sizeof err);
        check(f != NULL && tokens_watch(f, part, 2, err, sizeof err) == 0,
              "between samples: watch share %d of 2: %s", part, err);
        if (!f) return;
        poke_token(path, k, 7);
        if (part == 0)
            expect_read("between samples: share 0 of 2 (holds the write)", f, 1,
                        (const char *const[]){"between.h5", "was written to in place", NULL});
        else
            expect_read("between samples: share 1 of 2 (the other rank's write)", f, 1, NULL);
        tokens_close(f);
    }

    /* touched, watched: the same bytes, a new time */
    path = write_ramp("between.h5", H5T_STD_U32LE, N, 1, 1 << 20);
    f = tokens_open(path, 0, err, sizeof err);
    check(f != NULL && tokens_watch(f, 0, 1, err, sizeof err) == 0,
          "between samples: watch: %s", err);
    if (!f) return;
    poke_token(path, k, 1 + (uint32_t)k); /* the value it had */
    expect_read("between samples: touched, watched", f, 1, NULL);
    tokens_close(f);

    /* through the loader: its check watches the share, and the next step is refused */
    path = write_ramp("between.h5", H5T_STD_U32LE, N, 1, 1 << 20);
    batch_loader *l = loader_create(path, 8, 2, 0, 2, 0, 0, 0, err, sizeof err);
    check(l != NULL && loader_check(l, 0, 1, err, sizeof err) == 0,
          "between samples: loader check: %s", err);
    if (!l) return;
    int32_t in[16], tg[16]; /* [rows, T] */
    check(loader_get(l, 1, in, tg, err, sizeof err) == 0, "between samples: step 1: %s", err);
    poke_token(path, k, 7);
    int rc = loader_get(l, 2, in, tg, err, sizeof err); /* prefetched before the write, maybe */
    if (rc == 0) rc = loader_get(l, 3, in, tg, err, sizeof err);
    check(rc != 0 && strstr(err, "was written to in place"),
          "between samples: loader after the write: %d '%s'", rc, err);
    loader_destroy(l);
}

/* A token file changed while open: HDF5 would read what a cut left out as zeros, so every
 * read after the change is refused, saying which file changed and how; a file renamed over
 * the path is not the open one, which reads on; the loader's prefetch passes the refusal
 * to the next step. */
static void test_file_changes(void) {
    enum { N = 3000 };
    char err[512] = "";
    const char *cut = write_ramp("change_cut.h5", H5T_STD_U16LE, N, 1, 1 << 16);
    token_file *f = tokens_open(cut, 0, err, sizeof err);
    check(f != NULL, "file changes: open: %s", err);
    if (!f) return;
    expect_read("file changes: before the cut", f, 1, NULL);
    struct stat st;
    stat(cut, &st);
    check(truncate(cut, st.st_size / 2) == 0, "file changes: truncate");
    expect_read("file changes: cut", f, 1,
                (const char *const[]){"change_cut.h5", "changed during the run", "was cut from",
                                      "rename", NULL});
    tokens_close(f);

    /* written in place, same size: a later modification time */
    const char *inplace = write_ramp("change_inplace.h5", H5T_STD_U16LE, N, 1, 1 << 16);
    f = tokens_open(inplace, 0, err, sizeof err);
    check(f != NULL, "file changes: open: %s", err);
    if (!f) return;
    FILE *fp = fopen(inplace, "r+b");
    uint16_t one = 7;
    if (fp) fseek(fp, -2, SEEK_END), fwrite(&one, sizeof one, 1, fp), fclose(fp);
    struct timespec later[2] = {{0, UTIME_OMIT}, {0, 0}};
    stat(inplace, &st);
    later[1].tv_sec = st.st_mtim.tv_sec + 5;
    utimensat(AT_FDCWD, inplace, later, 0);
    expect_read("file changes: written in place", f, 1,
                (const char *const[]){"change_inplace.h5", "was written to in place", NULL});
    tokens_close(f);

    /* touched: a new modification time, the same bytes (a scratch purge's keep-alive) */
    const char *touched = write_ramp("change_touched.h5", H5T_STD_U16LE, N, 1, 1 << 16);
    f = tokens_open(touched, 0, err, sizeof err);
    check(f != NULL, "file changes: open: %s", err);
    if (!f) return;
    stat(touched, &st);
    later[1].tv_sec = st.st_mtim.tv_sec + 5;
    utimensat(AT_FDCWD, touched, later, 0);
    expect_read("file changes: touched", f, 1, NULL);
    tokens_close(f);

    /* a new file renamed over the path (as gptc-data writes): the open file reads on */
    const char *renamed = write_ramp("change_renamed.h5", H5T_STD_U16LE, N, 1, 1 << 16);
    f = tokens_open(renamed, 0, err, sizeof err);
    check(f != NULL, "file changes: open: %s", err);
    if (!f) return;
    const char *other = write_ramp("change_other.h5", H5T_STD_U16LE, N, 500, 1 << 16);
    check(rename(other, renamed) == 0, "file changes: rename");
    expect_read("file changes: another file renamed over it", f, 1, NULL);
    tokens_close(f);

    /* an external file (checked once a step, tokens_check_sources): replaced by a whole
     * file, it reads on; cut short, it is refused */
    const char *ext = write_external("change_ext.h5", "change_ext.bin", 50, 50);
    const char *ext_bin = made[n_made - 2];
    int rc;
    f = tokens_open(ext, 0, err, sizeof err);
    check(f != NULL, "file changes: open: %s", err);
    if (!f) return;
    expect_read("file changes: external, before", f, 1, NULL);
    write_external("change_ext2.h5", "change_ext2.bin", 50, 50);
    check(rename(made[n_made - 2], ext_bin) == 0, "file changes: rename the external file");
    check(tokens_check_sources(f, err, sizeof err) == 0,
          "file changes: an external file replaced by a whole one: %s", err);
    check(truncate(ext_bin, 40) == 0, "file changes: truncate the external file");
    int cut_rc = tokens_check_sources(f, err, sizeof err);
    check(cut_rc != 0 && has_all(err, (const char *const[]){"change_ext.h5", "source file",
                                                           "change_ext.bin",
                                                           "was cut from 116 to 40 bytes",
                                                           NULL}),
          "file changes: external file cut: %d '%s'", cut_rc, err);
    tokens_close(f);

    /* /tokens an external link to another file's: that file is watched as a source;
     * written in place, it is refused (the link's own file is as it was) */
    const char *target = write_ramp("change_target.h5", H5T_STD_U16LE, N, 1, 1 << 16);
    const char *linked = tmp_path("change_link.h5");
    hid_t lf = H5Fcreate(linked, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    H5Lcreate_external(target, "tokens", lf, "tokens", H5P_DEFAULT, H5P_DEFAULT);
    long long v = 1 << 16;
    hid_t as = H5Screate(H5S_SCALAR);
    hid_t at = H5Acreate2(lf, "vocab_size", H5T_STD_I64LE, as, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(at, H5T_NATIVE_LLONG, &v);
    H5Aclose(at), H5Sclose(as), H5Fclose(lf);
    f = tokens_open(linked, 0, err, sizeof err);
    check(f != NULL, "file changes: open through an external link: %s", err);
    if (!f) return;
    check(tokens_check_sources(f, err, sizeof err) == 0, "file changes: external link: %s", err);
    fp = fopen(target, "r+b");
    if (fp) fseek(fp, -2, SEEK_END), fwrite(&one, sizeof one, 1, fp), fclose(fp);
    stat(target, &st);
    later[1].tv_sec = st.st_mtim.tv_sec + 5;
    utimensat(AT_FDCWD, target, later, 0);
    rc = tokens_check_sources(f, err, sizeof err);
    check(rc != 0 && has_all(err, (const char *const[]){"change_link.h5", "source file",
                                                       "change_target.h5",
                                                       "written to in place", NULL}),
          "file changes: external link's target written in place: %d '%s'", rc, err);
    tokens_close(f);

    /* through the loader: step 1 reads, the file is cut while step 2 is prefetched or
     * after; step 2 was read whole before the cut or is refused, and step 3 is refused */
    const char *lpath = write_ramp("change_loader.h5", H5T_STD_U16LE, N, 1, 1 << 16);
    batch_loader *l = loader_create(lpath, 8, 2, 0, 2, 0, 0, 0, err, sizeof err);
    check(l != NULL, "file changes: loader: %s", err);
    if (!l) return;
    int32_t in[16], tg[16]; /* [rows, T] */
    check(loader_get(l, 1, in, tg, err, sizeof err) == 0, "file changes: step 1: %s", err);
    stat(lpath, &st);
    check(truncate(lpath, st.st_size / 2) == 0, "file changes: truncate");
    rc = loader_get(l, 2, in, tg, err, sizeof err);
    if (rc == 0) rc = loader_get(l, 3, in, tg, err, sizeof err);
    check(rc != 0 && strstr(err, "changed during the run"),
          "file changes: loader steps 2 and 3: %d '%s'", rc, err);
    loader_destroy(l);
}

int main(int argc, char **argv) {
    const char *base = getenv("TMPDIR");
    snprintf(tmpdir, sizeof tmpdir, "%s/test_tokens.XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(tmpdir)) {
        perror("test_tokens: mkdtemp");
        return 2;
    }
    if (argc > 1) {
        test_cli(argv[1]);
    } else {
        test_order_no_shuffle();
        test_slices(0);
        test_slices(1);
        test_shuffle();
        test_prefetch(0);
        test_prefetch(1);
        test_widths();
        test_open_errors();
        test_bad_token();
        test_sources();
        test_file_changes();
        test_written_between_samples();
    }
    cleanup();
    if (failures) {
        fprintf(stderr, "test_tokens: %d check(s) failed\n", failures);
        return 1;
    }
    printf("test_tokens: %s passed\n", argc > 1 ? "gptc-data checks" : "all loader checks");
    return 0;
}
