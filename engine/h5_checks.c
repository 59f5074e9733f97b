/* What an HDF5 read would hide (filters this libhdf5 lacks, data stored outside the file,
 * output kinds), found before the read: engine/h5_checks.h. */
#include "engine/h5_checks.h"

#include <stdio.h>
#include <string.h>

int h5_missing_filter(hid_t dset, char *name, size_t n) {
    hid_t dcpl = H5Dget_create_plist(dset);
    if (dcpl < 0) return 0;
    int missing = 0, filters = H5Pget_nfilters(dcpl);
    for (int i = 0; i < filters && !missing; i++) {
        unsigned int flags = 0, config = 0;
        size_t n_values = 0;
        char fname[64] = "";
        H5Z_filter_t id = H5Pget_filter2(dcpl, (unsigned)i, &flags, &n_values, NULL,
                                         sizeof fname, fname, &config);
        /* "optional" (h5py's lzf is) lets a write skip the filter, not a read: the chunks
         * it did filter need it */
        if (id >= 0 && H5Zfilter_avail(id) <= 0) {
            snprintf(name, n, "%s (id %d)", fname[0] ? fname : "unnamed filter", (int)id);
            missing = 1;
        }
    }
    H5Pclose(dcpl);
    return missing;
}

/* A chunked dataset's chunks never written: 1 with *unwritten of *total, or 0 where this
 * HDF5 cannot count them (H5Dget_num_chunks came in 1.10.5). Counted, as
 * H5Dget_space_status says PART_ALLOCATED of whole datasets whose extent is no multiple of
 * the chunk. */
static int count_unwritten_chunks(hid_t dset, hid_t dcpl, hid_t space, long long *unwritten,
                                  long long *total) {
#if H5_VERSION_GE(1, 10, 5)
    hsize_t dims[H5S_MAX_RANK], chunk[H5S_MAX_RANK], have = 0;
    int nd = H5Sget_simple_extent_dims(space, dims, NULL);
    long long want = nd >= 0 && H5Pget_chunk(dcpl, nd, chunk) == nd ? 1 : 0;
    for (int i = 0; i < nd && want; i++) want *= (long long)((dims[i] + chunk[i] - 1) / chunk[i]);
    if (want <= 0 || H5Dget_num_chunks(dset, space, &have) < 0) return 0;
    if ((long long)have < want) *unwritten = want - (long long)have, *total = want;
    return 1;
#else
    (void)dset, (void)dcpl, (void)space, (void)unwritten, (void)total;
    return 0;
#endif
}

int h5_unwritten(hid_t dset, long long *unwritten, long long *total) {
    *unwritten = *total = 0;
    hid_t dcpl = H5Dget_create_plist(dset), space = H5Dget_space(dset);
    H5D_layout_t layout = dcpl >= 0 ? H5Pget_layout(dcpl) : H5D_LAYOUT_ERROR;
    int own = dcpl >= 0 && space >= 0 && layout != H5D_VIRTUAL &&
              H5Pget_external_count(dcpl) == 0 && H5Sget_simple_extent_npoints(space) > 0;
    int counted = own && layout == H5D_CHUNKED &&
                  count_unwritten_chunks(dset, dcpl, space, unwritten, total);
    /* else: contiguous storage is all there or none (compact always is) */
    H5D_space_status_t status;
    if (own && !counted && layout != H5D_COMPACT && H5Dget_space_status(dset, &status) >= 0 &&
        status == H5D_SPACE_STATUS_NOT_ALLOCATED)
        *unwritten = *total = 1;
    if (space >= 0) H5Sclose(space);
    if (dcpl >= 0) H5Pclose(dcpl);
    return *unwritten > 0;
}

enum { CAUSE_LEN = 256 }; /* the innermost description kept, at most */

/* H5Ewalk2's callback: keeps the first description it is shown in buf[CAUSE_LEN] (the walk
 * goes upward, so that is the innermost: where HDF5 found the fault) */
