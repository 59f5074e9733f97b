/* Checkpoints hold unsharded tensors; a rank reads and writes only the hyperslabs of its
 * shards (parallel/tensor.h), so any layout loads what any other layout wrote. */
#include "layers/gpt_checkpoint.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/log.h"
#include "engine/watchdog.h"
#include "parallel/comm.h"

static const char *GROUPS[3] = {"model", "optim/m", "optim/v"};


/* Copies a packed block [rows, w] to or from its columns [col, col+w) of a shard with
 * local_cols columns. */
static void copy_block(float *shard, long local_cols, float *packed, long rows, long w,
                       long col, int to_shard) {
    for (long i = 0; i < rows; i++) {
        float *a = shard + i * local_cols + col, *b = packed + i * w;
        memcpy(to_shard ? a : b, to_shard ? b : a, (size_t)w * sizeof(float));
    }
}

/* Hyperslab arguments of a block in the checkpoint's own rank (1-D tensors use dim 1). */
static void slab_args(const param_tensor *t, const shard_block *b, long start[2], long count[2]) {
    if (t->ndim == 2) {
        start[0] = b->start[0]; start[1] = b->start[1];
        count[0] = b->count[0]; count[1] = b->count[1];
    } else {
        start[0] = b->start[1];
        count[0] = b->count[1];
    }
}

/* Reads (to_shard) or writes this rank's shard of tensor t of one group. */
static int move_tensor(const gpt_model *m, const param_tensor *t, ckpt_file *f, const char *group,
                       float *local /* [t->local_rows, t->local_cols] this rank's shard */,
                       int reading, char *err, size_t errlen) {
    shard_block blocks[3];
    int nb = tp_shard_blocks(t->shard, t->rows, t->cols, t->padded_rows, m->tp.size, m->tp.rank, blocks);
    int rc = 0;
    for (int i = 0; i < nb && rc == 0; i++) {
        long start[2], count[2];
        slab_args(t, &blocks[i], start, count);
        long rows = blocks[i].count[0], w = blocks[i].count[1];
        float *packed = malloc((size_t)(rows * w) * sizeof(float)); /* [rows, w] */
        if (!packed) {
            snprintf(err, errlen, "%s: out of host memory for %s", f ? ckpt_file_path(f) : "checkpoint",
                     t->name);
            return -1;
        }
        if (reading) {
            rc = ckpt_read(f, group, t->name, t->ndim, t->shape, start, count, packed, err, errlen);
            if (rc == 0) copy_block(local, t->local_cols, packed, rows, w, blocks[i].local_col, 1);
        } else {
            copy_block(local, t->local_cols, packed, rows, w, blocks[i].local_col, 0);
            rc = ckpt_write_slab(f, group, t->name, t->ndim, t->shape, start, count, packed, err,
                                 errlen);
        }
        free(packed);
    }
    return rc;
}

/* One rank's contribution to one tensor, as sent to the writer: a header of nb blocks
 * (start and count of each, in the checkpoint's dims) followed by their packed floats. */
typedef struct {
    int nb, ndim;
    long start[3][2], count[3][2];
} slab_header;

static size_t pack_tensor(const gpt_model *m, const param_tensor *t,
                          const float *local /* [t->local_rows, t->local_cols]; NULL with t */,
                          int writer, char **out) {
    slab_header h;
    memset(&h, 0, sizeof(h));
    shard_block blocks[3];
    /* one copy of each element: replicated tensors from TP rank 0, wte from the first stage */
    writer = writer && t && (!t->replicated || m->tp.rank == 0) &&
             !(m->tied_copy && strcmp(t->name, "wte") == 0);
    h.ndim = t ? t->ndim : 0;
    h.nb = writer ? tp_shard_blocks(t->shard, t->rows, t->cols, t->padded_rows, m->tp.size,
                                    m->tp.rank, blocks) : 0;
    size_t floats = 0;
    for (int i = 0; i < h.nb; i++) {
        slab_args(t, &blocks[i], h.start[i], h.count[i]);
        floats += (size_t)(blocks[i].count[0] * blocks[i].count[1]);
    }
    size_t bytes = sizeof(h) + floats * sizeof(float);
    /* [bytes]: the header, then the packed blocks */
    char *buf = log_calloc(bytes, 1, "a checkpoint's packed tensor");
    memcpy(buf, &h, sizeof(h));
    float *data = (float *)(buf + sizeof(h));
    for (int i = 0; i < h.nb; i++) {
        long rows = blocks[i].count[0], w = blocks[i].count[1];
        copy_block((float *)local, t->local_cols, data, rows, w, blocks[i].local_col, 0);
        data += rows * w;
    }
    *out = buf;
    return bytes;
}

