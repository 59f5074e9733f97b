/* Checks of an HDF5 dataset before it is read, for what a read would hide. */
#ifndef GPTC_H5_CHECKS_H
#define GPTC_H5_CHECKS_H

#include <hdf5.h>
#include <stddef.h>

/* The HDF5 filters (compression and the like) a dataset was written with that this build
 * of libhdf5 cannot decode: h5py's lzf, say, which h5py brings and libhdf5 does not. A read
 * of such a dataset fails with no reason given; this names it.
 * 1 when dset needs a filter this library lacks, with name[n] = "its name (id N)"; else 0. */
int h5_missing_filter(hid_t dset, char *name, size_t n);

/* Storage a dataset was made with and never given: it reads as the fill value (zeros) without
 * an error, so a training run would take zeros for tokens or weights without a word (a
 * writer killed part way, h5py's create_dataset with a shape and no data). 1 when dset has
 * storage of its own (not virtual, no external files: those are checked where they are
 * read) and part of it was never written, with *unwritten of *total chunks (1 of 1 for a
 * contiguous dataset) never allocated; else 0. A chunk written whole with zeros counts as
 * written. */
int h5_unwritten(hid_t dset, long long *unwritten, long long *total);

/* 1 when dset is stored outside its file: a virtual dataset (its data in source
 * datasets) or in external files; else 0 */
int h5_stored_elsewhere(hid_t dset);

/* The innermost description on this thread's HDF5 error stack, where the last failed call
 * found its fault ("unable to lock file, errno = 11, ..." where another program writes the
 * file), into buf[n]; "" when the stack is empty. Read it before the next HDF5 call, with
 * automatic printing off (which leaves the stack in place). */
void h5_error_cause(char *buf, size_t n);
/* As h5_error_cause, but of a failed system call only the system's message ("No space
 * left on device"), not HDF5's whole description of the call */
void h5_error_reason(char *buf, size_t n);
/* 1 when the last failed call failed at a read of the file's bytes (a disk's or a network
 * file system's error: HDF5's "file read failed"), with the system's reason in buf[n]
 * ("Input/output error"); else 0. Whatever check made the read ("no dataset /tokens")
 * would hide it. */
int h5_read_failed(char *buf, size_t n);
/* Why H5Fopen failed on a file h5_is_hdf5 took for HDF5, into why[n]: "cannot read the
 * file: <the system's reason>" where a read failed, else "HDF5 cannot open the file:
 * <HDF5's cause>" and a guess: " (another program has it open for writing?)" where the
 * cause is HDF5's file lock, " (truncated or damaged?)" otherwise */
void h5_open_failed(char *why, size_t n);

/* Whether path is an HDF5 file (its signature): 1 if so; 0 if not, with why[n] = "not an
 * HDF5 file"; -1 when it could not be read, with why[n] = "cannot read the file: <the
 * system's reason>" (a disk's read error read as "not an HDF5 file"). Automatic printing
 * off, as h5_error_cause wants. */
int h5_is_hdf5(const char *path, char *why, size_t n);

/* What the HDF5 file at path is, for an output about to replace it: H5_TOKENS (a /tokens
 * link, as a token file has), else H5_CHECKPOINT (a root attribute format, as a gptc
 * checkpoint has), else H5_OTHER; H5_UNKNOWN when HDF5 cannot open it (damaged, or
 * locked by a writer). Prints nothing. */
typedef enum { H5_UNKNOWN, H5_CHECKPOINT, H5_TOKENS, H5_OTHER } h5_kind;
h5_kind h5_file_kind(const char *path);

#endif
