/* Token files and the batch loader (DESIGN sections 3 and 4).
 *
 * Every HDF5 call of this file runs under one process-wide mutex: a build of HDF5
 * without its thread-safe option must never be entered by two threads at once, and the
 * loader reads the next step on a background thread while the trainer goes on. Other
 * modules that call HDF5 while a loader may be prefetching take the same mutex through
 * tokens_hdf5_lock(). */
#define _POSIX_C_SOURCE 200809L
#include "data/tokens.h"
#include "data/h5_sources.h"
#include "engine/h5_checks.h"
#include "engine/watchdog.h"

#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The largest vocab whose tokens still fit the int32 the model consumes. */
static const long long MAX_VOCAB = 2147483648LL;

static pthread_mutex_t hdf5_mutex = PTHREAD_MUTEX_INITIALIZER;

void tokens_hdf5_lock(void) { pthread_mutex_lock(&hdf5_mutex); }
void tokens_hdf5_unlock(void) { pthread_mutex_unlock(&hdf5_mutex); }

/* Automatic error printing is per thread in thread-safe HDF5 builds, so it is switched
 * off on every entry rather than once: the prefetch thread must stay quiet too. */
static void hdf5_enter(void) {
    pthread_mutex_lock(&hdf5_mutex);
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
}

static void hdf5_leave(void) { pthread_mutex_unlock(&hdf5_mutex); }