static int write_packed(ckpt_file *f, const char *group, const param_tensor *t, const char *buf,
                        char *err, size_t errlen) {
    slab_header h;
    memcpy(&h, buf, sizeof(h));
    const float *data = (const float *)(buf + sizeof(h));
    for (int i = 0; i < h.nb; i++) {
        if (ckpt_write_slab(f, group, t->name, t->ndim, t->shape, h.start[i], h.count[i], data,
                            err, errlen) != 0)
            return -1;
        data += h.count[i][0] * (h.ndim == 2 ? h.count[i][1] : 1);
    }
    return 0;
}

/* take of comm_gather_host: rank 0 writes one rank's packed slabs */
typedef struct {
    ckpt_file *f;
    const char *group;
    const param_tensor *full;
    char *err;
    size_t errlen;
} slab_writer;

static int write_rank(int rank, const void *bytes, size_t n, void *arg) {
    const slab_writer *w = arg;
    (void)rank, (void)n;
    return write_packed(w->f, w->group, w->full, bytes, w->err, w->errlen);
}

/* Gathers every writer's slabs of one tensor on rank 0 of world, which writes them, one
 * rank's at a time and in pieces (comm_gather_host): a slab past 2 GiB, or slabs past it
 * together, overflowed one MPI_Gatherv's int counts and displacements (a 12288-wide
 * embedding at tp 8). full names the tensor and its unsharded shape; t is this rank's
 * copy, or NULL. */
static int gather_and_write(const gpt_model *m, comm_group *world, ckpt_file *f,
                            const char *group, const param_tensor *full, const param_tensor *t,
                            const float *local /* [t->local_rows, t->local_cols]; NULL with t */,
                            int writer, char *err, size_t errlen) {
    char *mine; /* [bytes] */
    size_t bytes = pack_tensor(m, t, local, writer, &mine);
    slab_writer w = {f, group, full, err, errlen};
    int rc = world ? comm_gather_host(world, mine, bytes, write_rank, &w)
                   : write_rank(0, mine, bytes, &w);
    free(mine);
    return rc;
}

/* The lowest rank of world whose own part failed (failed set), or -1 when none did:
 * collective, so that every rank stops at the same tensor and one rank says why */
static int lowest_failed(comm_group *world, int failed) {
    if (!world || world->size == 1) return failed ? 0 : -1;
    int worst = comm_max_int(world, failed ? world->size - world->rank : 0);
    return worst > 0 ? world->size - worst : -1;
}

/* Test-only: GPTC_TEST_SAVE_NO_MEMORY = r makes rank r's staging copy fail as out of
 * memory would, so that a test can see a rank other than the writer fail its part */
static int test_no_staging(int rank) {
    const char *v = getenv("GPTC_TEST_SAVE_NO_MEMORY");
    return v && atoi(v) == rank;
}

