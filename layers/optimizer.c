#include "layers/optimizer.h"

#include <math.h>

static const double PI = 3.14159265358979323846;

double lr_at_step(const optim_config *c, long step) {
    if (c->warmup_steps > 0 && step <= c->warmup_steps)
        return c->lr * (double)step / (double)c->warmup_steps;
    if (!c->cosine) return c->lr;
    long span = c->total_steps - c->warmup_steps;
    double progress = (double)(step - c->warmup_steps) / (double)(span > 1 ? span : 1);
    if (progress > 1.0) progress = 1.0;
    return c->min_lr + 0.5 * (c->lr - c->min_lr) * (1.0 + cos(PI * progress));
}

void optim_piece(const gpt_model *m, int b, int shard_rank, size_t *lo, size_t *hi,
                 size_t *state) {
    int shards = m->place.shards > 0 ? m->place.shards : 1;
    gpt_bucket_piece(m, b, shard_rank, lo, hi);
    *state = m->buckets[b].offset / (size_t)shards; /* the pieces of earlier buckets come first */
}

/* [lo, hi) of tensor t that falls in [a, b); returns 0 if empty */
static int overlap(const param_tensor *t, size_t a, size_t b, size_t *lo, size_t *hi) {
    *lo = t->offset > a ? t->offset : a;
    *hi = t->offset + t->numel < b ? t->offset + t->numel : b;
    return *lo < *hi;
}

/* The AdamW pieces of a step, handed to the backend a batch at a time: GPT-2 124M has 98
 * runs of tensors of one decay, so a batch holds a small model's step whole */
#define OPTIM_BATCH 128

typedef struct {
    gpt_model *m;
    gptc_adamw_step h;
    gptc_adamw_piece piece[OPTIM_BATCH];
    int n;
} adamw_batch;

static void adamw_flush(adamw_batch *b) {
    if (b->n > 0) b->m->be->adamw(b->piece, b->n, &b->h, b->m->stream);
    b->n = 0;
}

/* params [lo, hi) at one decay into the batch; state: where lo's optimizer state lies */
static void adamw_add(adamw_batch *b, size_t lo, size_t hi, size_t state, float decay) {
    gpt_model *m = b->m;
    if (b->n == OPTIM_BATCH) adamw_flush(b);
    b->piece[b->n++] = (gptc_adamw_piece){
        .p = m->params + lo,
        .p_act = m->params_act == m->params ? NULL : gptc_act_at(m->params_act, lo, m->prec),
        .g = m->grads + lo,
        .m = m->opt_m + state,
        .v = m->opt_v + state,
        .n = hi - lo,
        .decay = decay};
}

double optim_step(gpt_model *m, const optim_config *c, double grad_norm, long t, double lr,
                  int shard_rank) {
    double coef = 1.0;
    if (c->grad_clip > 0) {
        coef = c->grad_clip / (grad_norm + 1e-6);
        if (coef > 1.0) coef = 1.0;
    }
    adamw_batch b; /* about 7 KiB */
    b.m = m, b.n = 0;
    b.h = (gptc_adamw_step){.gscale = (float)coef,
                            .lr = (float)lr,
                            .beta1 = (float)c->beta1,
                            .beta2 = (float)c->beta2,
                            .eps = (float)c->eps,
                            .bc1 = (float)(1.0 - pow(c->beta1, (double)t)),
                            .bc2 = (float)(1.0 - pow(c->beta2, (double)t))};
    for (int bi = 0; bi < m->n_buckets; bi++) {
        size_t a, z, state;
        optim_piece(m, bi, shard_rank, &a, &z, &state);
        const grad_bucket *bk = &m->buckets[bi];
        /* adjacent tensors with the same decay are one piece: the update is elementwise.
         * The piece's optimizer state starts at state, element a. */
        size_t run_lo = 0, run_hi = 0; /* the run not yet added */
        float run_decay = 0.0f;
        for (int i = bk->first_tensor; i < bk->first_tensor + bk->n_tensors; i++) {
            const param_tensor *p = &m->tensors[i];
            size_t lo, hi;
            if (!overlap(p, a, z, &lo, &hi)) continue;
            float decay = p->decay ? (float)c->weight_decay : 0.0f;
            if (lo == run_hi && run_hi > run_lo && decay == run_decay) {
                run_hi = hi;
                continue;
            }
            if (run_hi > run_lo) adamw_add(&b, run_lo, run_hi, state + (run_lo - a), run_decay);
            run_lo = lo, run_hi = hi, run_decay = decay;
        }
        if (run_hi > run_lo) adamw_add(&b, run_lo, run_hi, state + (run_lo - a), run_decay);
    }
    adamw_flush(&b);
    return coef;
}
