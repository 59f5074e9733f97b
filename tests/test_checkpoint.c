/* Tests of engine/checkpoint.c: bit-exact round trips, hyperslab reads, atomic replacement
 * and one test per refusal (each must fail with a one-line message naming the problem,
 * print nothing to stderr and leave no HDF5 handle open).
 *
 * Usage:
 *   test_checkpoint               run the unit tests in a fresh temporary directory
 *   test_checkpoint --write PATH  write the reference checkpoint (for tests/test_checkpoint_h5py.py)
 *   test_checkpoint --check PATH  check that PATH holds the reference checkpoint
 * Exit status 0 means pass. */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE /* setgroups */

#include "engine/checkpoint.h"
#include "engine/output_files.h"

#include <dirent.h>
#include <errno.h>
#include <grp.h>
#include <hdf5.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static int failures;
static char tmpdir[512];

/* HDF5 objects open in any file: files, groups, datasets, attributes. (Transient
 * dataspaces and datatypes are not counted; HDF5 1.10 offers no public count of them.) */
static long open_ids(void) { return (long)H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL); }

static void fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("FAIL: ");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    failures++;
}

static void check(int ok, const char *what) {
    if (!ok) fail("%s", what);
}

/* An error case passes when the call failed, err names every given word, err is one
 * line, and no HDF5 object was left open. */
static void check_err(const char *what, int failed, const char *err, const char *w1,
                      const char *w2) {
    if (!failed) {
        fail("%s: call succeeded, expected an error", what);
        return;
    }
    const char *words[2] = {w1, w2};
    for (int i = 0; i < 2; i++)
        if (words[i] && !strstr(err, words[i]))
            fail("%s: message lacks \"%s\": %s", what, words[i], err);
    if (strchr(err, '\n')) fail("%s: message is not one line: %s", what, err);
    long n = open_ids();
    if (n != 0) fail("%s: %ld HDF5 identifiers left open", what, n);
    printf("ok   %-28s %s\n", what, err);
}

static void path_in_tmp(char *buf, size_t n, const char *name) {
    snprintf(buf, n, "%s/%s", tmpdir, name);
}

/* Random float bit patterns (denormals, -0, huge values) but never NaN or Inf. */
static void fill_bits(float *x, size_t n, uint32_t seed) {
    uint32_t s = seed * 2654435761u + 1u;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        uint32_t b = s;
        if (((b >> 23) & 0xffu) == 0xffu) b &= ~(1u << 30); /* exponent all ones would be NaN/Inf */
        memcpy(&x[i], &b, sizeof b);
    }
}

/* Copies rows [r0, r0+nr) and columns [c0, c0+nc) of a rows x cols matrix, packed. */
static void sub_block(const float *m, long cols, long r0, long nr, long c0, long nc, float *out) {
    for (long r = 0; r < nr; r++)
        memcpy(out + r * nc, m + (r0 + r) * cols + c0, (size_t)nc * sizeof *m);
}

static int count_temp_files(void) {
    DIR *d = opendir(tmpdir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d))) n += strstr(e->d_name, ".tmp.") != NULL;
    if (d) closedir(d);
    return n;
}

static void remove_tree(const char *dir) {
    DIR *d = opendir(dir);
    struct dirent *e;
    char p[1024];
    while (d && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        struct stat st;
        if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode))
            remove_tree(p);
        else
            unlink(p);
    }
    if (d) closedir(d);
    rmdir(dir);
}

/* ------------------------------------------------------------- round trip */

enum { N_LN = 7, WTE_R = 5, WTE_C = 3, ATT_R = 3, ATT_C = 9 };

/* wte [vocab_size, d_model] as the attributes say (ckpt_open checks them against it) */
static const ckpt_meta test_meta = {
    .step = 7, .n_layer = 2, .n_head = 3, .d_model = WTE_C, .n_ctx = 11, .vocab_size = WTE_R};

typedef struct {
    float ln[N_LN], wte[WTE_R * WTE_C], att[ATT_R * ATT_C];
} tensors;

static const char *const groups[3] = {"model", "optim/m", "optim/v"};

/* Writes the three tensors of one group; c_attn goes in two column slabs so that the
 * first call creates the dataset and the second reuses it. */
