/* Where a dataset's tokens come from when they are not stored in its own file.
 *
 * HDF5 reads the parts of a virtual dataset whose source file or dataset it cannot open,
 * or that no mapping covers, as the dataset's fill value; and the bytes an external file
 * lacks (a file shorter than its share) as zeros. Either way a run would train on token
 * 0 without a word, so the sources are checked when the file is opened.
 *
 * A relative source file is looked for as HDF5 does with a default access property list
 * (H5Pset_virtual_prefix and H5Pset_efile_prefix unset): virtual sources under each
 * HDF5_VDS_PREFIX entry, then beside the virtual file, then from the working directory
 * (an absolute name that is not there by its last component);
 * external files under HDF5_EXTFILE_PREFIX, else from the working directory. "${ORIGIN}"
 * in a prefix is the directory of the file that holds the dataset. Mappings with
 * printf-style names or unlimited selections are not checked (their extent is found by
 * HDF5 at open time). Called with the caller's HDF5 lock held. */
#define _POSIX_C_SOURCE 200809L
#include "data/h5_sources.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

enum { MAX_BLOCKS = 1 << 20 }; /* coverage is checked up to this many mapped blocks */

static void set_err(char *err, size_t errlen, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* adds p to found (unless found is NULL or holds it); 0, or -1 when out of memory */
static int note_source(h5_source_files *found, const char *p) {
    if (!found) return 0;
    for (size_t i = 0; i < found->n; i++)
        if (strcmp(found->paths[i], p) == 0) return 0;
    char **grown = realloc(found->paths, (found->n + 1) * sizeof *grown);
    if (!grown) return -1;
    found->paths = grown;
    if (!(grown[found->n] = malloc(strlen(p) + 1))) return -1;
    strcpy(grown[found->n++], p);
    return 0;
}

void h5_source_files_free(h5_source_files *found) {
    for (size_t i = 0; i < found->n; i++) free(found->paths[i]);
    free(found->paths);
    found->paths = NULL, found->n = 0;
}

static int is_file(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* dir (with a trailing '/', or "" for the working directory) of path */
static void dir_of(const char *path, char *dir, size_t len) {
    const char *slash = strrchr(path, '/');
    size_t n = slash ? (size_t)(slash - path) + 1 : 0;
    if (n >= len) n = len - 1;
    memcpy(dir, path, n);
    dir[n] = '\0';
}

/* out = prefix (with "${ORIGIN}" replaced by origin_dir) / name; 0 when it does not fit
 * (out is then no path to look at) */
static int join(char *out, size_t len, const char *prefix, size_t plen, const char *origin_dir,
                const char *name) {
    static const char ORIGIN[] = "${ORIGIN}";
    size_t ol = sizeof ORIGIN - 1;
    /* a file named without a directory is in the working directory: "./", not "/" */
    const char *origin = origin_dir[0] ? origin_dir : "./";
    int n = plen >= ol && strncmp(prefix, ORIGIN, ol) == 0
                ? snprintf(out, len, "%s%.*s/%s", origin, (int)(plen - ol), prefix + ol, name)
                : snprintf(out, len, "%.*s/%s", (int)plen, prefix, name);
    return n >= 0 && (size_t)n < len;
}

/* The first existing path for name under the ':'-separated prefixes of env var; 1 if found */
static int under_env(const char *env, const char *origin_dir, const char *name, char *out,
                     size_t len) {
    const char *list = getenv(env);
    if (!list || !*list) return 0;
    for (const char *p = list; *p;) {
        const char *end = strchr(p, ':');
        size_t plen = end ? (size_t)(end - p) : strlen(p);
        if (plen > 0 && join(out, len, p, plen, origin_dir, name) && is_file(out)) return 1;
        p += plen + (end ? 1 : 0);
    }
    return 0;
}

/* Where HDF5 would find source file name of the file at path; 0 if nowhere. An absolute
 * name that is not there is looked for by its last component, as HDF5 does. */
static int find_vds_source(const char *path, const char *name, char *out, size_t len) {
    char dir[4096];
    dir_of(path, dir, sizeof dir);
    const char *rest = name; /* what the prefixes are put in front of */
    if (name[0] == '/') {
        snprintf(out, len, "%s", name);
        if (is_file(out)) return 1;
        rest = strrchr(name, '/') + 1;
    }
    if (under_env("HDF5_VDS_PREFIX", dir, rest, out, len)) return 1;
    snprintf(out, len, "%s%s", dir, rest);
    if (is_file(out)) return 1;
    snprintf(out, len, "%s", rest);
    return is_file(out);
}

/* A mapping's string (file or dataset name) of mapping i, malloc'ed; NULL on failure */
static char *mapping_name(hid_t dcpl, size_t i, int file) {
    ssize_t n = file ? H5Pget_virtual_filename(dcpl, i, NULL, 0)
                     : H5Pget_virtual_dsetname(dcpl, i, NULL, 0);
    char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (!s) return NULL;
    n = file ? H5Pget_virtual_filename(dcpl, i, s, (size_t)n + 1)
             : H5Pget_virtual_dsetname(dcpl, i, s, (size_t)n + 1);
    if (n < 0) {
        free(s);
        return NULL;
    }
    return s;
}

/* The external files that hold dataset dset (dname of the file at path, dcpl its creation
 * properties), when it has any, exist and hold its whole extent; 0, or -1 with err set */
static int check_external(hid_t dset, hid_t dcpl, const char *path, const char *dname,
                          const char *what, h5_source_files *found_files, char *err,
                          size_t errlen) {
    int count = H5Pget_external_count(dcpl);
    if (count <= 0) return 0;
    hid_t space = H5Dget_space(dset), type = H5Dget_type(dset);
    hssize_t n = space >= 0 ? H5Sget_simple_extent_npoints(space) : -1;
    hsize_t bytes = n > 0 && type >= 0 ? (hsize_t)n * H5Tget_size(type) : 0;
    if (type >= 0) H5Tclose(type);
    if (space >= 0) H5Sclose(space);
    char dir[4096];
    dir_of(path, dir, sizeof dir);
    for (int i = 0; i < count && bytes > 0; i++) {
        char name[4096], found[4096 + 64];
        off_t offset = 0;
        hsize_t size = 0;
        if (H5Pget_external(dcpl, (unsigned)i, sizeof name, name, &offset, &size) < 0) {
            set_err(err, errlen, "%s %s: cannot read external file %d of %s", what, path, i,
                    dname);
            return -1;
        }
        name[sizeof name - 1] = '\0';
        hsize_t need = size == H5F_UNLIMITED || size > bytes ? bytes : size;
        bytes -= need;
        /* as HDF5 opens it (H5_combine_path): one prefix, not a list, and with a prefix
         * set, no other place */
        const char *prefix = getenv("HDF5_EXTFILE_PREFIX");
        if (name[0] != '/' && prefix && *prefix) {
            if (!join(found, sizeof found, prefix, strlen(prefix), dir, name)) found[0] = '\0';
        } else {
            snprintf(found, sizeof found, "%s", name);
        }
        struct stat st;
        if (!found[0]) {
            set_err(err, errlen, "%s %s: %s is stored in the external file %s, whose path under "
                    "HDF5_EXTFILE_PREFIX is too long", what, path, dname, name);
            return -1;
        }
        if (stat(found, &st) != 0 || !S_ISREG(st.st_mode)) {
            set_err(err, errlen, "%s %s: %s is stored in the external file %s, which cannot "
                    "be found as %s (relative names are from %s): its tokens would read as 0",
                    what, path, dname, name, found,
                    name[0] != '/' && prefix && *prefix ? "HDF5_EXTFILE_PREFIX"
                                                        : "the working directory");
            return -1;
        }
        if ((hsize_t)st.st_size < (hsize_t)offset + need) {
            set_err(err, errlen, "%s %s: the external file %s holds %lld bytes, %s needs "
                    "%llu from it at offset %lld: the rest would read as 0", what, path, found,
                    (long long)st.st_size, dname, (unsigned long long)need, (long long)offset);
            return -1;
        }
        if (note_source(found_files, found)) {
            set_err(err, errlen, "%s %s: out of memory", what, path);
            return -1;
        }
    }
    return 0;
}

/* Source dataset dname of file fname (mapping i, vspace's part of /tokens) opens, and
 * srcspace's selection lies within its extent. 0, or -1 with err set. */
static int check_source(hid_t own_file, const char *path, const char *what, size_t i,
                        const char *fname, const char *dname, hid_t vspace, hid_t srcspace,
                        h5_source_files *found_files, char *err, size_t errlen) {
    char found[4096];
    hid_t sf = own_file;
    if (strcmp(fname, ".") != 0) {
        if (!find_vds_source(path, fname, found, sizeof found)) {
            set_err(err, errlen, "%s %s: /tokens is a virtual dataset whose source file %s "
                    "(mapping %zu) cannot be found: its tokens would read as 0", what, path,
                    fname, i);
            return -1;
        }
        if (note_source(found_files, found)) {
            set_err(err, errlen, "%s %s: out of memory", what, path);
            return -1;
        }
        sf = H5Fopen(found, H5F_ACC_RDONLY, H5P_DEFAULT);
        if (sf < 0) {
            set_err(err, errlen, "%s %s: the virtual dataset's source file %s (mapping %zu) "
                    "is not an HDF5 file HDF5 can open: its tokens would read as 0", what,
                    path, found, i);
            return -1;
        }
    }
    hid_t sd = H5Dopen2(sf, dname, H5P_DEFAULT);
    hid_t space = sd >= 0 ? H5Dget_space(sd) : -1;
    int rank = space >= 0 ? H5Sget_simple_extent_ndims(space) : -1;
    hsize_t dims[H5S_MAX_RANK], start[H5S_MAX_RANK], end[H5S_MAX_RANK];
    int ok = rank > 0 && H5Sget_simple_extent_dims(space, dims, NULL) >= 0;
    if (ok && H5Sget_select_type(srcspace) == H5S_SEL_ALL) {
        /* the whole source, whose extent the file does not keep: it must hold as many
         * elements as the mapping's part of /tokens */
        ok = H5Sget_simple_extent_npoints(space) >= H5Sget_select_npoints(vspace);
    } else if (ok) {
        ok = H5Sget_simple_extent_ndims(srcspace) == rank &&
             H5Sget_select_bounds(srcspace, start, end) >= 0;
        for (int d = 0; ok && d < rank; d++) ok = end[d] < dims[d];
    }
    /* a source that is itself virtual (or /tokens mapping itself, which HDF5 follows
     * until the stack runs out) is not followed here, so its own sources are unchecked:
     * refused; a source in external files gets their check */
    hid_t sdcpl = sd >= 0 ? H5Dget_create_plist(sd) : -1;
    int nested = sdcpl >= 0 && H5Pget_layout(sdcpl) == H5D_VIRTUAL;
    int rc = sd >= 0 && ok ? 0 : -1;
    if (sd < 0)
        set_err(err, errlen, "%s %s: the virtual dataset's source %s has no dataset %s "
                "(mapping %zu): its tokens would read as 0", what, path, fname, dname, i);
    else if (!ok)
        set_err(err, errlen, "%s %s: the virtual dataset's source %s:%s (mapping %zu) is "
                "smaller than the part mapped from it: the rest would read as 0", what, path,
                fname, dname, i);
    else if (nested) {
        set_err(err, errlen, "%s %s: the virtual dataset's source %s:%s (mapping %zu) is "
                "itself a virtual dataset, whose sources are not checked (or /tokens itself): "
                "map /tokens from the datasets that hold the tokens", what, path, fname, dname,
                i);
        rc = -1;
    } else if (sdcpl >= 0) {
        char ctx[4096 + 128]; /* the file the user named comes first in the message */
        snprintf(ctx, sizeof ctx, "%s %s: the virtual dataset's source", what, path);
        rc = check_external(sd, sdcpl, sf == own_file ? path : found, dname, ctx, found_files,
                            err, errlen);
    }
    if (sdcpl >= 0) H5Pclose(sdcpl);
    if (space >= 0) H5Sclose(space);
    if (sd >= 0) H5Dclose(sd);
    if (sf != own_file) H5Fclose(sf);
    return rc;
}

typedef struct {
    hsize_t lo, hi; /* [lo, hi] */
} block;

static int by_lo(const void *a, const void *b) {
    hsize_t x = ((const block *)a)->lo, y = ((const block *)b)->lo;
    return x < y ? -1 : x > y;
}

/* room for k more blocks in *bl; 0, or 1 past MAX_BLOCKS or out of memory */
static int reserve(block **bl, size_t n, size_t *cap, size_t k) {
    if (n + k <= *cap) return 0;
    if (n + k > MAX_BLOCKS) return 1;
    size_t want = *cap ? *cap : 64;
    while (want < n + k) want *= 2;
    block *b = realloc(*bl, want * sizeof *b);
    if (!b) return 1;
    *bl = b, *cap = want;
    return 0;
}

/* Adds the blocks of 1-D selection vspace to *bl; 0, or 1 when they cannot be listed */
static int add_blocks(hid_t vspace, block **bl, size_t *n, size_t *cap) {
    H5S_sel_type t = H5Sget_select_type(vspace);
    if (t == H5S_SEL_NONE) return 0;
    hsize_t dim;
    if (H5Sget_simple_extent_ndims(vspace) != 1 ||
        H5Sget_simple_extent_dims(vspace, &dim, NULL) != 1)
        return 1;
    if (t == H5S_SEL_ALL) {
        if (reserve(bl, *n, cap, 1)) return 1;
        (*bl)[(*n)++] = (block){0, dim - 1};
        return 0;
    }
    if (t != H5S_SEL_HYPERSLABS) return 1;
    hssize_t nb = H5Sget_select_hyper_nblocks(vspace);
    if (nb < 0 || reserve(bl, *n, cap, (size_t)nb)) return 1;
    hsize_t *buf = malloc((size_t)nb * 2 * sizeof(hsize_t)); /* [nb][start, end] */
    if (!buf || H5Sget_select_hyper_blocklist(vspace, 0, (hsize_t)nb, buf) < 0) {
        free(buf);
        return 1;
    }
    for (hssize_t k = 0; k < nb; k++) (*bl)[(*n)++] = (block){buf[2 * k], buf[2 * k + 1]};
    free(buf);
    return 0;
}

static int check_virtual(hid_t file, hid_t dcpl, const char *path, const char *what, hsize_t n,
                         h5_source_files *found, char *err, size_t errlen) {
    size_t count = 0;
    if (H5Pget_virtual_count(dcpl, &count) < 0) {
        set_err(err, errlen, "%s %s: cannot read the mappings of the virtual dataset /tokens",
                what, path);
        return -1;
    }
    size_t nbl = 0, cap = 0;
    block *bl = NULL; /* [cap] the mapped blocks of /tokens, nbl of them so far */
    int listed = 1, rc = 0;
    for (size_t i = 0; i < count && rc == 0; i++) {
        char *fname = mapping_name(dcpl, i, 1), *dname = mapping_name(dcpl, i, 0);
        hid_t vspace = H5Pget_virtual_vspace(dcpl, i), sspace = H5Pget_virtual_srcspace(dcpl, i);
        /* only a regular hyperslab can be unlimited (a count or block of H5S_UNLIMITED) */
        int unlimited = 0;
        hsize_t st[1], str[1], cnt[1], blk[1];
        if (vspace >= 0 && H5Sget_select_type(vspace) == H5S_SEL_HYPERSLABS &&
            H5Sget_simple_extent_ndims(vspace) == 1 && H5Sis_regular_hyperslab(vspace) > 0 &&
            H5Sget_regular_hyperslab(vspace, st, str, cnt, blk) >= 0)
            unlimited = cnt[0] == H5S_UNLIMITED || blk[0] == H5S_UNLIMITED;
        if (!fname || !dname || vspace < 0 || sspace < 0) {
            set_err(err, errlen, "%s %s: cannot read mapping %zu of the virtual dataset /tokens",
                    what, path, i);
            rc = -1;
        } else if (unlimited || strchr(fname, '%') || strchr(dname, '%')) {
            listed = 0; /* printf-style or unlimited: HDF5 sizes it at open */
        } else {
            rc = check_source(file, path, what, i, fname, dname, vspace, sspace, found, err,
                              errlen);
            if (rc == 0 && listed && add_blocks(vspace, &bl, &nbl, &cap)) listed = 0;
        }
        free(fname), free(dname);
        if (vspace >= 0) H5Sclose(vspace);
        if (sspace >= 0) H5Sclose(sspace);
    }
    if (rc == 0 && listed && n > 0) { /* every token must be mapped */
        qsort(bl, nbl, sizeof *bl, by_lo);
        hsize_t next = 0; /* tokens [0, next) are covered */
        for (size_t k = 0; k < nbl && next < n; k++) {
            if (bl[k].lo > next) break;
            if (bl[k].hi + 1 > next) next = bl[k].hi + 1;
        }
        if (next < n) {
            set_err(err, errlen, "%s %s: the virtual dataset /tokens maps no source to token "
                    "%llu (of %llu): it would read as 0", what, path,
                    (unsigned long long)next, (unsigned long long)n);
            rc = -1;
        }
    }
    free(bl);
    return rc;
}

int h5_check_sources(hid_t file, hid_t dset, const char *path, const char *what,
                     h5_source_files *found, char *err, size_t errlen) {
    /* reached through an external link, the dataset lives in the link's target, which
     * the watch of path's own file does not see: a source too */
    hid_t home = H5Iget_file_id(dset);
    char mine[4096], its[4096];
    if (home >= 0 && H5Fget_name(home, its, sizeof its) > 0 &&
        H5Fget_name(file, mine, sizeof mine) > 0 && strcmp(its, mine) != 0 &&
        note_source(found, its)) {
        H5Fclose(home);
        set_err(err, errlen, "%s %s: out of memory", what, path);
        return -1;
    }
    if (home >= 0) H5Fclose(home);
    hid_t dcpl = H5Dget_create_plist(dset);
    hid_t space = H5Dget_space(dset), type = H5Dget_type(dset);
    hssize_t n = space >= 0 ? H5Sget_simple_extent_npoints(space) : -1;
    size_t elem = type >= 0 ? H5Tget_size(type) : 0;
    int rc = 0;
    if (dcpl < 0 || n < 0 || elem == 0) {
        set_err(err, errlen, "%s %s: cannot read how /tokens is stored", what, path);
        rc = -1;
    } else if (H5Pget_layout(dcpl) == H5D_VIRTUAL) {
        rc = check_virtual(file, dcpl, path, what, (hsize_t)n, found, err, errlen);
    } else {
        rc = check_external(dset, dcpl, path, "/tokens", what, found, err, errlen);
    }
    if (type >= 0) H5Tclose(type);
    if (space >= 0) H5Sclose(space);
    if (dcpl >= 0) H5Pclose(dcpl);
    return rc;
}
