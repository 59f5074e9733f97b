/* HDF5 checkpoints (DESIGN section 4). See checkpoint.h for the schema and the contract.
 *
 * Converting Hugging Face GPT-2 weights: the dataset names are HF's without the
 * "transformer." prefix, except that HF's "wte.weight"/"wpe.weight" are stored as "wte"/"wpe".
 * HF GPT-2 uses Conv1D (weight [in, out], y = x @ W + b), which is our layout, so nothing
 * is transposed; lm_head.weight is tied to wte and is not stored. With h5py:
 *
 *   import h5py, numpy as np
 *   from transformers import GPT2LMHeadModel
 *   m = GPT2LMHeadModel.from_pretrained("gpt2"); c = m.config
 *   with h5py.File("gpt2.h5", "w") as f:
 *       f.attrs["format"] = "gpt-ckpt"
 *       for k, v in [("version", 1), ("step", 0), ("n_layer", c.n_layer),
 *                    ("n_head", c.n_head), ("d_model", c.n_embd),
 *                    ("n_ctx", c.n_positions), ("vocab_size", c.vocab_size)]:
 *           f.attrs[k] = np.int64(v)
 *       for k, t in m.transformer.state_dict().items():
 *           if k.endswith((".attn.bias", ".attn.masked_bias")):
 *               continue                      # causal-mask buffers of old versions
 *           k = {"wte.weight": "wte", "wpe.weight": "wpe"}.get(k, k)
 *           f["model/" + k] = t.detach().float().numpy()
 *
 * Error messages are one line, "<path>: <what>", and name the dataset or attribute; the
 * caller prefixes the config key (e.g. "train.init "). HDF5's own error stack is switched
 * off: its multi-screen traces bury the one line that matters. */
#define _POSIX_C_SOURCE 200809L

#include "engine/checkpoint.h"
#include "engine/h5_checks.h"
#include "engine/output_files.h"

#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { CKPT_VERSION = 1 };

struct ckpt_file {
    hid_t file;
    char *path;     /* the checkpoint's name, used in every message */
    char *tmp_path; /* non-NULL while writing: the file that ckpt_commit renames onto path */
    char *dir;      /* directory of path, fsynced after the rename */
};

static const char *const meta_names[6] = {"step",    "n_layer", "n_head",
                                          "d_model", "n_ctx",   "vocab_size"};

/* The i-th field of meta, in the order of meta_names. */
static long *meta_field(ckpt_meta *m, int i) {
    long *fields[6] = {&m->step, &m->n_layer, &m->n_head, &m->d_model, &m->n_ctx, &m->vocab_size};
    return fields[i];
}

static long meta_value(const ckpt_meta *m, int i) {
    ckpt_meta copy = *m;
    return *meta_field(&copy, i);
}

enum { REASON_LEN = 256 }; /* of a failed call's reason kept for a message, at most */

/* err = fmt's message and its cause: the one place a message takes one, so that each
 * names it alike. cause: why the call the message names failed ("cannot read dataset X:
 * <cause>"), kept by a caller whose closes after that call cleared HDF5's error stack;
 * NULL or "" for none. And where the HDF5 call that failed last failed at a read of the
 * file's bytes (a disk's error), the check that made it ("missing dataset", "not a group")
 * adds what the read found: it alone is the cause. */
static void vset_err(char *err, size_t errlen, const char *cause, const char *fmt,
                     va_list ap) {
    if (!err || errlen == 0) return;
    char reason[REASON_LEN];
    int unread = h5_read_failed(reason, sizeof reason);
    vsnprintf(err, errlen, fmt, ap);
    size_t len = strlen(err);
    if (cause && cause[0] && len < errlen) {
        snprintf(err + len, errlen - len, ": %s", cause);
        len = strlen(err);
    }
    if (unread && len < errlen && !strstr(err, reason))
        snprintf(err + len, errlen - len, " (a read of the file failed: %s)", reason);
}

static void set_err(char *err, size_t errlen, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vset_err(err, errlen, NULL, fmt, ap);
    va_end(ap);
}

static void set_err_cause(char *err, size_t errlen, const char *cause, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vset_err(err, errlen, cause, fmt, ap);
    va_end(ap);
}

static char *dup_str(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

void ckpt_library_init(void) { H5dont_atexit(); }

static void quiet_hdf5(void) { H5Eset_auto2(H5E_DEFAULT, NULL, NULL); }

static void free_handle(ckpt_file *f) {
    free(f->path);
    free(f->tmp_path);
    free(f->dir);
    free(f);
}

/* "a/b/c.h5" -> "a/b", "c.h5" -> ".", "/c.h5" -> "/". */
static char *dir_of(const char *path) {
    const char *slash = strrchr(path, '/');
    if (!slash) return dup_str(".");
    if (slash == path) return dup_str("/");
    size_t n = (size_t)(slash - path);
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, path, n);
        d[n] = '\0';
    }
    return d;
}

