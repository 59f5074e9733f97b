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
    const grad_bucket *bk = &m->buckets[b];
    int shards = m->place.shards > 0 ? m->place.shards : 1;
    size_t piece = bk->count / (size_t)shards;
    *lo = bk->offset + (size_t)shard_rank * piece;
    *hi = *lo + piece;
    *state = bk->offset / (size_t)shards; /* the pieces of earlier buckets come first */
}

/* [lo, hi) of tensor t that falls in [a, b); returns 0 if empty */
static int overlap(const param_tensor *t, size_t a, size_t b, size_t *lo, size_t *hi) {
    *lo = t->offset > a ? t->offset : a;
    *hi = t->offset + t->numel < b ? t->offset + t->numel : b;
    return *lo < *hi;
}

/* AdamW over params [lo, hi), one call; state: where lo's optimizer state lies */
static void adamw_run(gpt_model *m, const optim_config *c, size_t lo, size_t hi, size_t state,
                      float decay, double coef, double lr, float bc1, float bc2) {
    m->be->adamw(m->params + lo,
                 m->params_act == m->params ? NULL : gptc_act_at(m->params_act, lo, m->prec),
                 m->grads + lo, (float)coef, m->opt_m + state, m->opt_v + state, hi - lo,
                 (float)lr, (float)c->beta1, (float)c->beta2, (float)c->eps, decay, bc1, bc2,
                 m->stream);
}

double optim_step(gpt_model *m, const optim_config *c, double grad_norm, long t, double lr,
                  int shard_rank) {
    double coef = 1.0;
    if (c->grad_clip > 0) {
        coef = c->grad_clip / (grad_norm + 1e-6);
        if (coef > 1.0) coef = 1.0;
    }
    float bc1 = (float)(1.0 - pow(c->beta1, (double)t));
    float bc2 = (float)(1.0 - pow(c->beta2, (double)t));
    for (int b = 0; b < m->n_buckets; b++) {
        size_t a, z, state;
        optim_piece(m, b, shard_rank, &a, &z, &state);
        const grad_bucket *bk = &m->buckets[b];
        /* adjacent tensors with the same decay are one call: the update is elementwise, so
         * only the number of launches changes (GPT-2 124M: 148 tensors, 98 runs). The
         * piece's optimizer state starts at state, element a. */
        size_t run_lo = 0, run_hi = 0; /* the run not yet updated */
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
            if (run_hi > run_lo)
                adamw_run(m, c, run_lo, run_hi, state + (run_lo - a), run_decay, coef, lr, bc1,
                          bc2);
            run_lo = lo, run_hi = hi, run_decay = decay;
        }
        if (run_hi > run_lo)
            adamw_run(m, c, run_lo, run_hi, state + (run_lo - a), run_decay, coef, lr, bc1, bc2);
    }
    return coef;
}
