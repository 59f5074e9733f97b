/* The flat buffers' bucket layout (layers/gpt.c, cut_buckets): every tensor in one bucket,
 * buckets back to back, and with sharded optimizer state (ZeRO-1) every bucket a whole
 * number of shards pieces of 64 floats, so that pieces and the tensors after them stay on
 * 256 bytes whatever the DP size (a bucket padded to a multiple of 3 alone put every later
 * tensor at an odd offset, off the GPU's vector loads and fused epilogues). */
#include <stdio.h>

#include "engine/backend.h"
#include "layers/gpt.h"
#include "tests/check.h"

/* Checks m's layout for shards pieces a bucket; returns how many buckets it has. */
static int check_layout(const gpt_model *m, int shards, const char *what) {
    size_t end = 0, tensor_end = 0; /* where the last bucket and the last tensor ended */
    int next_tensor = 0;
    for (int b = 0; b < m->n_buckets; b++) {
        const grad_bucket *bk = &m->buckets[b];
        check(bk->offset == end, "%s: bucket %d at %zu, not where the last ended (%zu)", what, b,
              bk->offset, end);
        /* each tensor in exactly one bucket: a tensor in two would be reduced twice */
        check(bk->first_tensor == next_tensor && bk->n_tensors >= 1,
              "%s: bucket %d holds tensors %d..%d, not from %d on", what, b, bk->first_tensor,
              bk->first_tensor + bk->n_tensors - 1, next_tensor);
        next_tensor = bk->first_tensor + bk->n_tensors;
        if (shards > 1)
            check(bk->count % ((size_t)shards * 64) == 0,
                  "%s: bucket %d of %zu floats, not whole pieces of 64 for %d shards", what, b,
                  bk->count, shards);
        for (int i = bk->first_tensor; i < bk->first_tensor + bk->n_tensors; i++) {
            const param_tensor *t = &m->tensors[i];
            check(t->offset >= bk->offset && t->offset + t->numel <= bk->offset + bk->count,
                  "%s: %s outside bucket %d", what, t->name, b);
            /* every size of this shape is a multiple of 8 floats: so must every offset be */
            check(t->offset % 8 == 0, "%s: %s at offset %zu, off 32 bytes", what, t->name,
                  t->offset);
            /* buffer order: two tensors sharing floats would sum each other's gradients */
            check(t->offset >= tensor_end, "%s: %s at %zu overlaps the tensor before (ends %zu)",
                  what, t->name, t->offset, tensor_end);
            tensor_end = t->offset + t->numel;
        }
        end = bk->offset + bk->count;
    }
    check(end == m->n_params, "%s: buckets end at %zu of %zu floats", what, end, m->n_params);
    check(next_tensor == m->n_tensors, "%s: buckets hold %d of %d tensors", what, next_tensor,
          m->n_tensors);
    check(m->n_opt * (size_t)(shards > 1 ? shards : 1) == m->n_params,
          "%s: optimizer state of %zu floats for %zu parameters over %d shards", what, m->n_opt,
          m->n_params, shards);
    return m->n_buckets;
}

int main(void) {
    const gptc_backend *be = cpu_backend();
    if (!be) return 1;
    /* d_model 200: ln_f's 400 floats are not a multiple of 3, 5 or 7 */
    gpt_shape s = {.n_layer = 2, .n_head = 4, .d_model = 200, .n_ctx = 16, .vocab_size = 100};
    tp_context one = {.size = 1};
    const int shard_counts[] = {1, 2, 3, 5, 7, 8};
    for (size_t k = 0; k < sizeof shard_counts / sizeof shard_counts[0]; k++) {
        int shards = shard_counts[k];
        gpt_placement place = {.pp = 1, .v = 1, .bucket_floats = 30000, .shards = shards};
        gpt_model m;
        char err[256], what[32];
        snprintf(what, sizeof what, "%d shard(s)", shards);
        if (gpt_create(&m, &s, 1, 16, 1, be, &one, &place, err, sizeof err) != 0) {
            check(0, "%s: gpt_create: %s", what, err);
            continue;
        }
        int n = check_layout(&m, shards, what);
        check(n >= 4, "%s: %d buckets, too few to test their boundaries", what, n);
        printf("%s: %d buckets, %zu floats (%zu of padding): %s\n", what, n, m.n_params,
               m.n_params - (size_t)(2 * (12 * 200 * 200 + 13 * 200) + 2 * 200 + 16 * 200 +
                                     128 * 200),
               failures ? "FAILED" : "ok");
        gpt_destroy(&m);
    }
    return failures != 0;
}