static void describe_dtype(hid_t t, char *buf, size_t n) {
    size_t bits = 8 * H5Tget_size(t);
    switch (H5Tget_class(t)) {
    case H5T_FLOAT:
        snprintf(buf, n, "float%zu", bits);
        break;
    case H5T_INTEGER:
        snprintf(buf, n, "%sint%zu", H5Tget_sign(t) == H5T_SGN_NONE ? "u" : "", bits);
        break;
    case H5T_STRING:
        snprintf(buf, n, "string");
        break;
    default:
        snprintf(buf, n, "a non-numeric type");
        break;
    }
}

static void format_dims(char *buf, size_t n, int ndim, const hsize_t *dims) {
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < ndim && used < n; i++) {
        int w =
            snprintf(buf + used, n - used, "%s%llu", i ? "," : "[", (unsigned long long)dims[i]);
        if (w < 0) return;
        used += (size_t)w;
    }
    if (used < n) snprintf(buf + used, n - used, "%s", ndim ? "]" : "[]");
}

/* "/group/name" into buf; the name must be one HDF5 link (dots are fine, slashes are not). */
static int dataset_path(const ckpt_file *f, const char *group, const char *name, char *buf,
                        size_t n, char *err, size_t errlen) {
    if (!group || !name || !*group || !*name || strchr(name, '/')) {
        set_err(err, errlen, "%s: bad dataset name '%s/%s'", f->path, group ? group : "",
                name ? name : "");
        return -1;
    }
    int w = snprintf(buf, n, "/%s/%s", group, name);
    if (w < 0 || (size_t)w >= n) {
        set_err(err, errlen, "%s: dataset name too long: %s/%s", f->path, group, name);
        return -1;
    }
    return 0;
}

/* H5Lexists fails (rather than answering 0) when an intermediate group is missing,
 * so every prefix of "/a/b/c" is checked in turn. Returns 1, 0, or -1 on error. */
static int link_exists(hid_t loc, const char *path) {
    char buf[1024];
    size_t n = strlen(path);
    if (n >= sizeof buf) return -1;
    memcpy(buf, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] != '/' && buf[i] != '\0') continue;
        char saved = buf[i];
        buf[i] = '\0';
        htri_t e = H5Lexists(loc, buf, H5P_DEFAULT);
        buf[i] = saved;
        if (e <= 0) return e < 0 ? -1 : 0;
    }
    return 1;
}

/* link_exists for a check that goes on when path is absent: a failure that was a read of
 * the file's bytes (a disk's error) is -1 with err set (taken for absent, /optim was
 * dropped and the run went on with a fresh optimizer); any other (a path through a
 * dataset) is 0, absent, for the check that comes after to name */
static int link_found(const ckpt_file *f, const char *path, char *err, size_t errlen) {
    int e = link_exists(f->file, path);
    char reason[REASON_LEN];
    if (e < 0 && h5_read_failed(reason, sizeof reason)) {
        set_err(err, errlen, "%s: cannot tell whether %s exists", f->path, path);
        return -1;
    }
    return e > 0;
}

/* ---------------------------------------------------------------- attributes */

static int write_int_attr(hid_t loc, const char *name, long value) {
    int64_t v = value;
    if (H5Aexists(loc, name) > 0 && H5Adelete(loc, name) < 0) return -1;
    hid_t space = H5Screate(H5S_SCALAR);
    hid_t attr = H5Acreate2(loc, name, H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT);
    herr_t rc = attr < 0 ? -1 : H5Awrite(attr, H5T_NATIVE_INT64, &v);
    if (attr >= 0 && H5Aclose(attr) < 0) rc = -1;
    H5Sclose(space);
    return rc < 0 ? -1 : 0;
}