static herr_t keep_innermost(unsigned n, const H5E_error2_t *e, void *buf) {
    char *out = buf;
    (void)n;
    if (!out[0] && e->desc && e->desc[0]) snprintf(out, CAUSE_LEN, "%s", e->desc);
    return 0;
}

void h5_error_cause(char *buf, size_t n) {
    char inner[CAUSE_LEN] = "";
    H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, keep_innermost, inner);
    snprintf(buf, n, "%s", inner);
}

/* buf[n] = the system's words in HDF5's description of a failed system call, cause ("file
 * write failed: time = ..., filename = ..., errno = 28, error message = 'No space left on
 * device', buf = ..."); the whole description where it has none */
static void system_words(const char *cause, char *buf, size_t n) {
    const char *key = "error message = '";
    const char *msg = strstr(cause, key);
    if (!msg) {
        snprintf(buf, n, "%s", cause);
        return;
    }
    msg += strlen(key);
    const char *end = strchr(msg, '\'');
    snprintf(buf, n, "%.*s", (int)(end ? (size_t)(end - msg) : strlen(msg)), msg);
}

void h5_error_reason(char *buf, size_t n) {
    char cause[CAUSE_LEN];
    h5_error_cause(cause, sizeof cause);
    system_words(cause, buf, n);
}

int h5_read_failed(char *buf, size_t n) {
    char cause[CAUSE_LEN];
    h5_error_cause(cause, sizeof cause);
    if (!strstr(cause, "read failed") || !strstr(cause, "error message = '")) return 0;
    system_words(cause, buf, n);
    return 1;
}

int h5_is_hdf5(const char *path, char *why, size_t n) {
    htri_t is = H5Fis_hdf5(path);
    if (is > 0) return 1;
    if (is == 0) {
        snprintf(why, n, "not an HDF5 file");
        return 0;
    }
    char reason[CAUSE_LEN];
    h5_error_reason(reason, sizeof reason);
    snprintf(why, n, "cannot read the file%s%s", reason[0] ? ": " : "", reason);
    return -1;
}

void h5_open_failed(char *why, size_t n) {
    char cause[CAUSE_LEN];
    h5_error_cause(cause, sizeof cause);
    if (strstr(cause, "read failed") && strstr(cause, "error message = '")) {
        /* the disk's error: HDF5's whole description (a time, a buffer's address) and a
         * guess at damage would hide it */
        char words[CAUSE_LEN];
        system_words(cause, words, sizeof words);
        snprintf(why, n, "cannot read the file: %s", words);
        return;
    }
    /* "unable to lock file, errno = 11" (EAGAIN: another process holds the lock); other
     * errnos (ENOSYS on a file system without locks) are not another writer */
    int locked = strstr(cause, "unable to lock file") && strstr(cause, "errno = 11");
    snprintf(why, n, "HDF5 cannot open the file%s%s%s", cause[0] ? ": " : "", cause,
             locked ? " (another program has it open for writing?)" : " (truncated or damaged?)");
}

h5_kind h5_file_kind(const char *path) {
    H5E_auto2_t func;
    void *data;
    H5Eget_auto2(H5E_DEFAULT, &func, &data);
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    /* /tokens first: a token file of another tool may carry a format attribute of its
     * own, and a checkpoint has no /tokens */
    h5_kind kind = f < 0                                     ? H5_UNKNOWN
                   : H5Lexists(f, "tokens", H5P_DEFAULT) > 0 ? H5_TOKENS
                   : H5Aexists(f, "format") > 0              ? H5_CHECKPOINT
                                                             : H5_OTHER;
    if (f >= 0) H5Fclose(f);
    H5Eset_auto2(H5E_DEFAULT, func, data);
    return kind;
}

int h5_stored_elsewhere(hid_t dset) {
    hid_t dcpl = H5Dget_create_plist(dset);
    if (dcpl < 0) return 0;
    int elsewhere = H5Pget_layout(dcpl) == H5D_VIRTUAL || H5Pget_external_count(dcpl) > 0;
    H5Pclose(dcpl);
    return elsewhere;
}