static int write_group(ckpt_file *f, const char *g, const tensors *t, char *err, size_t n) {
    long ln_shape[1] = {N_LN}, wte_shape[2] = {WTE_R, WTE_C}, att_shape[2] = {ATT_R, ATT_C};
    float left[ATT_R * 4], right[ATT_R * 5];
    sub_block(t->att, ATT_C, 0, ATT_R, 0, 4, left);
    sub_block(t->att, ATT_C, 0, ATT_R, 4, 5, right);
    long s0[2] = {0, 0}, c0[2] = {ATT_R, 4}, s1[2] = {0, 4}, c1[2] = {ATT_R, 5};
    if (ckpt_write(f, g, "ln_f.weight", 1, ln_shape, t->ln, err, n) < 0 ||
        ckpt_write(f, g, "wte", 2, wte_shape, t->wte, err, n) < 0 ||
        ckpt_write_slab(f, g, "h.0.attn.c_attn.weight", 2, att_shape, s0, c0, left, err, n) < 0 ||
        ckpt_write_slab(f, g, "h.0.attn.c_attn.weight", 2, att_shape, s1, c1, right, err, n) < 0)
        return -1;
    return 0;
}

/* with_optim: 0 model only, 1 optimizer state with t = 5 (two updates of its 7 steps skipped), 2 the state without t,
 * 3 the state with t = -5 */
static int write_roundtrip_file(const char *path, const tensors *t, int with_optim) {
    char err[512];
    ckpt_file *f = ckpt_create(path, &test_meta, err, sizeof err);
    if (!f) {
        fail("ckpt_create %s", err);
        return -1;
    }
    for (int g = 0; g < (with_optim ? 3 : 1); g++)
        if (write_group(f, groups[g], &t[g], err, sizeof err) < 0) {
            fail("write %s", err);
            ckpt_abort(f);
            return -1;
        }
    if ((with_optim == 1 || with_optim == 3) &&
        ckpt_set_optim_t(f, with_optim == 1 ? 5 : -5, err, sizeof err) < 0) {
        fail("ckpt_set_optim_t %s", err);
        ckpt_abort(f);
        return -1;
    }
    if (ckpt_commit(f, err, sizeof err) < 0) {
        fail("ckpt_commit %s", err);
        return -1;
    }
    return 0;
}

static void read_back_group(ckpt_file *f, const char *g, const tensors *t) {
    char err[512], what[128];
    long ln_shape[1] = {N_LN}, wte_shape[2] = {WTE_R, WTE_C}, att_shape[2] = {ATT_R, ATT_C};
    tensors got;
    memset(&got, 0, sizeof got);
    snprintf(what, sizeof what, "%s: full reads are bit-exact", g);
    int rc = ckpt_read(f, g, "ln_f.weight", 1, ln_shape, NULL, NULL, got.ln, err, sizeof err);
    rc |= ckpt_read(f, g, "wte", 2, wte_shape, NULL, NULL, got.wte, err, sizeof err);
    rc |= ckpt_read(f, g, "h.0.attn.c_attn.weight", 2, att_shape, NULL, NULL, got.att, err,
                    sizeof err);
    if (rc) fail("%s: %s", what, err);
    check(!memcmp(&got, t, sizeof got), what);

    /* Row slice, column slice, inner block, 1-D slice: what TP/PP shards ask for. */
    float buf[64], want[64];
    long rs[2] = {1, 0}, rc2[2] = {3, WTE_C};
    sub_block(t->wte, WTE_C, 1, 3, 0, WTE_C, want);
    snprintf(what, sizeof what, "%s: row slice of wte", g);
    check(ckpt_read(f, g, "wte", 2, wte_shape, rs, rc2, buf, err, sizeof err) == 0 &&
              !memcmp(buf, want, 3 * WTE_C * sizeof(float)),
          what);
    long cs[2] = {0, 2}, cc[2] = {ATT_R, 5};
    sub_block(t->att, ATT_C, 0, ATT_R, 2, 5, want);
    snprintf(what, sizeof what, "%s: column slice of c_attn", g);
    check(ckpt_read(f, g, "h.0.attn.c_attn.weight", 2, att_shape, cs, cc, buf, err, sizeof err) ==
                  0 &&
              !memcmp(buf, want, ATT_R * 5 * sizeof(float)),
          what);
    long bs[2] = {1, 3}, bc[2] = {2, 4};
    sub_block(t->att, ATT_C, 1, 2, 3, 4, want);
    snprintf(what, sizeof what, "%s: inner block of c_attn", g);
    check(ckpt_read(f, g, "h.0.attn.c_attn.weight", 2, att_shape, bs, bc, buf, err, sizeof err) ==
                  0 &&
              !memcmp(buf, want, 8 * sizeof(float)),
          what);
    long ls[1] = {3}, lc[1] = {4};
    snprintf(what, sizeof what, "%s: 1-D slice", g);
    check(ckpt_read(f, g, "ln_f.weight", 1, ln_shape, ls, lc, buf, err, sizeof err) == 0 &&
              !memcmp(buf, t->ln + 3, 4 * sizeof(float)),
          what);
}

