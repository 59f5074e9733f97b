/* Checks that a dataset stored outside its own file (a virtual dataset's sources, external
 * files) can be read in full: HDF5 would read what is missing as zeros. */
#ifndef GPTC_H5_SOURCES_H
#define GPTC_H5_SOURCES_H

#include <hdf5.h>
#include <stddef.h>

/* 0 when dset (1-D, in file, opened from path) has its own storage or every source of it
 * is there and covers its part; else -1 with a one-line message in err, starting with
 * "<what> <path>: " (what: the config key, e.g. "data.path"). Call with the HDF5 lock
 * held and automatic error printing off. */
int h5_check_sources(hid_t file, hid_t dset, const char *path, const char *what, char *err,
                     size_t errlen);

#endif