/* Variable-length UTF-8, as h5py writes a Python str: h5py reads it back as a str. */
static int write_str_attr(hid_t loc, const char *name, const char *value) {
    hid_t type = H5Tcopy(H5T_C_S1);
    H5Tset_size(type, H5T_VARIABLE);
    H5Tset_cset(type, H5T_CSET_UTF8);
    hid_t space = H5Screate(H5S_SCALAR);
    hid_t attr = H5Acreate2(loc, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
    herr_t rc = attr < 0 ? -1 : H5Awrite(attr, type, &value);
    if (attr >= 0 && H5Aclose(attr) < 0) rc = -1;
    H5Sclose(space);
    H5Tclose(type);
    return rc < 0 ? -1 : 0;
}

/* Reads a one-element attribute of any integer width and signedness into *out. */
static int read_int_attr(const ckpt_file *f, hid_t loc, const char *where, const char *name,
                         long *out, char *err, size_t errlen) {
    if (H5Aexists(loc, name) <= 0) {
        set_err(err, errlen, "%s: missing attribute %s%s", f->path, where, name);
        return -1;
    }
    hid_t attr = H5Aopen(loc, name, H5P_DEFAULT);
    hid_t type = attr < 0 ? -1 : H5Aget_type(attr);
    hid_t space = attr < 0 ? -1 : H5Aget_space(attr);
    int rc = -1;
    char dt[32];
    if (type < 0 || space < 0) {
        set_err(err, errlen, "%s: cannot read attribute %s%s", f->path, where, name);
    } else if (H5Tget_class(type) != H5T_INTEGER) {
        describe_dtype(type, dt, sizeof dt);
        set_err(err, errlen, "%s: attribute %s%s is %s, expected an integer", f->path, where, name,
                dt);
    } else if (H5Sget_simple_extent_npoints(space) != 1) {
        set_err(err, errlen, "%s: attribute %s%s must hold one value", f->path, where, name);
    } else if (H5Tget_sign(type) == H5T_SGN_NONE) {
        uint64_t u = 0;
        if (H5Aread(attr, H5T_NATIVE_UINT64, &u) < 0 || u > (uint64_t)LONG_MAX)
            set_err(err, errlen, "%s: cannot read attribute %s%s as an integer", f->path, where,
                    name);
        else {
            *out = (long)u;
            rc = 0;
        }
    } else {
        int64_t v = 0;
        if (H5Aread(attr, H5T_NATIVE_INT64, &v) < 0 || v > LONG_MAX || v < LONG_MIN)
            set_err(err, errlen, "%s: cannot read attribute %s%s as an integer", f->path, where,
                    name);
        else {
            *out = (long)v;
            rc = 0;
        }
    }
    if (space >= 0) H5Sclose(space);
    if (type >= 0) H5Tclose(type);
    if (attr >= 0) H5Aclose(attr);
    return rc;
}

/* Reads a one-element string attribute, fixed- or variable-length, into out; a failed
 * read's reason into reason[rn], for set_err_cause. */
static int read_str_value(hid_t attr, hid_t type, char *out, size_t outlen, char *reason,
                          size_t rn) {
    htri_t vlen = H5Tis_variable_str(type);
    if (vlen < 0) return -1;
    /* Same charset as the file (HDF5 does not convert between ASCII and UTF-8); fixed
     * strings keep their size and padding, so they are copied as they are. */
    hid_t mem = H5Tcopy(vlen ? H5T_C_S1 : type);
    if (mem < 0) return -1;
    int rc = -1;
    if (vlen && (H5Tset_size(mem, H5T_VARIABLE) < 0 || H5Tset_cset(mem, H5Tget_cset(type)) < 0)) {
        H5Tclose(mem);
        return -1;
    }
    if (vlen) {
        char *s = NULL;
        if (H5Aread(attr, mem, &s) >= 0 && s) {
            snprintf(out, outlen, "%s", s);
            H5free_memory(s);
            rc = 0;
        }
    } else {
        size_t n = H5Tget_size(type);
        char *buf = calloc(n + 1, 1);
        if (buf && H5Aread(attr, mem, buf) >= 0) {
            size_t len = strnlen(buf, n);
            while (len > 0 && buf[len - 1] == ' ') /* Fortran-style space padding */
                len--;
            buf[len] = '\0';
            snprintf(out, outlen, "%s", buf);
            rc = 0;
        }
        free(buf);
    }
    if (rc < 0) h5_error_reason(reason, rn); /* before the close clears it */
    H5Tclose(mem);
    return rc;
}

static int read_str_attr(const ckpt_file *f, hid_t loc, const char *name, char *out, size_t outlen,
                         char *err, size_t errlen) {
    if (H5Aexists(loc, name) <= 0) {
        set_err(err, errlen, "%s: missing attribute %s (not a gpt-ckpt checkpoint)", f->path, name);
        return -1;
    }
    hid_t attr = H5Aopen(loc, name, H5P_DEFAULT);
    hid_t type = attr < 0 ? -1 : H5Aget_type(attr);
    hid_t space = attr < 0 ? -1 : H5Aget_space(attr);
    int rc = -1;
    char reason[REASON_LEN] = "";
    if (type < 0 || space < 0 || H5Tget_class(type) != H5T_STRING ||
        H5Sget_simple_extent_npoints(space) != 1)
        set_err(err, errlen, "%s: attribute %s is not a string", f->path, name);
    else if (read_str_value(attr, type, out, outlen, reason, sizeof reason) < 0)
        set_err_cause(err, errlen, reason, "%s: cannot read attribute %s", f->path, name);
    else
        rc = 0;
    if (space >= 0) H5Sclose(space);
    if (type >= 0) H5Tclose(type);
    if (attr >= 0) H5Aclose(attr);
    return rc;
}

/* ------------------------------------------------------------------ slabs */

typedef struct {
    int ndim;
    hsize_t dims[H5S_MAX_RANK], off[H5S_MAX_RANK], cnt[H5S_MAX_RANK];
    size_t n; /* elements in the slab */
} slab;

/* out = "[i, j]", the coordinates in the whole dataset of element k of the slab (row-major),
 * so that a message points at the value whatever part of it this rank holds */
static void slab_index(const slab *s, size_t k, char *out, size_t n) {
    hsize_t idx[H5S_MAX_RANK];
    for (int i = s->ndim - 1; i >= 0; i--) {
        idx[i] = s->off[i] + k % s->cnt[i];
        k /= s->cnt[i];
    }
    size_t used = (size_t)snprintf(out, n, "[");
    for (int i = 0; i < s->ndim && used < n; i++)
        used += (size_t)snprintf(out + used, n - used, "%s%llu", i ? ", " : "",
                                 (unsigned long long)idx[i]);
    if (used < n) snprintf(out + used, n - used, "]");
}

/* Checks shape/start/count and that [start, start+count) lies inside shape. */
static int make_slab(const ckpt_file *f, const char *dset, int ndim, const long *shape,
                     const long *start, const long *count, slab *s, char *err, size_t errlen) {
    if (ndim < 1 || ndim > H5S_MAX_RANK || !shape) {
        set_err(err, errlen, "%s: %s: bad number of dimensions %d", f->path, dset, ndim);
        return -1;
    }
    if ((start == NULL) != (count == NULL)) {
        set_err(err, errlen, "%s: %s: start and count must both be given or both be NULL", f->path,
                dset);
        return -1;
    }
    s->ndim = ndim;
    s->n = 1;
    for (int i = 0; i < ndim; i++) {
        long st = start ? start[i] : 0, ct = count ? count[i] : shape[i];
        if (shape[i] < 1 || st < 0 || ct < 1 || st > shape[i] - ct) {
            set_err(err, errlen,
                    "%s: %s: slab start %ld count %ld is outside dimension %d of size %ld", f->path,
                    dset, st, ct, i, shape[i]);
            return -1;
        }
        s->dims[i] = (hsize_t)shape[i];
        s->off[i] = (hsize_t)st;
        s->cnt[i] = (hsize_t)ct;
        s->n *= (size_t)ct;
    }
    return 0;
}

/* Runs H5Dread or H5Dwrite on the slab of an open dataset; a failure's reason into
 * reason[n] where reason is given, for set_err_cause. */
static int transfer_slab(hid_t dset, const slab *s, float *rbuf, const float *wbuf,
                         char *reason, size_t n) {
    hid_t fspace = H5Dget_space(dset);
    hid_t mspace = H5Screate_simple(s->ndim, s->cnt, NULL);
    herr_t rc = -1;
    if (fspace >= 0 && mspace >= 0 &&
        H5Sselect_hyperslab(fspace, H5S_SELECT_SET, s->off, NULL, s->cnt, NULL) >= 0) {
        if (rbuf)
            rc = H5Dread(dset, H5T_NATIVE_FLOAT, mspace, fspace, H5P_DEFAULT, rbuf);
        else
            rc = H5Dwrite(dset, H5T_NATIVE_FLOAT, mspace, fspace, H5P_DEFAULT, wbuf);
    }
    if (rc < 0 && reason) h5_error_reason(reason, n); /* before the closes clear it */
    if (mspace >= 0) H5Sclose(mspace);
    if (fspace >= 0) H5Sclose(fspace);
    return rc < 0 ? -1 : 0;
}

/* Checks that an open dataset is float32 of exactly the slab's full shape. */
static int check_dataset(const ckpt_file *f, hid_t dset, const char *dpath, const slab *s,
                         char *err, size_t errlen) {
    hid_t type = H5Dget_type(dset);
    hid_t space = H5Dget_space(dset);
    int rc = -1;
    char a[256], b[256];
    hsize_t found[H5S_MAX_RANK];
    int nd = space < 0 ? -1 : H5Sget_simple_extent_ndims(space);
    if (type < 0 || nd < 0) {
        set_err(err, errlen, "%s: cannot inspect dataset %s", f->path, dpath);
    } else if (H5Tget_class(type) != H5T_FLOAT || H5Tget_size(type) != 4) {
        describe_dtype(type, a, sizeof a);
        set_err(err, errlen, "%s: dataset %s is %s, expected float32", f->path, dpath, a);
    } else {
        H5Sget_simple_extent_dims(space, found, NULL);
        int same = nd == s->ndim;
        for (int i = 0; same && i < nd; i++) same = found[i] == s->dims[i];
        if (same) {
            rc = 0;
        } else {
            format_dims(a, sizeof a, s->ndim, s->dims);
            format_dims(b, sizeof b, nd, found);
            set_err(err, errlen, "%s: dataset %s has shape %s, expected %s", f->path, dpath, b, a);
        }
    }
    if (space >= 0) H5Sclose(space);
    if (type >= 0) H5Tclose(type);
    return rc;
}

/* Index of the first NaN or Inf in x[0..n), or n when all are finite. */
static size_t first_non_finite(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return i;
    return n;
}

/* ------------------------------------------------------------------ writing */

static int check_directory(const char *path, const char *dir, char *err, size_t errlen) {
    struct stat st;
    if (stat(dir, &st) != 0) {
        set_err(err, errlen, "%s: directory %s does not exist", path, dir);
        return -1;
    }
    if (!S_ISDIR(st.st_mode)) {
        set_err(err, errlen, "%s: %s is not a directory", path, dir);
        return -1;
    }
    if (access(dir, W_OK | X_OK) != 0) {
        set_err(err, errlen, "%s: directory %s is not writable", path, dir);
        return -1;
    }
    return 0;
}

static int write_root_attrs(hid_t file, const ckpt_meta *meta) {
    if (write_str_attr(file, "format", "gpt-ckpt") < 0 ||
        write_int_attr(file, "version", CKPT_VERSION) < 0)
        return -1;
    for (int i = 0; i < 6; i++)
        if (write_int_attr(file, meta_names[i], meta_value(meta, i)) < 0) return -1;
    return 0;
}

static int check_meta(const char *path, const ckpt_meta *meta, char *err, size_t errlen) {
    if (!meta) {
        set_err(err, errlen, "%s: no model shape given", path);
        return -1;
    }
    for (int i = 0; i < 6; i++) {
        long v = meta_value(meta, i);
        if (v < 0 || (i > 0 && v == 0)) {
            set_err(err, errlen, "%s: bad %s = %ld", path, meta_names[i], v);
            return -1;
        }
    }
    return 0;
}

ckpt_file *ckpt_create(const char *path, const ckpt_meta *meta, char *err, size_t errlen) {
    quiet_hdf5();
    if (!path || !*path) {
        set_err(err, errlen, "checkpoint path is empty");
        return NULL;
    }
    if (check_meta(path, meta, err, errlen) < 0) return NULL;
    ckpt_file *f = calloc(1, sizeof *f);
    if (!f) {
        set_err(err, errlen, "%s: out of memory", path);
        return NULL;
    }
    f->file = -1;
    f->path = dup_str(path);
    f->dir = dir_of(path);
    size_t n = strlen(path) + 32;
    f->tmp_path = malloc(n);
    if (!f->path || !f->dir || !f->tmp_path) {
        set_err(err, errlen, "%s: out of memory", path);
        free_handle(f);
        return NULL;
    }
    snprintf(f->tmp_path, n, "%s.tmp.%ld", path, (long)getpid());
    if (check_directory(path, f->dir, err, errlen) < 0) {
        free_handle(f);
        return NULL;
    }
    f->file = H5Fcreate(f->tmp_path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (f->file < 0) {
        /* HDF5 may have made the file before its first write failed (a full disk): an
         * empty file of this process's name, which no one else would remove */
        char cause[REASON_LEN];
        h5_error_reason(cause, sizeof cause);
        unlink(f->tmp_path);
        set_err_cause(err, errlen, cause, "%s: cannot create temporary file %s", path,
                      f->tmp_path);
        free_handle(f);
        return NULL;
    }
    hid_t model = H5Gcreate2(f->file, "model", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    int rc = model < 0 ? -1 : write_root_attrs(f->file, meta);
    if (model >= 0 && H5Gclose(model) < 0) rc = -1;
    if (rc < 0) {
        set_err(err, errlen, "%s: cannot write root attributes to %s", path, f->tmp_path);
        ckpt_abort(f);
        return NULL;
    }
    return f;
}

static int require_writing(const ckpt_file *f, char *err, size_t errlen) {
    if (!f) {
        set_err(err, errlen, "checkpoint is not open");
        return -1;
    }
    if (!f->tmp_path) {
        set_err(err, errlen, "%s: opened for reading, cannot write", f->path);
        return -1;
    }
    return 0;
}

/* Opens group (e.g. "optim/m"), creating it and any missing parents. */
static hid_t open_or_create_group(hid_t file, const char *group) {
    int e = link_exists(file, group);
    if (e < 0) return -1;
    if (e) return H5Gopen2(file, group, H5P_DEFAULT);
    hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
    if (lcpl < 0) return -1;
    hid_t g = H5Pset_create_intermediate_group(lcpl, 1) < 0
                  ? -1
                  : H5Gcreate2(file, group, lcpl, H5P_DEFAULT, H5P_DEFAULT);
    H5Pclose(lcpl);
    return g;
}

/* Opens dpath if it exists (it must then match s), else creates it with the slab's shape. */
static hid_t open_or_create_dataset(ckpt_file *f, const char *group, const char *dpath,
                                    const slab *s, char *err, size_t errlen) {
    int e = link_exists(f->file, dpath);
    if (e > 0) {
        hid_t d = H5Dopen2(f->file, dpath, H5P_DEFAULT);
        if (d < 0)
            set_err(err, errlen, "%s: %s exists and is not a dataset", f->path, dpath);
        else if (check_dataset(f, d, dpath, s, err, errlen) < 0) {
            H5Dclose(d);
            return -1;
        }
        return d;
    }
    hid_t g = e < 0 ? -1 : open_or_create_group(f->file, group);
    hid_t space = g < 0 ? -1 : H5Screate_simple(s->ndim, s->dims, NULL);
    hid_t d = space < 0 ? -1
                        : H5Dcreate2(f->file, dpath, H5T_IEEE_F32LE, space, H5P_DEFAULT,
                                     H5P_DEFAULT, H5P_DEFAULT);
    if (space >= 0) H5Sclose(space);
    if (g >= 0 && H5Gclose(g) < 0 && d >= 0) {
        H5Dclose(d);
        d = -1;
    }
    if (d < 0) set_err(err, errlen, "%s: cannot create dataset %s", f->path, dpath);
    return d;
}

int ckpt_write_slab(ckpt_file *f, const char *group, const char *name, int ndim, const long *shape,
                    const long *start, const long *count, const float *data, char *err,
                    size_t errlen) {
    char dpath[1024];
    slab s;
    if (require_writing(f, err, errlen) < 0 ||
        dataset_path(f, group, name, dpath, sizeof dpath, err, errlen) < 0 ||
        make_slab(f, dpath, ndim, shape, start, count, &s, err, errlen) < 0)
        return -1;
    /* A checkpoint holding NaN could never be loaded again; refuse it while the cause
     * is still at hand. */
    size_t bad = first_non_finite(data, s.n);
    if (bad < s.n) {
        char at[160];
        slab_index(&s, bad, at, sizeof at);
        set_err(err, errlen, "%s: refusing to write non-finite value %g in dataset %s at %s",
                f->path, (double)data[bad], dpath, at);
        return -1;
    }
    hid_t d = open_or_create_dataset(f, group, dpath, &s, err, errlen);
    if (d < 0) return -1;
    errno = 0;
    int rc = transfer_slab(d, &s, NULL, data, NULL, 0), why = errno;
    /* a small dataset's bytes wait in HDF5's sieve buffer until the close writes them: a
     * failure there, unchecked, left the tensor zeros in a checkpoint that saved "fine" */
    errno = 0;
    if (H5Dclose(d) < 0 && rc == 0) {
        rc = -1;
        why = errno;
    }
    /* errno: a full disk, which HDF5's own message does not name */
    if (rc < 0)
        set_err_cause(err, errlen, why ? strerror(why) : NULL, "%s: cannot write dataset %s",
                      f->path, dpath);
    return rc;
}

int ckpt_write(ckpt_file *f, const char *group, const char *name, int ndim, const long *shape,
               const float *data, char *err, size_t errlen) {
    return ckpt_write_slab(f, group, name, ndim, shape, NULL, NULL, data, err, errlen);
}

int ckpt_set_optim_t(ckpt_file *f, long t, char *err, size_t errlen) {
    if (require_writing(f, err, errlen) < 0) return -1;
    hid_t g = open_or_create_group(f->file, "optim");
    int rc = g < 0 ? -1 : write_int_attr(g, "t", t);
    if (g >= 0 && H5Gclose(g) < 0) rc = -1;
    if (rc < 0) set_err(err, errlen, "%s: cannot write attribute /optim t", f->path);
    return rc;
}

int ckpt_commit(ckpt_file *f, char *err, size_t errlen) {
    if (require_writing(f, err, errlen) < 0) {
        ckpt_close(f);
        return -1;
    }
    /* errno of the first failing call: why the write failed (a full disk), where HDF5
     * says not */
    int why = 0;
    errno = 0;
    int failed = H5Fflush(f->file, H5F_SCOPE_GLOBAL) < 0;
    if (failed) why = errno;
    errno = 0;
    if (H5Fclose(f->file) < 0) {
        if (!failed) why = errno;
        failed = 1;
    }
    f->file = -1;
    if (failed) {
        set_err_cause(err, errlen, why ? strerror(why) : NULL,
                      "%s: cannot flush and close temporary file %s", f->path, f->tmp_path);
        ckpt_abort(f);
        return -1;
    }
    char what[1200]; /* two paths of up to 511 characters and a cause */
    if (output_replace(f->tmp_path, f->path, what, sizeof what) != 0) {
        set_err(err, errlen, "%s: %s", f->path, what);
        ckpt_abort(f); /* the temporary file, if the rename did not take it */
        return -1;
    }
    free_handle(f);
    return 0;
}

void ckpt_abort(ckpt_file *f) {
    if (!f) return;
    if (f->file >= 0) H5Fclose(f->file);
    if (f->tmp_path) unlink(f->tmp_path);
    free_handle(f);
}

/* ------------------------------------------------------------------ reading */

/* Fills meta from the root attributes after checking format and version. */
static int read_root_attrs(const ckpt_file *f, ckpt_meta *meta, char *err, size_t errlen) {
    char format[64];
    long version = 0;
    if (read_str_attr(f, f->file, "format", format, sizeof format, err, errlen) < 0) return -1;
    if (strcmp(format, "gpt-ckpt") != 0) {
        set_err(err, errlen, "%s: attribute format is \"%s\", expected \"gpt-ckpt\"", f->path,
                format);
        return -1;
    }
    if (read_int_attr(f, f->file, "", "version", &version, err, errlen) < 0) return -1;
    if (version > CKPT_VERSION) {
        set_err(err, errlen, "%s: checkpoint version %ld is newer than this program (reads %d)",
                f->path, version, CKPT_VERSION);
        return -1;
    }
    if (version < 1) {
        set_err(err, errlen, "%s: invalid checkpoint version %ld", f->path, version);
        return -1;
    }
    ckpt_meta m;
    for (int i = 0; i < 6; i++)
        if (read_int_attr(f, f->file, "", meta_names[i], meta_field(&m, i), err, errlen) < 0)
            return -1;
    if (check_meta(f->path, &m, err, errlen) < 0) return -1;
    if (meta) *meta = m;
    return 0;
}

/* has_optim: /optim is a group carrying attribute t. */
static int read_optim_t(const ckpt_file *f, long step, int *has_optim, long *optim_t, char *err,
                        size_t errlen) {
    int has = 0;
    long t = 0;
    int rc = 0;
    int e = link_found(f, "/optim", err, errlen);
    if (e < 0) return -1;
    if (e > 0) {
        /* /optim without t would leave the moments unused (a fresh optimizer) without a
         * word: refused, as is a negative t */
        hid_t g = H5Gopen2(f->file, "/optim", H5P_DEFAULT);
        if (g < 0 || H5Aexists(g, "t") <= 0) {
            set_err(err, errlen,
                    "%s: /optim %s (the optimizer's step count; delete /optim "
                    "to start the optimizer afresh)",
                    f->path, g < 0 ? "is not a group" : "has no attribute t");
            rc = -1;
        } else {
            rc = read_int_attr(f, g, "/optim ", "t", &t, err, errlen);
            if (rc == 0 && t < 0) {
                set_err(err, errlen, "%s: /optim attribute t = %ld is negative", f->path, t);
                rc = -1;
            }
            /* t counts the updates taken, at most one a step (fewer where nan_policy = skip
             * left one out); more would resume the bias correction where no run was */
            if (rc == 0 && t > step) {
                set_err(err, errlen,
                        "%s: /optim attribute t = %ld is more than the "
                        "checkpoint's step %ld (the optimizer takes at most one update a step)",
                        f->path, t, step);
                rc = -1;
            }
            has = rc == 0;
        }
        if (g >= 0) H5Gclose(g);
    }
    if (has_optim) *has_optim = has;
    if (optim_t) *optim_t = t;
    return rc;
}

/* /model/wte and /model/wpe against the root attributes, at the open: a vocab_size or
 * n_ctx the tensors do not have (an attribute corrupted or edited by hand) would size the
 * model first (vocab_size 2^30: out of memory, before any tensor was read). A tensor that
 * is missing, or not 2-D, is left to the load, which says so. */
static int check_embeddings(const ckpt_file *f, const ckpt_meta *m, char *err, size_t errlen) {
    const struct {
        const char *path, *key;
        long rows;
    } e[2] = {{"/model/wte", "vocab_size", m->vocab_size}, {"/model/wpe", "n_ctx", m->n_ctx}};
    for (int i = 0; i < 2; i++) {
        int there = link_found(f, e[i].path, err, errlen);
        if (there < 0) return -1;
        if (!there) continue;
        hid_t d = H5Dopen2(f->file, e[i].path, H5P_DEFAULT);
        if (d < 0) {
            set_err(err, errlen, "%s: cannot open dataset %s", f->path, e[i].path);
            return -1;
        }
        hid_t space = H5Dget_space(d);
        hsize_t dims[H5S_MAX_RANK];
        int nd = space < 0 ? -1 : H5Sget_simple_extent_dims(space, dims, NULL);
        int bad = nd == 2 && ((long)dims[0] != e[i].rows || (long)dims[1] != m->d_model);
        if (bad)
            set_err(err, errlen, "%s: dataset %s has shape [%llu, %llu], but the file's "
                    "attributes %s = %ld and d_model = %ld make it [%ld, %ld]", f->path,
                    e[i].path, (unsigned long long)dims[0], (unsigned long long)dims[1],
                    e[i].key, e[i].rows, m->d_model, e[i].rows, m->d_model);
        if (space >= 0) H5Sclose(space);
        if (d >= 0) H5Dclose(d);
        if (bad) return -1;
    }
    return 0;
}

ckpt_file *ckpt_open(const char *path, ckpt_meta *meta, int *has_optim, long *optim_t, char *err,
                     size_t errlen) {
    ckpt_meta own; /* where the caller does not want it: read_optim_t needs its step */
    if (!meta) meta = &own;
    quiet_hdf5();
    struct stat st;
    if (!path || !*path) {
        set_err(err, errlen, "checkpoint path is empty");
        return NULL;
    }
    if (stat(path, &st) != 0) {
        if (errno == ENOENT)
            set_err(err, errlen, "%s: file does not exist", path);
        else
            set_err(err, errlen, "%s: cannot access: %s", path, strerror(errno));
        return NULL;
    }
    if (!S_ISREG(st.st_mode)) {
        set_err(err, errlen, "%s: not a regular file", path);
        return NULL;
    }
    char why[320];
    if (h5_is_hdf5(path, why, sizeof why) != 1) {
        set_err(err, errlen, "%s: %s", path, why);
        return NULL;
    }
    ckpt_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = dup_str(path))) {
        set_err(err, errlen, "%s: out of memory", path);
        free(f);
        return NULL;
    }
    f->file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f->file < 0) {
        h5_open_failed(why, sizeof why);
        set_err(err, errlen, "%s: %s", path, why);
        free_handle(f);
        return NULL;
    }
    if (read_root_attrs(f, meta, err, errlen) < 0 || check_embeddings(f, meta, err, errlen) < 0 ||
        read_optim_t(f, meta->step, has_optim, optim_t, err, errlen) < 0) {
        ckpt_close(f);
        return NULL;
    }
    return f;
}

