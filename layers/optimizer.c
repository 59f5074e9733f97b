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

double optim_step(gpt_model *m, const optim_config *c, double grad_norm, long t, double lr) {
    double coef = 1.0;
    if (c->grad_clip > 0) {
        coef = c->grad_clip / (grad_norm + 1e-6);
        if (coef < 1.0) m->be->scale(m->grads, (float)coef, m->n_params, m->stream);
        else coef = 1.0;
    }
    float bc1 = (float)(1.0 - pow(c->beta1, (double)t));
    float bc2 = (float)(1.0 - pow(c->beta2, (double)t));
    for (int i = 0; i < m->n_tensors; i++) {
        const param_tensor *p = &m->tensors[i];
        float decay = p->decay ? (float)c->weight_decay : 0.0f;
        m->be->adamw(m->params + p->offset, m->grads + p->offset, m->opt_m + p->offset,
                     m->opt_v + p->offset, p->numel, (float)lr, (float)c->beta1,
                     (float)c->beta2, (float)c->eps, decay, bc1, bc2, m->stream);
    }
    return coef;
}