int gpt_save(const gpt_model *m, comm_group *world, int writer, const char *path, long step,
             const float *opt_m, const float *opt_v, long t, int *failed_rank, char *err,
             size_t errlen) {
    int with_optim = t > 0;
    const gpt_shape *s = &m->shape;
    ckpt_meta meta = {step, s->n_layer, s->n_head, s->d_model, s->n_ctx, s->vocab_size};
    int rank = world ? world->rank : 0;
    /* [n_params] staging copy, on the writers: the others send nothing */
    float *host = writer && !test_no_staging(rank) ? malloc(m->n_params * sizeof(float)) : NULL;
    int n_full = 0;
    param_tensor *full = gpt_full_table(s, &n_full); /* [n_full]: every rank walks all tensors */
    ckpt_file *f = NULL;
    int sources = !writer || (host && (!with_optim || (opt_m && opt_v)));
    int failed = !full || !sources; /* this rank's own part */
    if (failed) snprintf(err, errlen, "%s: out of host memory", path);
    if (!failed && rank == 0) {
        f = ckpt_create(path, &meta, err, errlen);
        failed = !f;
    }
    int who = lowest_failed(world, failed);
    for (int which = 0; which < (with_optim ? 3 : 1) && who < 0; which++) {
        const float *src = which == 1 ? opt_m : which == 2 ? opt_v : host; /* NULL: no writer */
        if (which == 0 && host) {
            m->be->copy_to_host(host, m->params, m->n_params * sizeof(float), m->stream);
            m->be->synchronize(m->stream);
        }
        for (int i = 0; i < n_full && who < 0; i++) {
            watchdog_beat(); /* a big model's save takes a while, tensor by tensor */
            /* and every rank waits while rank 0 writes one (a 2 GB embedding: 100 s at a
             * slow disk's rate), which the beat above no longer covers */
            watchdog_hold(watchdog_io_s((double)full[i].rows * full[i].cols * sizeof(float)));
            const param_tensor *t = gpt_find_tensor(m, full[i].name);
            failed = gather_and_write(m, world, f, GROUPS[which], &full[i], t,
                                      t && src ? src + t->offset : NULL, writer, err,
                                      errlen) != 0;
            who = lowest_failed(world, failed);
        }
    }
    if (who < 0 && rank == 0 && with_optim) failed = ckpt_set_optim_t(f, t, err, errlen) != 0;
    /* rank 0's flush, fsync and rename take a while on a slow disk, and every rank waits */
    double bytes = 0;
    for (int i = 0; full && i < n_full; i++) bytes += (double)full[i].rows * full[i].cols * sizeof(float);
    watchdog_hold(watchdog_io_s(bytes * (with_optim ? 3 : 1)));
    if (rank == 0 && f) {
        if (who < 0 && !failed) failed = ckpt_commit(f, err, errlen) != 0;
        else ckpt_abort(f);
    }
    who = lowest_failed(world, failed);
    /* the failing rank says why (trainer.c lets it speak alone); the others name it */
    if (who >= 0 && !failed) snprintf(err, errlen, "%s: rank %d could not save its part", path, who);
    if (failed_rank) *failed_rank = who;
    free(host);
    free(full);
    return who >= 0 ? -1 : 0;
}

int gpt_load(gpt_model *m, ckpt_file *f, const gpt_moments *moments, long t_optim, char *err,
             size_t errlen) {
    /* [n_params], the parameters, then each moment; padding stays 0 */
    float *host = calloc(m->n_params, sizeof(float));
    if (!host) {
        snprintf(err, errlen, "%s: out of host memory for its %zu parameters", ckpt_file_path(f),
                 m->n_params);
        return -1;
    }
    int rc = 0;
    for (int which = 0; which < (moments ? 3 : 1) && rc == 0; which++) {
        for (int i = 0; i < m->n_tensors && rc == 0; i++) {
            const param_tensor *t = &m->tensors[i];
            if (which > 0 && !moments->wants(t->offset, t->numel, moments->arg)) {
                memset(host + t->offset, 0, t->numel * sizeof(float)); /* not the parameters */
                continue;
            }
            watchdog_beat();
            /* one large tensor's read (a vocabulary's embedding on a slow disk) is no hang:
             * held for its full size (a TP shard's rows may be strided through all of it) */
            watchdog_hold(watchdog_io_s((double)t->rows * t->cols * sizeof(float)));
            watchdog_test_slow_read();
            rc = move_tensor(m, t, f, GROUPS[which], host + t->offset, 1, err, errlen);
            /* a second moment is a mean of squares: a negative one would make the first
             * update's square root NaN */
            for (size_t k = 0; rc == 0 && which == 2 && k < t->numel; k++)
                if (!(host[t->offset + k] >= 0.0f)) {
                    snprintf(err, errlen, "%s: /optim/v/%s holds a negative value (%g)",
                             ckpt_file_path(f), t->name, (double)host[t->offset + k]);
                    rc = -1;
                }
            /* moments come from updates: after none (t = 0) they are zero; any others would
             * be taken for one update's, scaled by the bias correction's 1 / (1 - beta) */
            for (size_t k = 0; rc == 0 && which > 0 && t_optim == 0 && k < t->numel; k++)
                if (host[t->offset + k] != 0.0f) {
                    snprintf(err, errlen, "%s: /optim/%s/%s holds %g, but /optim attribute "
                             "t = 0 says no update was taken (delete /optim to start the "
                             "optimizer afresh)", ckpt_file_path(f), GROUPS[which] + 6,
                             t->name, (double)host[t->offset + k]);
                    rc = -1;
                }
        }
        if (rc == 0 && which == 0)
            m->be->copy_from_host(m->params, host, m->n_params * sizeof(float), m->stream);
        if (rc == 0 && which > 0) moments->keep(host, which - 1, moments->arg);
    }
    if (rc == 0) gpt_params_changed(m);
    m->be->synchronize(m->stream);
    free(host);
    return rc;
}