int ckpt_read(ckpt_file *f, const char *group, const char *name, int ndim, const long *shape,
              const long *start, const long *count, float *dst, char *err, size_t errlen) {
    char dpath[1024];
    slab s;
    if (!f) {
        set_err(err, errlen, "checkpoint is not open");
        return -1;
    }
    if (dataset_path(f, group, name, dpath, sizeof dpath, err, errlen) < 0 ||
        make_slab(f, dpath, ndim, shape, start, count, &s, err, errlen) < 0)
        return -1;
    int there = link_found(f, dpath, err, errlen);
    if (there < 0) return -1;
    if (!there) {
        char gpath[160];
        snprintf(gpath, sizeof gpath, "/%s", group);
        /* /model written as a dataset holds no tensors at all (H5Oopen and H5Iget_type
         * read the same in every HDF5 since 1.8, unlike H5Oget_info) */
        hid_t o = link_exists(f->file, gpath) > 0 ? H5Oopen(f->file, gpath, H5P_DEFAULT) : -1;
        int not_group = o >= 0 && H5Iget_type(o) != H5I_GROUP;
        if (o >= 0) H5Oclose(o);
        if (not_group)
            set_err(err, errlen, "%s: %s is not a group (the tensors belong in it)", f->path,
                    gpath);
        else
            set_err(err, errlen, "%s: missing dataset %s", f->path, dpath);
        return -1;
    }
    hid_t d = H5Dopen2(f->file, dpath, H5P_DEFAULT);
    if (d < 0) {
        set_err(err, errlen, "%s: %s is not a dataset", f->path, dpath);
        return -1;
    }
    int rc = check_dataset(f, d, dpath, &s, err, errlen);
    char filter[96];
    long long unwritten, total;
    if (rc == 0 && h5_missing_filter(d, filter, sizeof filter)) {
        set_err(err, errlen,
                "%s: dataset %s was written with the HDF5 filter %s, which this "
                "HDF5 library cannot decode",
                f->path, dpath, filter);
        rc = -1;
    }
    /* a source or external file that is missing or short reads as zeros; gptc and h5py
     * conversions keep every tensor in the file itself, and only token files (which can
     * be large) have those checked (data/h5_sources.c) */
    if (rc == 0 && h5_stored_elsewhere(d)) {
        set_err(err, errlen,
                "%s: dataset %s is stored outside the file (a virtual dataset, or external "
                "files), which a checkpoint's tensors cannot be: copy it into the file",
                f->path, dpath);
        rc = -1;
    }
    /* its values would read as zeros: weights or moments lost without a word */
    if (rc == 0 && h5_unwritten(d, &unwritten, &total)) {
        if (unwritten == total)
            set_err(err, errlen,
                    "%s: dataset %s was created but never written (it would read "
                    "as zeros)",
                    f->path, dpath);
        else
            set_err(err, errlen,
                    "%s: dataset %s was written only in part (%lld of its %lld "
                    "chunks never were: they would read as zeros)",
                    f->path, dpath, unwritten, total);
        rc = -1;
    }
    char reason[REASON_LEN] = "";
    if (rc == 0 && transfer_slab(d, &s, dst, NULL, reason, sizeof reason) < 0) {
        set_err_cause(err, errlen, reason, "%s: cannot read dataset %s", f->path, dpath);
        rc = -1;
    }
    H5Dclose(d);
    if (rc < 0) return -1;
    size_t bad = first_non_finite(dst, s.n);
    if (bad < s.n) {
        char at[160];
        slab_index(&s, bad, at, sizeof at);
        set_err(err, errlen, "%s: non-finite value (%g) in dataset %s at %s", f->path,
                (double)dst[bad], dpath, at);
        return -1;
    }
    return 0;
}