static void test_roundtrip(void) {
    char path[1024], err[512];
    tensors t[3];
    for (int g = 0; g < 3; g++) {
        fill_bits(t[g].ln, N_LN, 10u * (uint32_t)g + 1u);
        fill_bits(t[g].wte, WTE_R * WTE_C, 10u * (uint32_t)g + 2u);
        fill_bits(t[g].att, ATT_R * ATT_C, 10u * (uint32_t)g + 3u);
    }
    t[0].ln[0] = -0.0f;
    t[0].ln[1] = 1e-45f; /* smallest denormal */
    path_in_tmp(path, sizeof path, "roundtrip.h5");
    if (write_roundtrip_file(path, t, 1) < 0) return;
    check(count_temp_files() == 0, "no temporary file after commit");

    ckpt_meta m;
    int has_optim = -1;
    long optim_t = -1;
    ckpt_file *f = ckpt_open(path, &m, &has_optim, &optim_t, err, sizeof err);
    if (!f) {
        fail("ckpt_open %s", err);
        return;
    }
    check(!memcmp(&m, &test_meta, sizeof m), "meta round trip");
    check(has_optim == 1 && optim_t == 5, "optim t round trip");
    for (int g = 0; g < 3; g++) read_back_group(f, groups[g], &t[g]);

    long wte_shape[2] = {WTE_R, WTE_C}, s[2] = {4, 0}, c[2] = {2, WTE_C};
    float buf[64];
    char err2[512];
    int rc1 = ckpt_read(f, "model", "wte", 2, wte_shape, s, c, buf, err, sizeof err);
    int rc2 = ckpt_write(f, "model", "wte", 2, wte_shape, buf, err2, sizeof err2);
    check(open_ids() == 1, "only the file is open");
    ckpt_close(f);
    check(open_ids() == 0, "ckpt_close closes everything");
    check_err("slab outside the shape", rc1 < 0, err, "outside", "/model/wte");
    check_err("write to a file opened for reading", rc2 < 0, err2, "opened for reading", NULL);

    /* Without optimizer state. */
    path_in_tmp(path, sizeof path, "model_only.h5");
    if (write_roundtrip_file(path, t, 0) < 0) return;
    f = ckpt_open(path, &m, &has_optim, &optim_t, err, sizeof err);
    check(f && has_optim == 0, "has_optim is 0 without /optim");
    if (f) {
        read_back_group(f, "model", &t[0]);
        rc1 = ckpt_read(f, "optim/m", "wte", 2, wte_shape, NULL, NULL, buf, err, sizeof err);
        ckpt_close(f);
        check_err("missing optimizer group", rc1 < 0, err, "missing dataset /optim/m/wte",
                  "model_only.h5");
    }

    /* Optimizer state that cannot be resumed: refused at open, not dropped in silence. */
    path_in_tmp(path, sizeof path, "optim_no_t.h5");
    if (write_roundtrip_file(path, t, 2) < 0) return;
    f = ckpt_open(path, &m, &has_optim, &optim_t, err, sizeof err);
    check_err("/optim without t", !f, err, "/optim has no attribute t", "optim_no_t.h5");
    ckpt_close(f);
    path_in_tmp(path, sizeof path, "optim_neg_t.h5");
    if (write_roundtrip_file(path, t, 3) < 0) return;
    f = ckpt_open(path, &m, &has_optim, &optim_t, err, sizeof err);
    check_err("/optim t < 0", !f, err, "/optim attribute t = -5 is negative", "optim_neg_t.h5");
    ckpt_close(f);
}

/* ---------------------------------------------------------- atomic replace */

static int commit_one(const char *path, long step, float value) {
    char err[512];
    ckpt_meta m = test_meta;
    m.step = step;
    long shape[1] = {4};
    float x[4] = {value, value, value, value};
    ckpt_file *f = ckpt_create(path, &m, err, sizeof err);
    if (!f || ckpt_write(f, "model", "x", 1, shape, x, err, sizeof err) < 0 ||
        ckpt_commit(f, err, sizeof err) < 0) {
        fail("commit_one: %s", err);
        return -1;
    }
    return 0;
}

