/* gptc-data: turns text files into a token file (DESIGN section 4) with a byte-level
 * tokenizer, each byte one token, files concatenated in the order given ("-" is stdin).
 *
 *   gptc-data [--vocab N] --out tokens.h5 FILE [FILE ...]
 *
 * Any other tokenizer can write the same file with h5py (ids: a list or numpy array):
 *   import h5py, numpy as np
 *   with h5py.File("tokens.h5", "w") as f:
 *       f.create_dataset("tokens", data=np.asarray(ids, np.uint16)); f.attrs["vocab_size"] = np.int64(50257)
 * (use np.uint32 when the vocab is larger than 65536).
 *
 * Input is streamed in chunk-sized blocks, so files larger than memory convert, and the
 * dataset is chunked so the loader's window reads touch one or two chunks. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdarg.h>
#include <hdf5.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/checkpoint.h"
#include "engine/h5_checks.h"
#include "engine/log.h"
#include "engine/output_files.h"

/* 1M tokens per chunk: large enough that per-chunk overhead vanishes, small enough that
 * a window read never drags in much more than it needs. */
enum { CHUNK_TOKENS = 1 << 20 };

static const char USAGE[] =
    "usage: gptc-data [--vocab N] --out tokens.h5 FILE [FILE ...]\n"
    "  Byte-level tokenizer: every byte of the inputs is one token; files are\n"
    "  concatenated in the order given, '-' reads stdin.\n"
    "  --vocab N   vocab_size attribute to store, 1 to 2147483648 (default 256; every\n"
    "              byte must be < N). Tokens are stored as uint16 when N <= 65536, else\n"
    "              uint32.\n"
    "  --out PATH  output HDF5 file, written to PATH.tmp.<pid> and renamed over PATH (a\n"
    "              symbolic link PATH is replaced, not its target); an existing PATH that\n"
    "              is not an HDF5 file is refused, and PATH.tmp.<pid> files of writes that\n"
    "              were killed (their process gone) are removed first.\n"
    "  --help      this text.\n"
    "  Inputs that hold no bytes at all are refused (an empty /tokens trains nothing). A\n"
    "  file named like an option is given as ./-name.\n";

/* "gptc-data: ..." on stderr, one line: a file name with a newline in it is escaped */
static void data_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void data_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    log_vline("gptc-data: ", fmt, ap);
    va_end(ap);
}

typedef struct {
    long long vocab;
    const char *out;
    char **inputs; /* [n_inputs] input file paths */
    int n_inputs;
} options;

typedef struct {
    hid_t file, dset;   /* dset < 0 until the first block is flushed */
    hid_t file_type;    /* H5T_STD_U16LE or H5T_STD_U32LE */
    uint32_t *block;    /* [CHUNK_TOKENS] tokens not yet written */
    long fill;          /* tokens in block */
    long written;       /* tokens in the dataset */
} writer;

/* Returns 0 to go on, 1 when --help was printed, -1 on a usage error (message printed). */
static int parse_args(int argc, char **argv, options *o) {
    o->vocab = 256;
    o->out = NULL;
    o->inputs = calloc((size_t)argc, sizeof *o->inputs);
    o->n_inputs = 0;
    if (!o->inputs) {
        data_error("out of memory");
        return -1;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            fputs(USAGE, stdout);
            return 1;
        } else if (strcmp(a, "--out") == 0 || strcmp(a, "--vocab") == 0) {
            if (i + 1 >= argc || !argv[i + 1][0]) {
                data_error("%s needs a value (see --help)", a);
                return -1;
            }
            const char *v = argv[++i];
            if (strcmp(a, "--out") == 0) {
                o->out = v;
                continue;
            }
            char *end = NULL;
            errno = 0;
            o->vocab = strtoll(v, &end, 10);
            if (errno || end == v || *end || o->vocab < 1 || o->vocab > 2147483648LL) {
                data_error("--vocab %s is not an integer in [1, 2147483648]", v);
                return -1;
            }
        } else if (a[0] == '-' && a[1] != '\0') {
            data_error("unknown option %s (see --help)", a);
            return -1;
        } else {
            o->inputs[o->n_inputs++] = argv[i];
        }
    }
    if (!o->out) {
        data_error("--out is required (see --help)");
        return -1;
    }
    if (o->n_inputs == 0) {
        data_error("no input files (see --help)");
        return -1;
    }
    return 0;
}

/* Creates the dataset on the first flush, when the chunk size is known: a whole block,
 * or all the tokens there are when the input is smaller than one block. */
static int create_dataset(writer *w, long chunk) {
    hsize_t zero = 0, unlimited = H5S_UNLIMITED, ch = (hsize_t)chunk;
    hid_t space = H5Screate_simple(1, &zero, &unlimited);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    if (space >= 0 && dcpl >= 0 && H5Pset_chunk(dcpl, 1, &ch) >= 0)
        w->dset = H5Dcreate2(w->file, "tokens", w->file_type, space, H5P_DEFAULT, dcpl,
                             H5P_DEFAULT);
    if (dcpl >= 0) H5Pclose(dcpl);
    if (space >= 0) H5Sclose(space);
    return w->dset >= 0 ? 0 : -1;
}