typedef struct {
    const char *const *known;
    int n, unknown;
    char *first;
    size_t first_len;
} unknown_scan;

static herr_t note_unknown(hid_t group, const char *name, const H5L_info_t *info, void *arg) {
    (void)group, (void)info;
    unknown_scan *u = arg;
    for (int i = 0; i < u->n; i++)
        if (strcmp(u->known[i], name) == 0) return 0;
    if (u->unknown++ == 0) snprintf(u->first, u->first_len, "%s", name);
    return 0;
}

int ckpt_count_unknown(ckpt_file *f, const char *group, const char *const *known, int n,
                       char *first, size_t first_len, char *err, size_t errlen) {
    unknown_scan u = {known, n, 0, first, first_len};
    char gpath[160], reason[REASON_LEN];
    first[0] = 0;
    if (!f || f->file < 0) return 0;
    snprintf(gpath, sizeof gpath, "/%s", group);
    /* a failed read is an error, as at every lookup of the load (link_found): taken for
     * no group or none unknown, it left out tensors without a word */
    int there = link_found(f, gpath, err, errlen);
    if (there <= 0) return there;
    hsize_t at = 0;
    if (H5Literate_by_name(f->file, gpath, H5_INDEX_NAME, H5_ITER_INC, &at, note_unknown, &u,
                           H5P_DEFAULT) < 0 &&
        h5_read_failed(reason, sizeof reason)) {
        set_err(err, errlen, "%s: cannot list the entries of %s", f->path, gpath);
        return -1;
    }
    return u.unknown;
}

const char *ckpt_file_path(const ckpt_file *f) { return f ? f->path : ""; }

void ckpt_close(ckpt_file *f) {
    if (!f) return;
    if (f->tmp_path) { /* an unfinished write: closing without commit drops it */
        ckpt_abort(f);
        return;
    }
    if (f->file >= 0) H5Fclose(f->file);
    free_handle(f);
}