/* 1 when path holds step and x == value. */
static int holds(const char *path, long step, float value) {
    char err[512];
    ckpt_meta m;
    long shape[1] = {4};
    float x[4];
    ckpt_file *f = ckpt_open(path, &m, NULL, NULL, err, sizeof err);
    if (!f) {
        fail("holds: %s", err);
        return 0;
    }
    int ok = ckpt_read(f, "model", "x", 1, shape, NULL, NULL, x, err, sizeof err) == 0 &&
             m.step == step && x[0] == value && x[3] == value;
    ckpt_close(f);
    return ok;
}

static void test_atomic_replace(void) {
    char path[1024], err[512];
    path_in_tmp(path, sizeof path, "atomic.h5");
    if (commit_one(path, 1, 1.0f) < 0) return;

    ckpt_meta m = test_meta;
    m.step = 2;
    long shape[1] = {4};
    float x[4] = {2, 2, 2, 2};
    ckpt_file *f = ckpt_create(path, &m, err, sizeof err);
    if (!f || ckpt_write(f, "model", "x", 1, shape, x, err, sizeof err) < 0) {
        fail("atomic: %s", err);
        ckpt_abort(f);
        return;
    }
    check(count_temp_files() == 1, "a temporary file exists while writing");
    check(holds(path, 1, 1.0f), "old checkpoint readable until commit");
    if (ckpt_commit(f, err, sizeof err) < 0) fail("atomic commit: %s", err);
    check(holds(path, 2, 2.0f), "commit replaced the old checkpoint");
    check(count_temp_files() == 0, "no temporary file after replacing commit");

    m.step = 3;
    x[0] = 3;
    f = ckpt_create(path, &m, err, sizeof err);
    if (!f || ckpt_write(f, "model", "x", 1, shape, x, err, sizeof err) < 0)
        fail("atomic (abort): %s", err);
    ckpt_abort(f);
    check(holds(path, 2, 2.0f), "ckpt_abort leaves the old checkpoint untouched");
    check(count_temp_files() == 0, "ckpt_abort removes the temporary file");
    check(open_ids() == 0, "no HDF5 object open after abort");
}

/* train.keep's versions (engine/output_files.c): a version is a hard link to the
 * checkpoint; a file of another kind at a version's name (a save on a stop signal comes
 * at a step save_versions_check did not look at) is left as it is and not kept */
static void test_keep_version(void) {
    char path[1024], name[1024];
    path_in_tmp(path, sizeof path, "kv.h5");
    path_in_tmp(name, sizeof name, "kv.step5.h5");
    if (commit_one(path, 5, 5.0f) < 0) return;
    FILE *fp = fopen(name, "w");
    if (fp) fputs("my notes\n", fp), fclose(fp);
    long kept[SAVE_KEPT_FOUND + 3] = {0};
    int n_kept = 0;
    save_keep_version(path, 5, 2, kept, &n_kept);
    char text[32] = "";
    fp = fopen(name, "r");
    if (fp) (void)!fgets(text, sizeof text, fp), fclose(fp);
    check(n_kept == 0 && strcmp(text, "my notes\n") == 0,
          "keep: a text file at the version's name was replaced");
    remove(name);
    save_keep_version(path, 5, 2, kept, &n_kept);
    check(n_kept == 1 && kept[0] == 5 && holds(name, 5, 5.0f), "keep: the version was not kept");
    /* a second save of the step (a resume that repeats it) replaces its own version */
    save_keep_version(path, 5, 2, kept, &n_kept);
    check(n_kept == 2 && holds(name, 5, 5.0f), "keep: the version of a repeated step");
}

/* ------------------------------------------------------------ error cases */

/* A file built with the HDF5 C API, bad in one chosen way. */
typedef struct {
    const char *format; /* NULL: no format attribute */
    int fixed_format;   /* fixed-length string rather than variable-length */
    long version;
    const char *omit; /* integer attribute to leave out, or NULL */
    hid_t int_type;   /* file type of the integer attributes */
    hid_t dset_type;  /* > 0: add /model/x [2,3] of this type */
    double fill;      /* every element of /model/x */
} handmade;

static handmade good_handmade(void) {
    handmade h = {.format = "gpt-ckpt",
                  .version = 1,
                  .int_type = H5T_STD_I64LE,
                  .dset_type = H5T_IEEE_F32LE,
                  .fill = 0.5};
    return h;
}

