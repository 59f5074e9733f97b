/* The HDF5 filters (compression and the like) a dataset was written with that this build
 * of libhdf5 cannot decode: h5py's lzf, say, which h5py brings and libhdf5 does not. A read
 * of such a dataset fails with no reason given; this names it. */
#ifndef GPTC_H5_FILTERS_H
#define GPTC_H5_FILTERS_H

#include <hdf5.h>
#include <stddef.h>

/* 1 when dset needs a filter this library lacks, with name[n] = "its name (id N)"; else 0. */
int h5_missing_filter(hid_t dset, char *name, size_t n);

#endif
