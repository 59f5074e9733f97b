#include "layers/gpt_checkpoint.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *GROUPS[3] = {"model", "optim/m", "optim/v"};

static float *device_buffer(const gpt_model *m, int which) {
    return which == 0 ? m->params : which == 1 ? m->opt_m : m->opt_v;
}

int gpt_save(const gpt_model *m, const char *path, long step, int with_optim, long t,
             char *err, size_t errlen) {
    const gpt_shape *s = &m->shape;
    ckpt_meta meta = {step, s->n_layer, s->n_head, s->d_model, s->n_ctx, s->vocab_size};
    float *host = malloc(m->n_params * sizeof(float)); /* [n_params] staging copy */
    if (!host) {
        snprintf(err, errlen, "train.save %s: out of host memory", path);
        return -1;
    }
    ckpt_file *f = ckpt_create(path, &meta, err, errlen);
    if (!f) {
        free(host);
        return -1;
    }
    int rc = 0;
    for (int which = 0; which < (with_optim ? 3 : 1) && rc == 0; which++) {
        m->be->copy_to_host(host, device_buffer(m, which), m->n_params * sizeof(float), m->stream);
        m->be->synchronize(m->stream);
        for (int i = 0; i < m->n_tensors && rc == 0; i++) {
            const param_tensor *p = &m->tensors[i];
            /* wte's padded rows are not part of the model: shape[] stops at vocab_size */
            rc = ckpt_write(f, GROUPS[which], p->name, p->ndim, p->shape, host + p->offset,
                            err, errlen);
        }
    }
    if (rc == 0 && with_optim) rc = ckpt_set_optim_t(f, t, err, errlen);
    free(host);
    if (rc != 0) {
        ckpt_abort(f);
        return -1;
    }
    return ckpt_commit(f, err, errlen);
}

int gpt_load(gpt_model *m, ckpt_file *f, int load_optim, char *err, size_t errlen) {
    float *host = calloc(m->n_params, sizeof(float)); /* [n_params], padded rows stay 0 */
    if (!host) {
        snprintf(err, errlen, "out of host memory loading a checkpoint");
        return -1;
    }
    int rc = 0;
    for (int which = 0; which < (load_optim ? 3 : 1) && rc == 0; which++) {
        for (int i = 0; i < m->n_tensors && rc == 0; i++) {
            const param_tensor *p = &m->tensors[i];
            rc = ckpt_read(f, GROUPS[which], p->name, p->ndim, p->shape, NULL, NULL,
                           host + p->offset, err, errlen);
        }
        if (rc == 0)
            m->be->copy_from_host(device_buffer(m, which), host, m->n_params * sizeof(float),
                                  m->stream);
    }
    m->be->synchronize(m->stream);
    free(host);
    return rc;
}