/* Appends block[fill] to the dataset. */
static int flush_block(writer *w) {
    if (w->fill == 0) return 0;
    if (w->dset < 0 && create_dataset(w, w->fill)) return -1;
    hsize_t start = (hsize_t)w->written, count = (hsize_t)w->fill;
    hsize_t total = start + count;
    if (H5Dset_extent(w->dset, &total) < 0) return -1;
    hid_t fspace = H5Dget_space(w->dset);
    hid_t mspace = H5Screate_simple(1, &count, NULL);
    int ok = fspace >= 0 && mspace >= 0 &&
             H5Sselect_hyperslab(fspace, H5S_SELECT_SET, &start, NULL, &count, NULL) >= 0 &&
             H5Dwrite(w->dset, H5T_NATIVE_UINT32, mspace, fspace, H5P_DEFAULT, w->block) >= 0;
    if (mspace >= 0) H5Sclose(mspace);
    if (fspace >= 0) H5Sclose(fspace);
    if (!ok) return -1;
    w->written += w->fill;
    w->fill = 0;
    return 0;
}

/* Tokenizes one input into the writer. Prints its own one-line error. */
static int add_input(writer *w, const char *name, long long vocab, const char *tmp) {
    int is_stdin = strcmp(name, "-") == 0;
    if (output_names_closed_std(name)) {
        data_error("%s: stdin was closed when gptc-data started", name);
        return -1;
    }
    FILE *in = is_stdin ? stdin : fopen(name, "rb");
    if (!in) {
        data_error("%s: %s", name, strerror(errno));
        return -1;
    }
    unsigned char buf[1 << 16]; /* [64 KiB] bytes read but not yet tokenized */
    long long offset = 0;
    int rc = 0;
    size_t got;
    while (rc == 0 && (got = fread(buf, 1, sizeof buf, in)) > 0) {
        for (size_t i = 0; i < got; i++) {
            if (buf[i] >= vocab) {
                data_error("%s: byte %d at offset %lld is >= --vocab %lld",
                           name, buf[i], offset + (long long)i, vocab);
                rc = -1;
                break;
            }
            w->block[w->fill++] = buf[i];
            if (w->fill == CHUNK_TOKENS && flush_block(w)) {
                data_error("%s: HDF5 write failed", tmp);
                rc = -1;
                break;
            }
        }
        offset += (long long)got;
    }
    if (rc == 0 && ferror(in)) {
        data_error("%s: read error: %s", name, strerror(errno));
        rc = -1;
    }
    if (!is_stdin) fclose(in);
    return rc;
}

static int write_vocab_attr(hid_t file, long long vocab) {
    int64_t v = vocab;
    hid_t space = H5Screate(H5S_SCALAR);
    hid_t attr = space >= 0 ? H5Acreate2(file, "vocab_size", H5T_STD_I64LE, space,
                                         H5P_DEFAULT, H5P_DEFAULT)
                            : -1;
    int ok = attr >= 0 && H5Awrite(attr, H5T_NATIVE_INT64, &v) >= 0;
    if (attr >= 0) H5Aclose(attr);
    if (space >= 0) H5Sclose(space);
    return ok ? 0 : -1;
}