static void put_attr(hid_t file, const char *name, hid_t type, hid_t mem, const void *v) {
    hid_t space = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(file, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
    if (a < 0 || H5Awrite(a, mem, v) < 0) fail("handmade: cannot write attribute %s", name);
    H5Aclose(a);
    H5Sclose(space);
}

static void write_handmade(const char *path, const handmade *h) {
    hid_t file = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (h->format) {
        hid_t st = H5Tcopy(H5T_C_S1);
        if (h->fixed_format) {
            H5Tset_size(st, strlen(h->format));
            H5Tset_strpad(st, H5T_STR_NULLPAD);
            put_attr(file, "format", st, st, h->format);
        } else {
            H5Tset_size(st, H5T_VARIABLE);
            put_attr(file, "format", st, st, &h->format);
        }
        H5Tclose(st);
    }
    const char *names[7] = {"version", "step",  "n_layer",   "n_head",
                            "d_model", "n_ctx", "vocab_size"};
    long long values[7] = {h->version, 5, 2, 3, 9, 11, 13};
    for (int i = 0; i < 7; i++)
        if (!h->omit || strcmp(h->omit, names[i]) != 0)
            put_attr(file, names[i], h->int_type, H5T_NATIVE_LLONG, &values[i]);
    if (h->dset_type > 0) {
        hsize_t dims[2] = {2, 3};
        double x[6];
        for (int i = 0; i < 6; i++) x[i] = h->fill;
        hid_t g = H5Gcreate2(file, "model", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        hid_t space = H5Screate_simple(2, dims, NULL);
        hid_t d = H5Dcreate2(g, "x", h->dset_type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        if (d < 0 || H5Dwrite(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, x) < 0)
            fail("handmade: cannot write /model/x");
        H5Dclose(d);
        H5Sclose(space);
        H5Gclose(g);
    }
    if (H5Fclose(file) < 0) fail("handmade: cannot close %s", path);
}

/* Opens a hand-made file; returns 0 on success, -1 with err set. */
static int open_handmade(const char *name, const handmade *h, ckpt_meta *m, char *err, size_t n) {
    char path[1024];
    path_in_tmp(path, sizeof path, name);
    write_handmade(path, h);
    ckpt_file *f = ckpt_open(path, m, NULL, NULL, err, n);
    ckpt_close(f);
    return f ? 0 : -1;
}

/* Reads /model/x [2,3] of a hand-made file; returns 0 on success, -1 with err set. */
static int read_handmade_x(const char *name, const handmade *h, char *err, size_t n) {
    char path[1024];
    long shape[2] = {2, 3};
    float x[6];
    path_in_tmp(path, sizeof path, name);
    write_handmade(path, h);
    ckpt_file *f = ckpt_open(path, NULL, NULL, NULL, err, n);
    if (!f) return -1;
    int rc = ckpt_read(f, "model", "x", 2, shape, NULL, NULL, x, err, n);
    ckpt_close(f);
    return rc;
}

static void copy_prefix(const char *src, const char *dst, size_t n) {
    char buf[4096];
    FILE *in = fopen(src, "rb"), *out = fopen(dst, "wb");
    size_t got = in ? fread(buf, 1, n < sizeof buf ? n : sizeof buf, in) : 0;
    if (!out || fwrite(buf, 1, got, out) != got || got == 0)
        fail("cannot copy %zu bytes of %s", n, src);
    if (in) fclose(in);
    if (out) fclose(out);
}

static void test_open_errors(void) {
    char path[1024], err[512];
    ckpt_meta m;
    path_in_tmp(path, sizeof path, "missing.h5");
    check_err("missing file", ckpt_open(path, &m, NULL, NULL, err, sizeof err) == NULL, err,
              "missing.h5", "does not exist");

    path_in_tmp(path, sizeof path, "garbage.h5");
    FILE *fp = fopen(path, "wb");
    for (int i = 0; fp && i < 100; i++) fputs("this is not an HDF5 file\n", fp);
    if (fp) fclose(fp);
    check_err("non-HDF5 file", ckpt_open(path, &m, NULL, NULL, err, sizeof err) == NULL, err,
              "garbage.h5", "not an HDF5 file");

    /* A copy cut short: the signature is fine, so only H5Fopen finds the damage (and
     * would print HDF5's error stack if it were not switched off). */
    char src[1024];
    path_in_tmp(src, sizeof src, "roundtrip.h5");
    path_in_tmp(path, sizeof path, "truncated.h5");
    copy_prefix(src, path, 1200);
    check_err("truncated HDF5 file", ckpt_open(path, &m, NULL, NULL, err, sizeof err) == NULL, err,
              "truncated.h5", "damaged");

    handmade h = good_handmade();
    h.format = "gpt-other";
    check_err("wrong format", open_handmade("fmt.h5", &h, &m, err, sizeof err) < 0, err, "format",
              "gpt-other");
    h = good_handmade();
    h.format = NULL;
    check_err("no format attribute", open_handmade("nofmt.h5", &h, &m, err, sizeof err) < 0, err,
              "nofmt.h5", "missing attribute format");
    h = good_handmade();
    h.version = 2;
    check_err("version 2", open_handmade("v2.h5", &h, &m, err, sizeof err) < 0, err, "v2.h5",
              "version 2");
    h = good_handmade();
    h.omit = "n_ctx";
    check_err("missing n_ctx", open_handmade("noctx.h5", &h, &m, err, sizeof err) < 0, err,
              "noctx.h5", "missing attribute n_ctx");
    h = good_handmade();
    h.int_type = H5T_IEEE_F64LE;
    check_err("float attribute", open_handmade("fattr.h5", &h, &m, err, sizeof err) < 0, err,
              "version", "float64");

    /* Accepted: other integer widths and a fixed-length format string. */
    h = good_handmade();
    h.int_type = H5T_STD_I32BE;
    h.fixed_format = 1;
    check(open_handmade("i32.h5", &h, &m, err, sizeof err) == 0 && m.step == 5 &&
              m.vocab_size == 13,
          "int32 attributes and fixed-length format accepted");
    h.int_type = H5T_STD_U16LE;
    check(open_handmade("u16.h5", &h, &m, err, sizeof err) == 0 && m.n_ctx == 11,
          "uint16 attributes accepted");
}

static void test_read_errors(void) {
    char path[1024], err[512];
    float buf[64];
    path_in_tmp(path, sizeof path, "roundtrip.h5");
    ckpt_file *f = ckpt_open(path, NULL, NULL, NULL, err, sizeof err);
    if (!f) {
        fail("test_read_errors: %s", err);
        return;
    }
    /* check_err counts open objects, so each case closes the file first. */
    long c[1] = {9}, wrong[2] = {5, 4}, flat[1] = {15};
    int rc = ckpt_read(f, "model", "h.3.ln_1.weight", 1, c, NULL, NULL, buf, err, sizeof err);
    ckpt_close(f);
    check_err("missing dataset", rc < 0, err, "roundtrip.h5",
              "missing dataset /model/h.3.ln_1.weight");
    f = ckpt_open(path, NULL, NULL, NULL, err, sizeof err);
    rc = ckpt_read(f, "model", "wte", 2, wrong, NULL, NULL, buf, err, sizeof err);
    ckpt_close(f);
    check_err("wrong shape", rc < 0, err, "shape [5,3]", "expected [5,4]");
    f = ckpt_open(path, NULL, NULL, NULL, err, sizeof err);
    rc = ckpt_read(f, "model", "wte", 1, flat, NULL, NULL, buf, err, sizeof err);
    ckpt_close(f);
    check_err("wrong ndim", rc < 0, err, "[5,3]", "expected [15]");

    handmade h = good_handmade();
    h.dset_type = H5T_IEEE_F64LE;
    check_err("float64 dataset", read_handmade_x("f64.h5", &h, err, sizeof err) < 0, err,
              "/model/x", "float64");
    h.dset_type = H5T_STD_I32LE;
    check_err("int32 dataset", read_handmade_x("i32d.h5", &h, err, sizeof err) < 0, err, "/model/x",
              "int32");
    h.dset_type = H5T_IEEE_F32LE;
    h.fill = NAN;
    check_err("NaN value", read_handmade_x("nan.h5", &h, err, sizeof err) < 0, err,
              "/model/x at [0, 0]", "non-finite");
    /* a rank's slab names the value by its place in the whole dataset */
    char nan_path[1024];
    long whole[2] = {2, 3}, start[2] = {1, 1}, count[2] = {1, 2};
    float part[2];
    path_in_tmp(nan_path, sizeof nan_path, "nan.h5");
    f = ckpt_open(nan_path, NULL, NULL, NULL, err, sizeof err);
    rc = f ? ckpt_read(f, "model", "x", 2, whole, start, count, part, err, sizeof err) : 0;
    ckpt_close(f);
    check_err("NaN in a slab", rc < 0, err, "/model/x at [1, 1]", "non-finite");
    h.fill = 0.25;
    check(read_handmade_x("fine.h5", &h, err, sizeof err) == 0, "hand-made float32 file reads");
}

/* Root may write anywhere (CI runs as root): the non-writable directory is checked by a
 * child that has become nobody, in a directory of its own under /tmp that nobody may pass
 * (TMPDIR may be root's own). Where root cannot become nobody (no CAP_SETUID), said. */
static void create_as_nobody(void) {
    char dir[] = "/tmp/gptc_ckpt_nobody_XXXXXX", ro[64], path[96], err[512];
    if (!mkdtemp(dir)) {
        fail("create in non-writable directory: mkdtemp: %s", strerror(errno));
        return;
    }
    snprintf(ro, sizeof ro, "%s/readonly", dir);
    snprintf(path, sizeof path, "%s/x.h5", ro);
    chmod(dir, 0711);
    mkdir(ro, 0555);
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
        failures = 0;
        if (setgroups(0, NULL) != 0 || setgid(65534) != 0 || setuid(65534) != 0)
            _exit(77);
        check_err("create in non-writable directory (as nobody)",
                  ckpt_create(path, &test_meta, err, sizeof err) == NULL, err, "readonly",
                  "not writable");
        fflush(stdout);
        _exit(failures ? 1 : 0);
    }
    int status = 0;
    int done = child > 0 && waitpid(child, &status, 0) == child && WIFEXITED(status);
    if (done && WEXITSTATUS(status) == 77)
        printf("skip create in non-writable directory: root cannot become nobody here\n");
    else if (!done || WEXITSTATUS(status) != 0)
        fail("create in non-writable directory: the check as nobody failed (status %d)", status);
    rmdir(ro);
    rmdir(dir);
}

static void test_create_errors(void) {
    char path[1024], err[512];
    path_in_tmp(path, sizeof path, "nodir/x.h5");
    check_err("create in missing directory", ckpt_create(path, &test_meta, err, sizeof err) == NULL,
              err, "nodir", "does not exist");
    path_in_tmp(path, sizeof path, "garbage.h5/x.h5");
    check_err("create under a file", ckpt_create(path, &test_meta, err, sizeof err) == NULL, err,
              "garbage.h5", "not a directory");

    if (geteuid() != 0) {
        char ro[1024];
        path_in_tmp(ro, sizeof ro, "readonly");
        mkdir(ro, 0555);
        chmod(ro, 0555);
        path_in_tmp(path, sizeof path, "readonly/x.h5");
        check_err("create in non-writable directory",
                  ckpt_create(path, &test_meta, err, sizeof err) == NULL, err, "readonly",
                  "not writable");
        chmod(ro, 0755);
    } else {
        create_as_nobody();
    }

    path_in_tmp(path, sizeof path, "reshape.h5");
    ckpt_file *g = ckpt_create(path, &test_meta, err, sizeof err);
    long four[1] = {4}, five[1] = {5}, at[1] = {0}, one[1] = {1};
    float v[4] = {1, 2, 3, 4};
    int rc1 = g ? ckpt_write(g, "model", "x", 1, four, v, err, sizeof err) : -1;
    int rc2 = rc1 == 0 ? ckpt_write_slab(g, "model", "x", 1, five, at, one, v, err, sizeof err) : 0;
    ckpt_abort(g);
    check_err("slab of a different shape", rc1 == 0 && rc2 < 0, err, "/model/x",
              "shape [4], expected [5]");

    path_in_tmp(path, sizeof path, "nanwrite.h5");
    ckpt_file *f = ckpt_create(path, &test_meta, err, sizeof err);
    long shape[1] = {3};
    float x[3] = {1.0f, INFINITY, 2.0f};
    int rc = f ? ckpt_write(f, "model", "y", 1, shape, x, err, sizeof err) : 0;
    ckpt_abort(f);
    check_err("write of a non-finite value", rc < 0, err, "/model/y at [1]", "non-finite");
}

/* ----------------------------------------------- the cross-language reference */

/* Shared with tests/test_checkpoint_h5py.py: names, shapes and values that both sides
 * compute exactly (small integers / 64). */
typedef struct {
    const char *name;
    int ndim;
    long shape[2];
} ref_tensor;

static const ref_tensor ref_tensors[4] = {
    {"wte", 2, {5, 3}},
    {"wpe", 2, {4, 3}},
    {"h.0.ln_1.weight", 1, {3, 0}},
    {"h.0.attn.c_attn.weight", 2, {3, 9}},
};
static const ckpt_meta ref_meta = {
    .step = 42, .n_layer = 1, .n_head = 3, .d_model = 3, .n_ctx = 4, .vocab_size = 5};
static const long ref_t = 42;

/* group 0, 1, 2 = model, optim/m, optim/v; k = tensor index. */
static float ref_value(int group, int k, long i) {
    return (float)((i * 37 + (k + 10 * group) * 101) % 257 - 128) / 64.0f;
}

static long ref_count(const ref_tensor *t) {
    return t->ndim == 1 ? t->shape[0] : t->shape[0] * t->shape[1];
}

static int ref_write(const char *path) {
    char err[512];
    float buf[64];
    ckpt_file *f = ckpt_create(path, &ref_meta, err, sizeof err);
    for (int g = 0; f && g < 3; g++)
        for (int k = 0; k < 4; k++) {
            for (long i = 0; i < ref_count(&ref_tensors[k]); i++) buf[i] = ref_value(g, k, i);
            if (ckpt_write(f, groups[g], ref_tensors[k].name, ref_tensors[k].ndim,
                           ref_tensors[k].shape, buf, err, sizeof err) < 0) {
                ckpt_abort(f);
                f = NULL;
            }
        }
    if (!f || ckpt_set_optim_t(f, ref_t, err, sizeof err) < 0 ||
        ckpt_commit(f, err, sizeof err) < 0) {
        printf("error: %s\n", err);
        return 1;
    }
    printf("wrote %s\n", path);
    return 0;
}

static int ref_check(const char *path) {
    char err[512];
    float buf[64];
    ckpt_meta m;
    int has_optim = 0;
    long t = 0;
    ckpt_file *f = ckpt_open(path, &m, &has_optim, &t, err, sizeof err);
    if (!f) {
        printf("error: %s\n", err);
        return 1;
    }
    check(!memcmp(&m, &ref_meta, sizeof m), "reference meta");
    check(has_optim && t == ref_t, "reference optim t");
    for (int g = 0; g < 3; g++)
        for (int k = 0; k < 4; k++) {
            const ref_tensor *r = &ref_tensors[k];
            if (ckpt_read(f, groups[g], r->name, r->ndim, r->shape, NULL, NULL, buf, err,
                          sizeof err) < 0) {
                printf("error: %s\n", err);
                ckpt_close(f);
                return 1;
            }
            for (long i = 0; i < ref_count(r); i++)
                if (buf[i] != ref_value(g, k, i)) {
                    fail("%s/%s[%ld] = %g, expected %g", groups[g], r->name, i, (double)buf[i],
                         (double)ref_value(g, k, i));
                    break;
                }
        }
    ckpt_close(f);
    if (!failures) printf("checked %s\n", path);
    return failures != 0;
}

/* ------------------------------------------------------------------- main */

/* Runs fn with stderr sent to a file, and fails if anything was printed there
 * (HDF5's error stack must stay silent). */
static void without_stderr(void (*fn)(void), const char *what) {
    char path[1024];
    path_in_tmp(path, sizeof path, "stderr.txt");
    fflush(stderr);
    int saved = dup(2);
    FILE *cap = fopen(path, "w");
    if (saved < 0 || !cap) {
        fail("cannot capture stderr");
        fn();
        return;
    }
    dup2(fileno(cap), 2);
    fn();
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    fclose(cap);
    struct stat st;
    if (stat(path, &st) != 0 || st.st_size != 0)
        fail("%s printed to stderr (see %s)", what, path);
    else
        unlink(path);
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--write")) return ref_write(argv[2]);
    if (argc == 3 && !strcmp(argv[1], "--check")) return ref_check(argv[2]);
    if (argc != 1) {
        fprintf(stderr, "usage: %s [--write PATH | --check PATH]\n", argv[0]);
        return 2;
    }
    const char *base = getenv("TMPDIR");
    snprintf(tmpdir, sizeof tmpdir, "%s/gptc_ckpt_XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    test_roundtrip();
    test_atomic_replace();
    test_keep_version();
    without_stderr(test_open_errors, "open errors");
    without_stderr(test_read_errors, "read errors");
    without_stderr(test_create_errors, "create errors");
    if (failures) {
        printf("%d failure(s); files kept in %s\n", failures, tmpdir);
        return 1;
    }
    remove_tree(tmpdir);
    printf("all checkpoint tests passed\n");
    return 0;
}
