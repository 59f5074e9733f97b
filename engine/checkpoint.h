/* HDF5 checkpoints, schema of DESIGN section 4:
 *   root attributes format="gpt-ckpt", version=1, step, n_layer, n_head, d_model, n_ctx,
 *   vocab_size (int64); /model/<name> float32 datasets of the unsharded parameters;
 *   optionally /optim/m/<name>, /optim/v/<name> and attribute t on /optim.
 * Writes go to a temporary file in the same directory that replaces the target by
 * rename on commit, so a crash never leaves a half-written checkpoint at the path.
 * Reads take a hyperslab, so a rank can load just its shard. Every failure returns an
 * error as one line naming the file and the dataset or attribute; HDF5's own error
 * stack is never printed. */
#ifndef GPTC_CHECKPOINT_H
#define GPTC_CHECKPOINT_H

#include <stddef.h>

typedef struct {
    long step, n_layer, n_head, d_model, n_ctx, vocab_size;
} ckpt_meta;

typedef struct ckpt_file ckpt_file;

/* For a program's main, before any other HDF5 call (MPI_Init may come first): keeps HDF5
 * from closing at exit what is still open. HDF5 1.10 keeps a file whose close failed (a
 * full disk) in its table half torn down, and its exit handler then crashes on it: a
 * signal and a stack after gptc's one-line error. Every file is closed explicitly, so the
 * handler has nothing to save. */
void ckpt_library_init(void);

/* Starts a checkpoint that will replace path on ckpt_commit. */
ckpt_file *ckpt_create(const char *path, const ckpt_meta *meta, char *err, size_t errlen);
/* group is "model", "optim/m" or "optim/v"; data holds the whole tensor, row-major. */
int ckpt_write(ckpt_file *f, const char *group, const char *name, int ndim,
               const long *shape /* [ndim] */, const float *data, char *err, size_t errlen);
/* Writes the hyperslab [start, start+count) of group/name, creating the dataset with
 * the full shape first if it is not there yet (for writers that hold one shard). */
int ckpt_write_slab(ckpt_file *f, const char *group, const char *name, int ndim,
                    const long *shape /* [ndim] */, const long *start /* [ndim] */,
                    const long *count /* [ndim] */, const float *data, char *err, size_t errlen);
int ckpt_set_optim_t(ckpt_file *f, long t, char *err, size_t errlen);
/* Flushes, closes and renames into place. Frees f whatever the outcome. */
int ckpt_commit(ckpt_file *f, char *err, size_t errlen);
/* Drops an unfinished checkpoint and its temporary file. */
void ckpt_abort(ckpt_file *f);

/* Opens and checks the root attributes (format, version <= 1, model shape) and /optim:
 * *has_optim = 1 and *optim_t = its attribute t when it is there; /optim without t, or
 * with t < 0, is refused. has_optim and optim_t may be NULL. */
ckpt_file *ckpt_open(const char *path, ckpt_meta *meta, int *has_optim, long *optim_t,
                     char *err, size_t errlen);
/* Reads the hyperslab [start, start+count) of group/name into dst (row-major, packed).
 * The dataset must exist, be float32 and have exactly ndim dims of the given shape.
 * start/count NULL reads the whole tensor. Non-finite values are an error. */
int ckpt_read(ckpt_file *f, const char *group, const char *name, int ndim,
              const long *shape /* [ndim] */, const long *start /* [ndim] or NULL */,
              const long *count /* [ndim] or NULL */, float *dst, char *err, size_t errlen);
/* How many entries of group (e.g. "model") have none of the n names known[]; the first
 * of them into first[first_len] (empty when none); 0 when there is no such group. For
 * saying what a load leaves out. -1 with err when a read of the file failed. */
int ckpt_count_unknown(ckpt_file *f, const char *group, const char *const *known, int n,
                       char *first, size_t first_len, char *err, size_t errlen);
/* The path f was opened or created with, as its messages name it. */
const char *ckpt_file_path(const ckpt_file *f);
void ckpt_close(ckpt_file *f);

#endif