/* Writes every input into tmp. Returns the token count, or -1 (message printed). */
static long write_tokens(const options *o, const char *tmp) {
    /* fopen first so an unwritable location gets the system's reason. */
    FILE *probe = fopen(tmp, "wb");
    if (!probe) {
        data_error("cannot create %s: %s", tmp, strerror(errno));
        return -1;
    }
    fclose(probe);
    writer w = {.file = -1, .dset = -1, .fill = 0, .written = 0};
    w.file_type = o->vocab <= 65536 ? H5T_STD_U16LE : H5T_STD_U32LE;
    w.block = malloc(CHUNK_TOKENS * sizeof *w.block);
    w.file = H5Fcreate(tmp, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    long rc = 0;
    if (!w.block || w.file < 0) {
        char cause[256] = "out of memory";
        if (w.block) h5_error_reason(cause, sizeof cause);
        data_error("cannot create %s%s%s", tmp, cause[0] ? ": " : "", cause);
        rc = -1;
    }
    for (int i = 0; rc == 0 && i < o->n_inputs; i++)
        if (add_input(&w, o->inputs[i], o->vocab, tmp)) rc = -1;
    if (rc == 0 && flush_block(&w)) {
        data_error("%s: HDF5 write failed", tmp);
        rc = -1;
    }
    if (rc == 0 && w.written == 0) {
        if (o->n_inputs == 1) data_error("%s holds no bytes, nothing to write", o->inputs[0]);
        else data_error("the %d inputs (%s, ...) hold no bytes, nothing to write", o->n_inputs,
                        o->inputs[0]);
        rc = -1;
    }
    if (rc == 0 && write_vocab_attr(w.file, o->vocab)) {
        data_error("%s: cannot write the vocab_size attribute", tmp);
        rc = -1;
    }
    /* the last chunks leave HDF5's cache at these closes: on a full disk they fail here
     * (errno says why), where every write before them succeeded */
    errno = 0;
    if (w.dset >= 0 && H5Dclose(w.dset) < 0 && rc == 0) {
        data_error("%s: writing the tokens failed%s%s", tmp,
                   errno ? ": " : "", errno ? strerror(errno) : "");
        rc = -1;
    }
    errno = 0;
    if (w.file >= 0 && H5Fclose(w.file) < 0 && rc == 0) {
        data_error("%s: closing the file failed%s%s", tmp,
                   errno ? ": " : "", errno ? strerror(errno) : "");
        rc = -1;
    }
    free(w.block);
    return rc == 0 ? w.written : -1;
}

/* 0 when neither --out nor its temporary file tmp is one of the inputs (as the trainer
 * checks its outputs: output_paths_distinct, by inode, so "./a.txt" and a hard link
 * count), else 1 with a line: the output replaces its file only at the end, but then the
 * input is gone (and tmp is truncated at the start). */
static int out_is_input(const options *o, const char *tmp) {
    named_path *paths = calloc((size_t)o->n_inputs + 2, sizeof *paths); /* [n_inputs + 2] */
    if (!paths) {
        data_error("out of memory");
        return 1;
    }
    int n = 0;
    paths[n++] = (named_path){"--out", o->out, 1};
    paths[n++] = (named_path){"the temporary file", tmp, 1};
    for (int i = 0; i < o->n_inputs; i++)
        if (strcmp(o->inputs[i], "-") != 0) paths[n++] = (named_path){"the input", o->inputs[i], 0};
    char err[2048];
    int clash = output_paths_distinct(paths, n, err, sizeof err) != 0;
    if (clash) data_error("%s", err);
    free(paths);
    return clash;
}

/* The temporary output, removed when SIGINT or SIGTERM ends the run: a conversion stopped
 * by hand leaves no half-written copy (it grows as fast as the input is read). */
static const char *volatile g_tmp;

static void remove_tmp_and_die(int sig) {
    if (g_tmp) unlink(g_tmp); /* async-signal-safe, as are the two calls after it */
    signal(sig, SIG_DFL);
    raise(sig);
}

int main(int argc, char **argv) {
    options o;
    /* with stdout closed, the output file would take its number and the summary line */
    if (output_guard_std_fds() != 0) {
        data_error("descriptor 0, 1 or 2 is closed and /dev/null cannot be "
                   "opened in its place");
        return 1;
    }
    ckpt_library_init();
    int p = parse_args(argc, argv, &o);
    if (p != 0) {
        free(o.inputs);
        return p > 0 ? 0 : 2;
    }
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    /* the process's own name, as the trainer's checkpoints: a fixed PATH.tmp was truncated
     * and renamed away when it was a user's file, and two conversions to one --out wrote
     * into one temporary file */
    size_t len = strlen(o.out) + 32;
    char *tmp = malloc(len);
    if (!tmp) {
        data_error("out of memory");
        return 1;
    }
    snprintf(tmp, len, "%s.tmp.%ld", o.out, (long)getpid());
    /* as the trainer's train.save: rename() would put the file in place of a device or a
     * FIFO (as root, of /dev/null itself) */
    char err[2048];
    int refused = output_path_check("--out", o.out, OUTPUT_TOKENS, err, sizeof err) != 0;
    if (refused) data_error("%s", err);
    if (refused || out_is_input(&o, tmp)) {
        free(tmp);
        free(o.inputs);
        return 1;
    }
    /* the temporary files of conversions killed mid-way (SIGKILL: the others remove their
     * own), whose process is gone, as the trainer's saves do */
    save_dir_tidy(o.out, 1, 1, NULL, NULL);
    g_tmp = tmp;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = remove_tmp_and_die;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGXFSZ, SIG_IGN); /* past RLIMIT_FSIZE: EFBIG, reported, not a silent kill */
    long n = write_tokens(&o, tmp);
    g_tmp = NULL;
    int rc = 0;
    if (n < 0) {
        remove(tmp);
        rc = 1;
    } else if (output_replace(tmp, o.out, err, sizeof err) != 0) {
        data_error("--out %s: %s", o.out, err);
        remove(tmp);
        rc = 1;
    } else {
        printf("gptc-data: wrote %ld tokens (vocab_size %lld, %s) to %s\n", n, o.vocab,
               o.vocab <= 65536 ? "uint16" : "uint32", o.out);
    }
    free(tmp);
    free(o.inputs);
    return rc;
}
