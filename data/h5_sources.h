/* Checks that a dataset stored outside its own file (a virtual dataset's sources, external
 * files) can be read in full: HDF5 would read what is missing as zeros. */
#ifndef GPTC_H5_SOURCES_H
#define GPTC_H5_SOURCES_H

#include <hdf5.h>
#include <stddef.h>

/* The files besides its own that a dataset is read from (virtual datasets' source files,
 * external files), by the names found for them: paths[n] */
typedef struct {
    char **paths;
    size_t n;
} h5_source_files;

/* 0 when dset (1-D, in file, opened from path) has its own storage or every source of it
 * is there and covers its part; else -1 with a one-line message in err, starting with
 * "<what> <path>: " (what: the config key, e.g. "data.path"). When found is not NULL the
 * source files checked are added to it (each once; free with h5_source_files_free), and
 * so is the file dset lives in when an external link led to it from file. Call with the
 * HDF5 lock held and automatic error printing off. */
int h5_check_sources(hid_t file, hid_t dset, const char *path, const char *what,
                     h5_source_files *found, char *err, size_t errlen);
void h5_source_files_free(h5_source_files *found);

#endif
