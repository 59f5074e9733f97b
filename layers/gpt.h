/* GPT-2 written once against the backend op table (engine/backend.h).
 *
 * Memory follows llm.c: one allocation for all parameters, one for their gradients (the
 * same layout), one for the optimizer moments and one for the activations of a
 * micro-batch; every tensor is a view into these. Tensors are laid out in bucket order,
 * the order in which backward finishes their gradients (DESIGN section 1): ln_f, then
 * layers from last to first, then wpe and wte (whose gradient completes last, in the
 * embedding backward). */
#ifndef GPTC_GPT_H
#define GPTC_GPT_H

#include <stddef.h>
#include <stdint.h>

#include "engine/backend.h"

typedef struct {
    int n_layer, n_head, d_model, n_ctx, vocab_size;
    int vocab_padded; /* vocab rounded up to a multiple of 128 */
} gpt_shape;

typedef enum { INIT_NORMAL, INIT_RESIDUAL, INIT_ZERO, INIT_ONE } init_kind;

/* One parameter tensor: its checkpoint name and unsharded shape, and where it lives. */
typedef struct {
    char name[48];
    int ndim;
    long shape[2];     /* as in the checkpoint; wte is [vocab_size, C] */
    size_t offset;     /* in floats, into params / grads / m / v */
    size_t numel;      /* stored elements (wte holds vocab_padded rows) */
    int decay;         /* weight decay applies (tensors of 2 or more dims) */
    init_kind init;
} param_tensor;

typedef struct {
    float *ln1w, *ln1b;         /* [C], [C] */
    float *qkvw, *qkvb;         /* [C,3C], [3C] */
    float *attprojw, *attprojb; /* [C,C], [C] */
    float *ln2w, *ln2b;         /* [C], [C] */
    float *fcw, *fcb;           /* [C,4C], [4C] */
    float *fcprojw, *fcprojb;   /* [4C,C], [C] */
} block_views;

typedef struct {
    float *wte;                 /* [Vp,C], rows >= vocab_size stay zero */
    float *wpe;                 /* [n_ctx,C] */
    float *lnfw, *lnfb;         /* [C], [C] */
    block_views *h;             /* [n_layer] */
} param_views;

/* Activations of one layer for one micro-batch of N = B*T rows. */
typedef struct {
    float *ln1;               /* [N,C] */
    float *ln1_mean, *ln1_rstd; /* [N], [N] */
    float *qkv;               /* [N,3C] */
    float *att;               /* [B,NH,T,T] softmax probabilities */
    float *atty;              /* [N,C] attention output before c_proj */
    float *res2;              /* [N,C] residual after attention */
    float *ln2;               /* [N,C] */
    float *ln2_mean, *ln2_rstd; /* [N], [N] */
    float *fch;               /* [N,4C] c_fc output, pre-GELU */
    float *fch_gelu;          /* [N,4C] */
    float *res3;              /* [N,C] residual after the MLP: the layer's output */
} layer_acts;

typedef struct {
    float *encoded;             /* [N,C] token + position embeddings */
    layer_acts *layer;          /* [n_layer] */
    float *lnf;                 /* [N,C] */
    float *lnf_mean, *lnf_rstd; /* [N], [N] */
    float *logits;              /* [N,Vp], overwritten by dlogits in the loss */
    float *losses;              /* [N] per-position loss */
    /* backward scratch, reused by every layer */
    float *dres;                /* [N,C] gradient of the residual stream */
    float *dbtc;                /* [N,C] */
    float *dqkv;                /* [N,3C] */
    float *datt;                /* [B,NH,T,T] */
    float *dfch;                /* [N,4C] */
    int32_t *tokens, *targets;  /* [N], [N] on the device */
} act_views;

typedef struct {
    gpt_shape shape;
    const gptc_backend *be;
    gptc_stream *stream;

    int n_tensors;
    param_tensor *tensors;      /* [n_tensors] in buffer order */
    size_t n_params;            /* floats in each of params, grads, m, v */
    float *params, *grads;      /* [n_params] each */
    float *opt_m, *opt_v;       /* [n_params] each, views of one allocation */
    param_views p, g;           /* views into params and grads */

    int B, T;                   /* micro-batch rows and sequence length of acts */
    float *act_memory;
    size_t act_floats;
    act_views a;
} gpt_model;

/* Checks a model shape; returns 0 or -1 with a one-line error naming the model key. */
int gpt_check_shape(const gpt_shape *s, char *err, size_t errlen);
/* Allocates parameters, gradients, optimizer state and activations for micro-batches
 * of B rows of T tokens. Parameters start at zero; call gpt_init_random or load them. */
int gpt_create(gpt_model *m, const gpt_shape *shape, int B, int T, const gptc_backend *be,
               char *err, size_t errlen);
void gpt_destroy(gpt_model *m);
/* GPT-2 init (DESIGN section 3), a pure function of (seed, name, element index). */
void gpt_init_random(gpt_model *m, uint64_t seed);
const param_tensor *gpt_find_tensor(const gpt_model *m, const char *name);

/* Forward of one micro-batch: tokens and targets are host arrays [B*T]. Computes the
 * per-position losses and, in the same pass, dlogits scaled by dloss (the weight of one
 * position in the global mean). Returns the sum of the micro-batch's losses. */
double gpt_forward(gpt_model *m, const int32_t *tokens, const int32_t *targets, float dloss);
/* Backward of the micro-batch last run forward; gradients accumulate (+=). */
void gpt_backward(gpt_model *m);

#endif