static void set_err(char *err, size_t errlen, const char *fmt, ...) {
    if (!err || errlen == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* A file as it was when opened. HDF5 reads what lies past a file's end as zeros, so a token
 * file cut short or rewritten in place during a run would train on token 0 or on another
 * file's tokens without a word: the reads compare the files they come from with these.
 * A new modification time alone (touch, a scratch purge's keep-alive, a backup tool) is
 * checked against a sample of the bytes and, once the loader's check has given this rank
 * its share of the file (tokens_watch), against a hash of all the bytes of that share: it
 * passes when they are the same. The ranks' shares cover the file, so a write anywhere
 * in it is seen by the rank whose share it is in. */
typedef struct {
    dev_t dev;
    ino_t ino;
    off_t size;
    struct timespec mtime;
    uint64_t sample;    /* sample_of the bytes */
    int part, parts;    /* this rank's share of the bytes: part of parts; 0 of 0: none */
    uint64_t part_hash; /* hash_part of that share */
} file_stamp;

enum { SAMPLE_SPANS = 64, SAMPLE_SPAN = 4096 };

/* FNV-1a of SAMPLE_SPANS spans of SAMPLE_SPAN bytes spread evenly over the size bytes of
 * fd (all of a smaller file); 0, or -1 with errno */
static int sample_of(int fd, off_t size, uint64_t *out) {
    unsigned char buf[SAMPLE_SPAN];
    uint64_t h = 14695981039346656037ull;
    off_t all = (off_t)SAMPLE_SPANS * SAMPLE_SPAN;
    for (int k = 0; k < SAMPLE_SPANS; k++) {
        off_t at = size <= all ? (off_t)k * SAMPLE_SPAN
                               : (off_t)((double)(size - SAMPLE_SPAN) * k / (SAMPLE_SPANS - 1));
        if (at >= size) break;
        ssize_t got = pread(fd, buf, sizeof buf, at);
        if (got < 0) return -1;
        for (ssize_t i = 0; i < got; i++) h = (h ^ buf[i]) * 1099511628211ull;
    }
    *out = h;
    return 0;
}

enum { PART_READ = 1 << 20 }; /* bytes a read of hash_part */

/* A hash of bytes [size*part/parts, size*(part+1)/parts) of fd, 8 at a time (FNV-1a's
 * step on words: a different word gives a different hash, whatever follows); 0, or -1
 * with errno. A share of a large file takes seconds: progress, for the watchdog. */
static int hash_part(int fd, off_t size, int part, int parts, uint64_t *out) {
    off_t at = (off_t)((double)size * part / parts), end = (off_t)((double)size * (part + 1) / parts);
    unsigned char *buf = malloc(PART_READ); /* [PART_READ] */
    if (!buf) return errno = ENOMEM, -1;
    uint64_t h = 14695981039346656037ull;
    while (at < end) {
        size_t want = end - at < PART_READ ? (size_t)(end - at) : PART_READ;
        ssize_t got = pread(fd, buf, want, at);
        if (got <= 0) {
            if (got == 0) errno = EIO; /* cut short while read: the size check says so */
            free(buf);
            return -1;
        }
        ssize_t i = 0;
        for (; i + 8 <= got; i += 8) {
            uint64_t w;
            memcpy(&w, buf + i, 8);
            h = (h ^ w) * 1099511628211ull;
        }
        for (; i < got; i++) h = (h ^ buf[i]) * 1099511628211ull;
        at += got;
        watchdog_beat();
    }
    free(buf);
    *out = h;
    return 0;
}

/* st's stamp, with the sample of fd (or of path, opened here, when fd < 0) and, when
 * parts > 0, the hash of share part; 0, or -1 */
static int stamp_of(const struct stat *st, int fd, const char *path, int part, int parts,
                    file_stamp *s) {
    *s = (file_stamp){st->st_dev, st->st_ino, st->st_size, st->st_mtim, 0, part, parts, 0};
    int own = fd < 0 ? open(path, O_RDONLY) : fd;
    int rc = own >= 0 ? sample_of(own, st->st_size, &s->sample) : -1;
    if (rc == 0 && parts > 0) rc = hash_part(own, st->st_size, part, parts, &s->part_hash);
    if (fd < 0 && own >= 0) close(own);
    return rc;
}

struct token_file {
    char *path;
    hid_t file, dset;
    long n;       /* number of tokens */
    long vocab;   /* the file's vocab_size */
    long limit;   /* every token must be below it: vocab, or the model's if smaller */
    int elem;     /* bytes a token in the file: 1, 2 or 4 */
    int fd;       /* HDF5's descriptor of the file (its sec2 driver), else -1: by path */
    file_stamp stamp; /* the file at open, by fd (a file renamed over its path is not it) */
    h5_source_files sources;  /* the files besides it that /tokens is read from */
    file_stamp *source_stamps; /* [sources.n] each at open, by its path */
    /* the stamps after open: the prefetch thread's reads check them, and take a touch
     * into them, while the loader's check gives them this rank's share */
    pthread_mutex_t stamp_mutex;
};

static void close_ids(token_file *f) {
    if (f->dset >= 0) H5Dclose(f->dset);
    if (f->file >= 0) H5Fclose(f->file);
    f->dset = f->file = -1;
}

/* HDF5's descriptor of the file when its driver is sec2 (the default), whose handle is an
 * int; -1 for any other driver (the core driver's handle is its memory image) */
static int sec2_descriptor(hid_t file) {
    hid_t fapl = H5Fget_access_plist(file);
    int sec2 = fapl >= 0 && H5Pget_driver(fapl) == H5FD_SEC2;
    if (fapl >= 0) H5Pclose(fapl);
    void *handle = NULL;
    return sec2 && H5Fget_vfd_handle(file, H5P_DEFAULT, &handle) >= 0 && handle ? *(int *)handle
                                                                             : -1;
}

/* Stamps the file (by HDF5's descriptor, else by its path) and the sources found, each
 * with share part of parts (none when parts is 0); 0, or -1 with err set */
static int stamp_files(token_file *f, int part, int parts, char *err, size_t errlen) {
    struct stat st;
    if ((f->fd >= 0 ? fstat(f->fd, &st) : stat(f->path, &st)) ||
        stamp_of(&st, f->fd, f->path, part, parts, &f->stamp)) {
        set_err(err, errlen, "data.path %s: cannot read the file: %s", f->path, strerror(errno));
        return -1;
    }
    if (f->sources.n > 0 && !f->source_stamps &&
        !(f->source_stamps = malloc(f->sources.n * sizeof *f->source_stamps))) {
        set_err(err, errlen, "data.path %s: out of memory", f->path);
        return -1;
    }
    for (size_t i = 0; i < f->sources.n; i++) {
        const char *p = f->sources.paths[i];
        if (stat(p, &st) || stamp_of(&st, -1, p, part, parts, &f->source_stamps[i])) {
            set_err(err, errlen, "data.path %s: cannot read its source file %s: %s", f->path,
                    p, strerror(errno));
            return -1;
        }
    }
    return 0;
}

/* 0 when the file stamped *was (by fd, or by path when fd < 0) is as it was, or differs by
 * its modification time alone (then *was takes the new time); a source (by path) may also
 * have been replaced by a file at least as large, as by a rename (HDF5 reads the new one,
 * or the one it opened: either is whole), and *was is then the new file's. Else -1 and
 * how[len] says what changed. */
static int unchanged(file_stamp *was, int fd, const char *path, int source, char *how,
                     size_t len) {
    struct stat st;
    file_stamp now;
    if (fd >= 0 ? fstat(fd, &st) : stat(path, &st)) {
        snprintf(how, len, "is gone");
        return -1;
    }
    int same_file = st.st_dev == was->dev && st.st_ino == was->ino;
    if (same_file && st.st_size == was->size && st.st_mtim.tv_sec == was->mtime.tv_sec &&
        st.st_mtim.tv_nsec == was->mtime.tv_nsec)
        return 0;
    if (!same_file && !source) {
        snprintf(how, len, "was replaced by another file");
        return -1;
    }
    if (!same_file && st.st_size >= was->size) {
        if (stamp_of(&st, -1, path, was->part, was->parts, &now) == 0) *was = now;
        return 0;
    }
    if (st.st_size < was->size) {
        snprintf(how, len, "was cut from %lld to %lld bytes", (long long)was->size,
                 (long long)st.st_size);
        return -1;
    }
    if (st.st_size > was->size) {
        snprintf(how, len, "grew from %lld to %lld bytes", (long long)was->size,
                 (long long)st.st_size);
        return -1;
    }
    /* the same size, a new time: touched, or rewritten in place (this rank rereads its
     * share of the file: a touch costs that once) */
    if (stamp_of(&st, fd, path, was->part, was->parts, &now) == 0 &&
        now.sample == was->sample && now.part_hash == was->part_hash) {
        was->mtime = now.mtime;
        return 0;
    }
    snprintf(how, len, "was written to in place (same size, other bytes)");
    return -1;
}

static const char *const CHANGE_ADVICE = "the tokens read may be zeros or another file's; "
                                         "write a new file and rename it over the old one (as "
                                         "gptc-data does) instead of changing it in place";

/* The token file itself, after each read (one fstat); 0, or -1 with err */
static int check_own(token_file *f, char *err, size_t errlen) {
    char how[96];
    pthread_mutex_lock(&f->stamp_mutex);
    int rc = unchanged(&f->stamp, f->fd, f->path, 0, how, sizeof how);
    pthread_mutex_unlock(&f->stamp_mutex);
    if (rc == 0) return 0;
    set_err(err, errlen, "data.path %s: the file changed during the run (it %s): %s", f->path,
            how, CHANGE_ADVICE);
    return -1;
}

int tokens_check_sources(token_file *f, char *err, size_t errlen) {
    char how[96];
    for (size_t i = 0; i < f->sources.n; i++) {
        pthread_mutex_lock(&f->stamp_mutex);
        int rc = unchanged(&f->source_stamps[i], -1, f->sources.paths[i], 1, how, sizeof how);
        pthread_mutex_unlock(&f->stamp_mutex);
        if (rc == 0) continue;
        set_err(err, errlen, "data.path %s: its source file %s changed during the run (it %s): "
                "%s", f->path, f->sources.paths[i], how, CHANGE_ADVICE);
        return -1;
    }
    return 0;
}

int tokens_watch(token_file *f, int part, int parts, char *err, size_t errlen) {
    /* the files as at open first: a share hashed from changed bytes would hide the change */
    if (check_own(f, err, errlen) || tokens_check_sources(f, err, errlen)) return -1;
    pthread_mutex_lock(&f->stamp_mutex);
    int rc = stamp_files(f, part, parts, err, errlen);
    pthread_mutex_unlock(&f->stamp_mutex);
    return rc;
}

double tokens_file_bytes(token_file *f) {
    pthread_mutex_lock(&f->stamp_mutex);
    double b = (double)f->stamp.size;
    for (size_t i = 0; i < f->sources.n; i++) b += (double)f->source_stamps[i].size;
    pthread_mutex_unlock(&f->stamp_mutex);
    return b;
}

/* After /tokens failed to open: when it is an external link, err names where it leads and
 * why that failed (a missing file said only "not a dataset"); returns 1 then, else 0 */
static int describe_external_link(token_file *f, char *err, size_t errlen) {
    char cause[256];
    h5_error_reason(cause, sizeof cause); /* before the next call clears it */
    char *tail = strstr(cause, ", temp_file_name"); /* the name again, as HDF5 tried it */
    if (tail) *tail = 0;
    H5L_info_t info;
    if (H5Lget_info(f->file, "tokens", &info, H5P_DEFAULT) < 0 || info.type != H5L_TYPE_EXTERNAL)
        return 0;
    char val[1024];
    const char *file = NULL, *obj = NULL;
    unsigned flags;
    if (info.u.val_size > sizeof val || H5Lget_val(f->file, "tokens", val, sizeof val,
                                                   H5P_DEFAULT) < 0 ||
        H5Lunpack_elink_val(val, info.u.val_size, &flags, &file, &obj) < 0)
        return 0;
    set_err(err, errlen, "data.path %s: /tokens is an external link to %s in %s, which cannot "
            "be opened%s%s", f->path, obj, file, cause[0] ? ": " : "", cause);
    return 1;
}

/* Names an HDF5 type in words for the "wrong element type" message. */
static void describe_type(hid_t type, char *buf, size_t len) {
    H5T_class_t cls = H5Tget_class(type);
    size_t bits = H5Tget_size(type) * 8;
    if (cls == H5T_INTEGER)
        snprintf(buf, len, "%s %zu-bit integers",
                 H5Tget_sign(type) == H5T_SGN_NONE ? "unsigned" : "signed", bits);
    else if (cls == H5T_FLOAT)
        snprintf(buf, len, "%zu-bit floats", bits);
    else
        snprintf(buf, len, "a non-numeric type");
}

static int check_element_type(token_file *f, char *err, size_t errlen) {
    hid_t type = H5Dget_type(f->dset);
    if (type < 0) {
        set_err(err, errlen, "data.path %s: cannot read the type of /tokens", f->path);
        return -1;
    }
    size_t size = H5Tget_size(type);
    int ok = H5Tget_class(type) == H5T_INTEGER && H5Tget_sign(type) == H5T_SGN_NONE &&
             (size == 1 || size == 2 || size == 4);
    if (!ok) {
        char what[64];
        describe_type(type, what, sizeof what);
        set_err(err, errlen,
                "data.path %s: /tokens holds %s, expected unsigned 8-, 16- or 32-bit integers",
                f->path, what);
    }
    H5Tclose(type);
    f->elem = (int)size;
    return ok ? 0 : -1;
}

static int read_length(token_file *f, char *err, size_t errlen) {
    hid_t space = H5Dget_space(f->dset);
    int ndim = space >= 0 ? H5Sget_simple_extent_ndims(space) : -1;
    hsize_t dim = 0;
    if (ndim == 1) H5Sget_simple_extent_dims(space, &dim, NULL);
    if (space >= 0) H5Sclose(space);
    if (ndim != 1) {
        set_err(err, errlen, "data.path %s: /tokens has %d dimensions, expected 1", f->path,
                ndim);
        return -1;
    }
    f->n = (long)dim;
    /* a dataset made and never written, or written in part (h5py's create_dataset with a
     * shape and no data, a writer killed part way), reads as its fill value, zeros: a run
     * would train on them without a word */
    long long unwritten, total;
    if (h5_unwritten(f->dset, &unwritten, &total)) {
        if (unwritten == total)
            set_err(err, errlen, "data.path %s: /tokens was created but never written (no "
                    "storage: every token would read as 0)", f->path);
        else
            set_err(err, errlen, "data.path %s: /tokens was written only in part (%lld of its "
                    "%lld chunks never were: their tokens would read as 0)", f->path, unwritten,
                    total);
        return -1;
    }
    return 0;
}

/* vocab_size may sit on the dataset or on the file root; the dataset's wins. */
static int read_vocab(token_file *f, long model_vocab, char *err, size_t errlen) {
    hid_t owner = -1;
    htri_t on_dset = H5Aexists(f->dset, "vocab_size"); /* < 0: a read failed */
    htri_t on_file = on_dset == 0 ? H5Aexists(f->file, "vocab_size") : 0;
    if (on_dset > 0) owner = f->dset;
    else if (on_file > 0) owner = f->file;
    if (on_dset < 0 || on_file < 0) {
        set_err(err, errlen, "data.path %s: cannot tell where its vocab_size attribute is",
                f->path);
        return -1;
    }
    if (owner < 0) {
        set_err(err, errlen, "data.path %s: no vocab_size attribute on /tokens or on the file root",
                f->path);
        return -1;
    }
    hid_t attr = H5Aopen(owner, "vocab_size", H5P_DEFAULT);
    hid_t type = attr >= 0 ? H5Aget_type(attr) : -1;
    hid_t space = attr >= 0 ? H5Aget_space(attr) : -1;
    unsigned long long u = 0; /* an unsigned 64-bit value past LLONG_MAX: read whole */
    int ok = type >= 0 && space >= 0 && H5Tget_class(type) == H5T_INTEGER &&
             H5Sget_simple_extent_npoints(space) == 1;
    int sign = ok ? H5Tget_sign(type) == H5T_SGN_2 : 0;
    long long v = 0;
    ok = ok && H5Aread(attr, sign ? H5T_NATIVE_LLONG : H5T_NATIVE_ULLONG, sign ? (void *)&v
                                                                          : (void *)&u) >= 0;
    int too_big = ok && !sign && u > (unsigned long long)MAX_VOCAB;
    if (!sign && !too_big) v = (long long)u;
    if (space >= 0) H5Sclose(space);
    if (type >= 0) H5Tclose(type);
    if (attr >= 0) H5Aclose(attr);
    if (!ok) {
        set_err(err, errlen, "data.path %s: vocab_size attribute is not a single integer",
                f->path);
        return -1;
    }
    if (too_big) {
        set_err(err, errlen, "data.path %s: vocab_size %llu is outside [1, %lld]", f->path, u,
                MAX_VOCAB);
        return -1;
    }
    if (v < 1 || v > MAX_VOCAB) {
        set_err(err, errlen, "data.path %s: vocab_size %lld is outside [1, %lld]", f->path, v,
                MAX_VOCAB);
        return -1;
    }
    /* a tokenizer's vocabulary may be larger than a model's (a small model on the bytes
     * of a GPT-2 file): what counts is every token the model reads, checked against both */
    f->vocab = (long)v;
    f->limit = model_vocab > 0 && model_vocab < f->vocab ? model_vocab : f->vocab;
    return 0;
}

/* Runs with the HDF5 mutex held; leaves f's ids closed on failure. */
static int open_locked(token_file *f, long model_vocab, char *err, size_t errlen) {
    /* a FIFO would block the open until a writer came, and HDF5 needs to seek anyway */
    struct stat st;
    if (stat(f->path, &st) == 0 && !S_ISREG(st.st_mode)) {
        set_err(err, errlen, "data.path %s: not a regular file", f->path);
        return -1;
    }
    /* fopen first so a missing or unreadable file gets the system's reason. */
    FILE *probe = fopen(f->path, "rb");
    if (!probe) {
        set_err(err, errlen, "data.path %s: cannot open: %s", f->path, strerror(errno));
        return -1;
    }
    fclose(probe);
    char why[320];
    if (h5_is_hdf5(f->path, why, sizeof why) != 1) {
        set_err(err, errlen, "data.path %s: %s", f->path, why);
        return -1;
    }
    f->file = H5Fopen(f->path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f->file < 0) {
        h5_open_failed(why, sizeof why);
        set_err(err, errlen, "data.path %s: %s", f->path, why);
        return -1;
    }
    if (H5Lexists(f->file, "tokens", H5P_DEFAULT) <= 0) {
        set_err(err, errlen, "data.path %s: no dataset /tokens", f->path);
        return -1;
    }
    f->dset = H5Dopen2(f->file, "tokens", H5P_DEFAULT);
    /* a failed read: returned before describe_external_link's calls clear HDF5's errors,
     * for tokens_open to name */
    if (f->dset < 0 && h5_read_failed(why, sizeof why)) return -1;
    if (f->dset < 0 && describe_external_link(f, err, errlen)) return -1;
    if (f->dset < 0) {
        set_err(err, errlen, "data.path %s: /tokens is not a dataset", f->path);
        return -1;
    }
    char filter[96];
    if (h5_missing_filter(f->dset, filter, sizeof filter)) {
        set_err(err, errlen, "data.path %s: /tokens was written with the HDF5 filter %s, which "
                "this HDF5 library cannot decode (write it uncompressed, or with gzip)", f->path,
                filter);
        return -1;
    }
    if (read_length(f, err, errlen) || check_element_type(f, err, errlen) ||
        h5_check_sources(f->file, f->dset, f->path, "data.path", &f->sources, err, errlen) ||
        read_vocab(f, model_vocab, err, errlen))
        return -1;
    f->fd = sec2_descriptor(f->file);
    return stamp_files(f, 0, 0, err, errlen);
}

token_file *tokens_open(const char *path, long model_vocab, char *err, size_t errlen) {
    token_file *f = calloc(1, sizeof *f);
    if (f) f->path = malloc(strlen(path) + 1);
    if (!f || !f->path) {
        set_err(err, errlen, "data.path %s: out of memory", path);
        free(f);
        return NULL;
    }
    strcpy(f->path, path);
    f->file = f->dset = f->fd = -1;
    pthread_mutex_init(&f->stamp_mutex, NULL);
    hdf5_enter();
    int rc = open_locked(f, model_vocab, err, errlen);
    /* a check that failed at its read of the file's bytes says what the read found (the
     * check's own words, "no dataset /tokens", would hide a disk's error); where a later
     * call has cleared HDF5's errors the check said it itself */
    char reason[256];
    if (rc && h5_read_failed(reason, sizeof reason))
        set_err(err, errlen, "data.path %s: cannot read the file: %s", path, reason);
    if (rc) close_ids(f);
    hdf5_leave();
    if (rc) {
        tokens_close(f);
        return NULL;
    }
    return f;
}

long tokens_count(const token_file *f) { return f->n; }
long tokens_vocab(const token_file *f) { return f->vocab; }

/* Reads [start, start+count) of /tokens into dst[count] as uint32 (HDF5 widens 8- and
 * 16-bit files); dst is int32 storage, which C lets us access as its unsigned twin. */
static int read_slab(token_file *f, long start, long count, uint32_t *dst, char *cause,
                     size_t n) {
    hsize_t off = (hsize_t)start, cnt = (hsize_t)count;
    hid_t fspace = H5Dget_space(f->dset);
    hid_t mspace = H5Screate_simple(1, &cnt, NULL);
    int ok = fspace >= 0 && mspace >= 0 &&
             H5Sselect_hyperslab(fspace, H5S_SELECT_SET, &off, NULL, &cnt, NULL) >= 0 &&
             H5Dread(f->dset, H5T_NATIVE_UINT32, mspace, fspace, H5P_DEFAULT, dst) >= 0;
    if (!ok) h5_error_reason(cause, n); /* before the closes clear it */
    if (mspace >= 0) H5Sclose(mspace);
    if (fspace >= 0) H5Sclose(fspace);
    return ok ? 0 : -1;
}

int tokens_read(token_file *f, long start, long count, int32_t *dst, char *err,
                size_t errlen) {
    if (start < 0 || count < 0 || start > f->n - count) {
        set_err(err, errlen, "data.path %s: tokens [%ld, %ld) are outside the file's %ld tokens",
                f->path, start, start + count, f->n);
        return -1;
    }
    if (count == 0) return 0;
    uint32_t *u = (uint32_t *)dst; /* [count] */
    hdf5_enter();
    char cause[256] = "";
    int rc = read_slab(f, start, count, u, cause, sizeof cause);
    hdf5_leave();
    if (rc) {
        set_err(err, errlen, "data.path %s: HDF5 read of tokens [%ld, %ld) failed%s%s", f->path,
                start, start + count, cause[0] ? ": " : "", cause);
        return -1;
    }
    /* after the read: a change from before it, or during it, is seen (the sources, a stat
     * each, once a step: tokens_check_sources) */
    if (check_own(f, err, errlen)) return -1;
    for (long i = 0; i < count; i++) {
        if (u[i] >= (uint64_t)f->limit) {
            set_err(err, errlen, "data.path %s: token %lu at position %ld is >= %s vocab_size %ld",
                    f->path, (unsigned long)u[i], start + i,
                    f->limit < f->vocab ? "the model's" : "the file's", f->limit);
            return -1;
        }
    }
    return 0;
}

void tokens_close(token_file *f) {
    if (!f) return;
    hdf5_enter();
    close_ids(f);
    hdf5_leave();
    h5_source_files_free(&f->sources);
    pthread_mutex_destroy(&f->stamp_mutex);
    free(f->source_stamps);
    free(f->path);
    free(f);
}

/* ---- window order ---- */

static uint64_t mix64(uint64_t x) { /* splitmix64 finalizer: a cheap, well-mixed hash */
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return x;
}

/* A 4-round balanced Feistel network is a bijection on [0, 2^(2*half)) for any round
 * function, so a keyed hash gives a seeded permutation with no table. */
static uint64_t feistel(uint64_t x, int half, uint64_t key) {
    uint64_t mask = (1ULL << half) - 1;
    uint64_t left = x >> half, right = x & mask;
    for (uint64_t r = 0; r < 4; r++) {
        uint64_t f = mix64(right ^ mix64(key + r * 0x9e3779b97f4a7c15ULL)) & mask;
        uint64_t next = left ^ f;
        left = right;
        right = next;
    }
    return (left << half) | right;
}

/* Cycle walking: applying the power-of-two permutation until the value lands below W
 * restricts it to a permutation of [0, W); the domain is < 4W, so few walks are needed. */
static uint64_t permute(uint64_t i, uint64_t w, int half, uint64_t seed, uint64_t epoch) {
    uint64_t key = mix64(seed ^ mix64(epoch + 0x632be59bd9b4e019ULL));
    uint64_t x = i;
    do {
        x = feistel(x, half, key);
    } while (x >= w);
    return x;
}

/* ---- the loader ---- */

typedef enum { PF_IDLE, PF_RUNNING, PF_DONE } prefetch_state;

struct batch_loader {
    token_file *file;
    int T, B, row_begin, rows;
    int shuffle;
    uint64_t seed;
    long W;
    int half;            /* Feistel half width: 2^(2*half) >= W */
    int32_t *window;     /* [T+1] scratch for synchronous reads on the caller's thread */

    /* The worker owns pf_* while state is PF_RUNNING; the caller touches them only
     * after seeing another state under mu. */
    pthread_t worker;
    int worker_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    prefetch_state state;
    int quit;
    long pf_step;
    int pf_rc;
    char pf_err[512];
    int32_t *pf_inputs;  /* [rows, T] */
    int32_t *pf_targets; /* [rows, T] */
    int32_t *pf_window;  /* [T+1] worker's scratch */
};

long loader_windows(const batch_loader *l) { return l->W; }

long loader_window(const batch_loader *l, long step, int j) {
    uint64_t g = (uint64_t)(step - 1) * (uint64_t)l->B + (uint64_t)j;
    uint64_t w = (uint64_t)l->W;
    if (!l->shuffle) return (long)(g % w);
    return (long)permute(g % w, w, l->half, l->seed, g / w);
}

/* Reads step's rows: inputs[rows, T], targets[rows, T], via window[T+1]. */
static int fill_step(batch_loader *l, long step, int32_t *inputs, int32_t *targets,
                     int32_t *window, char *err, size_t errlen) {
    int T = l->T;
    for (int r = 0; r < l->rows; r++) {
        long w = loader_window(l, step, l->row_begin + r);
        if (tokens_read(l->file, w * (long)T, T + 1, window, err, errlen)) return -1;
        memcpy(inputs + (size_t)r * T, window, (size_t)T * sizeof *window);
        memcpy(targets + (size_t)r * T, window + 1, (size_t)T * sizeof *window);
    }
    return tokens_check_sources(l->file, err, errlen);
}

static void *prefetch_main(void *arg) {
    batch_loader *l = arg;
    pthread_mutex_lock(&l->mu);
    for (;;) {
        while (l->state != PF_RUNNING && !l->quit) pthread_cond_wait(&l->cv, &l->mu);
        if (l->quit) break;
        long step = l->pf_step;
        pthread_mutex_unlock(&l->mu);
        int rc = fill_step(l, step, l->pf_inputs, l->pf_targets, l->pf_window, l->pf_err,
                           sizeof l->pf_err);
        pthread_mutex_lock(&l->mu);
        l->pf_rc = rc;
        l->state = PF_DONE;
        pthread_cond_broadcast(&l->cv);
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

static int smallest_half(long W) {
    int half = 0;
    while (half < 32 && (1ULL << (2 * half)) < (uint64_t)W) half++;
    return half;
}

batch_loader *loader_create(const char *path, int T, int B, int row_begin, int row_end,
                            long model_vocab, int shuffle, uint64_t seed, char *err,
                            size_t errlen) {
    if (T < 1 || B < 1 || row_begin < 0 || row_end <= row_begin || row_end > B) {
        set_err(err, errlen, "data.path %s: bad loader shape T=%d B=%d rows [%d, %d)", path, T,
                B, row_begin, row_end);
        return NULL;
    }
    token_file *f = tokens_open(path, model_vocab, err, errlen);
    if (!f) return NULL;
    if (f->n < (long)T + 1) {
        set_err(err, errlen, "data.path %s: %ld tokens is fewer than one window of seq_len+1 = %ld tokens",
                path, f->n, (long)T + 1);
        tokens_close(f);
        return NULL;
    }
    batch_loader *l = calloc(1, sizeof *l);
    if (!l) {
        set_err(err, errlen, "data.path %s: out of memory", path);
        tokens_close(f);
        return NULL;
    }
    l->file = f;
    l->T = T;
    l->B = B;
    l->row_begin = row_begin;
    l->rows = row_end - row_begin;
    l->shuffle = shuffle != 0;
    l->seed = seed;
    l->W = (f->n - 1) / T;
    l->half = smallest_half(l->W);
    size_t slab = (size_t)l->rows * (size_t)T;
    l->window = malloc(((size_t)T + 1) * sizeof(int32_t));
    l->pf_window = malloc(((size_t)T + 1) * sizeof(int32_t));
    l->pf_inputs = malloc(slab * sizeof(int32_t));
    l->pf_targets = malloc(slab * sizeof(int32_t));
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv, NULL);
    l->state = PF_IDLE;
    if (!l->window || !l->pf_window || !l->pf_inputs || !l->pf_targets) {
        set_err(err, errlen, "data.path %s: out of memory for %d rows of %d tokens", path,
                l->rows, T);
        loader_destroy(l);
        return NULL;
    }
    int e = pthread_create(&l->worker, NULL, prefetch_main, l);
    if (e) {
        set_err(err, errlen, "data.path %s: cannot start the prefetch thread: %s", path,
                strerror(e));
        loader_destroy(l);
        return NULL;
    }
    l->worker_started = 1;
    return l;
}

enum { CHECK_CHUNK = 1 << 20 }; /* tokens a read of the check */

/* Part part of parts of the n tokens: [*begin, *end), the parts as even as can be */
static void part_range(long n, int part, int parts, long *begin, long *end) {
    *begin = (long)((double)n * part / parts);
    *end = (long)((double)n * (part + 1) / parts);
}

double loader_check_bytes(const batch_loader *l, int parts) {
    const double trip = 65536; /* a read's round trip on a network file system, in bytes */
    if (!l || parts < 1) return 0;
    double most = ceil((double)l->file->n / parts); /* the largest part's tokens */
    double share = ceil(tokens_file_bytes(l->file) / parts);
    return most * l->file->elem + ceil(most / CHECK_CHUNK) * trip + share +
           ceil(share / PART_READ) * trip;
}

int loader_check(batch_loader *l, int part, int parts, char *err, size_t errlen) {
    long begin, end;
    part_range(l->file->n, part, parts, &begin, &end);
    long chunk = end - begin < CHECK_CHUNK ? end - begin : CHECK_CHUNK;
    int32_t *buf = chunk > 0 ? malloc((size_t)chunk * sizeof *buf) : NULL; /* [chunk] */
    if (chunk > 0 && !buf) {
        set_err(err, errlen, "data.path %s: out of memory for %ld tokens", l->file->path, chunk);
        return -1;
    }
    int rc = tokens_watch(l->file, part, parts, err, errlen);
    /* a large file takes minutes: progress, for this rank's watchdog */
    for (long s = begin; s < end && rc == 0; s += chunk) {
        watchdog_beat();
        watchdog_test_slow_read();
        rc = tokens_read(l->file, s, end - s < chunk ? end - s : chunk, buf, err, errlen);
    }
    free(buf);
    return rc ? rc : tokens_check_sources(l->file, err, errlen);
}

int loader_fingerprint(batch_loader *l, uint64_t fp[3], char *err, size_t errlen) {
    enum { SPANS = 64, SPAN = 256 };
    long n = tokens_count(l->file), len = n < SPAN ? n : SPAN;
    uint64_t h = 14695981039346656037ull; /* FNV-1a over the tokens' values */
    int32_t buf[SPAN];
    for (long k = 0; k < SPANS; k++) {
        if (tokens_read(l->file, (n - len) / (SPANS - 1) * k, len, buf, err, errlen)) return -1;
        for (long i = 0; i < len; i++) {
            h ^= (uint32_t)buf[i];
            h *= 1099511628211ull;
        }
    }
    fp[0] = (uint64_t)n, fp[1] = (uint64_t)tokens_vocab(l->file), fp[2] = h;
    return tokens_check_sources(l->file, err, errlen);
}

/* Waits out any read in flight and takes its result if it is the step asked for.
 * Returns 1 when inputs/targets were filled (rc in *rc), 0 when the caller must read. */
static int take_prefetch(batch_loader *l, long step, int32_t *inputs, int32_t *targets,
                         int *rc, char *err, size_t errlen) {
    size_t slab = (size_t)l->rows * (size_t)l->T;
    int hit = 0;
    pthread_mutex_lock(&l->mu);
    while (l->state == PF_RUNNING) pthread_cond_wait(&l->cv, &l->mu);
    if (l->state == PF_DONE && l->pf_step == step) {
        hit = 1;
        *rc = l->pf_rc;
        if (*rc == 0) {
            memcpy(inputs, l->pf_inputs, slab * sizeof *inputs);
            memcpy(targets, l->pf_targets, slab * sizeof *targets);
        } else {
            set_err(err, errlen, "%s", l->pf_err);
        }
    }
    l->state = PF_IDLE;
    pthread_mutex_unlock(&l->mu);
    return hit;
}

static void start_prefetch(batch_loader *l, long step) {
    pthread_mutex_lock(&l->mu);
    l->pf_step = step;
    l->state = PF_RUNNING;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
}

int loader_get(batch_loader *l, long step, int32_t *inputs, int32_t *targets, char *err,
               size_t errlen) {
    if (step < 1) {
        set_err(err, errlen, "data.path %s: step %ld is not >= 1", l->file->path, step);
        return -1;
    }
    int rc = 0;
    if (!take_prefetch(l, step, inputs, targets, &rc, err, errlen))
        rc = fill_step(l, step, inputs, targets, l->window, err, errlen);
    if (rc == 0) start_prefetch(l, step + 1);
    return rc;
}

void loader_destroy(batch_loader *l) {
    if (!l) return;
    if (l->worker_started) {
        pthread_mutex_lock(&l->mu);
        l->quit = 1;
        pthread_cond_broadcast(&l->cv);
        pthread_mutex_unlock(&l->mu);
        pthread_join(l->worker, NULL);
    }
    pthread_cond_destroy(&l->cv);
    pthread_mutex_destroy(&l->mu);
    tokens_close(l->file);
    free(l->window);
    free(l->pf_window);
    free(l->pf_inputs);
    free(l->pf_targets);
    free(l);
}
