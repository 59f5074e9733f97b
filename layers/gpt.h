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
#include "parallel/tensor.h"

typedef struct {
    int n_layer, n_head, d_model, n_ctx, vocab_size;
    int vocab_padded; /* vocab rounded up to a multiple of 128 * tp */
} gpt_shape;

typedef enum { INIT_NORMAL, INIT_RESIDUAL, INIT_ZERO, INIT_ONE } init_kind;

/* One parameter tensor: its checkpoint name and unsharded shape, this rank's shard of
 * it, and where that shard lives. */
typedef struct {
    char name[48];
    int ndim;
    long shape[2];     /* as in the checkpoint; wte is [vocab_size, C] */
    long rows, cols;   /* the unsharded tensor as a matrix (1-D: rows = 1) */
    long padded_rows;  /* rows including vocabulary padding (wte), else rows */
    shard_kind shard;
    long local_rows, local_cols; /* this rank's shard */
    size_t offset;     /* in floats, into params / grads / m / v */
    size_t numel;      /* local_rows * local_cols */
    int decay;         /* weight decay applies (tensors of 2 or more dims) */
    int replicated;    /* the same values on every TP rank: counted once in the norm */
    init_kind init;
} param_tensor;

/* Views of one flat buffer in parameter layout: the parameter copy compute reads (act,
 * gpt_model.p) or the gradients (fp32, gpt_model.g). Shapes are this rank's shards;
 * tp = 1 gives the full GPT-2 shapes. */
typedef struct {
    void *ln1w, *ln1b;         /* [C], [C] */
    void *qkvw, *qkvb;         /* [C,3C/tp], [3C/tp]: this rank's heads of q | k | v */
    void *attprojw, *attprojb; /* [C/tp,C], [C] */
    void *ln2w, *ln2b;         /* [C], [C] */
    void *fcw, *fcb;           /* [C,4C/tp], [4C/tp] */
    void *fcprojw, *fcprojb;   /* [4C/tp,C], [C] */
} block_views;

typedef struct {
    void *wte;                 /* [Vp/tp,C] this rank's vocab rows; rows >= vocab_size stay 0 */
    void *wpe;                 /* [n_ctx,C] */
    void *lnfw, *lnfb;         /* [C], [C] */
    block_views *h;            /* [n_layer] */
} param_views;

/* Activations of one layer for one micro-batch of N = B*T rows (Cl = C/tp, NHl = NH/tp).
 * gptc_act buffers hold the activation type (engine/backend.h), float ones fp32. */
typedef struct {
    gptc_act *ln1;              /* [N,C] */
    float *ln1_mean, *ln1_rstd; /* [Nl], [Nl] */
    gptc_act *qkv;              /* [N,3Cl] */
    float *att;                 /* [attention_state_floats(B,T,NHl)]: CPU [B,NHl,T,T] probabilities */
    gptc_act *atty;             /* [N,Cl] attention output before c_proj */
    gptc_act *res2;             /* [Nl,C] residual after attention (Nl = N/tp with sequence
                                 * parallelism, else N): this rank's rows */
    gptc_act *ln2;              /* [N,C] */
    float *ln2_mean, *ln2_rstd; /* [Nl], [Nl] */
    gptc_act *fch;              /* [N,4Cl] c_fc output, pre-GELU */
    gptc_act *fch_gelu;         /* [N,4Cl] */
    gptc_act *res3;             /* [Nl,C] residual after the MLP: the layer's output */
} layer_acts;

/* Activations of one micro-batch in flight through one model chunk (a run of layers).
 * A chunk holds several of these when the pipeline schedule keeps several micro-batches
 * in flight. */
typedef struct {
    gptc_act *input;            /* [N,C] the chunk's input: embeddings, or received; with
                                 * sequence parallelism a rank's rows sit at their place */
    gptc_act *grad;             /* [N,C] gradient of the chunk's output; backward turns it
                                 * into the gradient of the input, in place (same rows) */
    layer_acts *layer;          /* [layers of the chunk] */
    int32_t *tokens, *targets;  /* [N], [N] on the device (first / last stage) */
    /* last stage only */
    gptc_act *lnf;              /* [N,C] */
    float *lnf_mean, *lnf_rstd; /* [Nl], [Nl] */
    gptc_act *logits;           /* [N,Vp/tp], overwritten by dlogits in the loss */
    float *loss_max;            /* [N] row max of the logits over the whole vocab */
    float *loss_stats;          /* [2,N] sum of exp(logit - max) | target logit - max */
    float *losses;              /* [N] per-position loss */
} slot_acts;

/* A chunk: layers [first_layer, first_layer + n_layers) of the model, pipeline stage
 * `stage` of pp * virtual_stages. */
typedef struct {
    int stage, first_layer, n_layers;
    int has_embedding, has_head; /* first and last stage */
    int n_slots;                 /* micro-batches it can hold in flight */
    slot_acts *slots;            /* [n_slots] */
} chunk_info;

/* Scratch shared by every backward (one runs at a time). */
typedef struct {
    gptc_act *dbtc;             /* [N,C]; also the forward's row-parallel partial sums */
    gptc_act *dqkv;             /* [N,3Cl] */
    float *datt;                /* [attention_scratch_floats(B,T,Cl,NHl)] scratch */
    gptc_act *dfch;             /* [N,4Cl] */
} scratch_views;

/* Which part of the model this rank holds, and how its flat buffers are cut. */
typedef struct {
    int pp, pp_rank, v;         /* pipeline stages, this rank's stage, chunks per rank */
    const int *slots;           /* [v] micro-batches in flight per chunk; NULL: 1 each */
    size_t bucket_floats;       /* DP bucket size; 0: one bucket */
    int shards;                 /* buckets are padded to a multiple of this (the DP size
                                 * when the optimizer state is sharded, ZeRO-1), and the
                                 * optimizer state holds 1/shards of each bucket */
} gpt_placement;

/* A DP bucket: a run of whole tensors of the flat buffers, padded with zeros so that it
 * splits evenly into `shards` pieces. */
typedef struct {
    size_t offset, count;       /* floats; count includes the padding */
    int first_tensor, n_tensors;
} grad_bucket;

typedef struct {
    gpt_shape shape;
    const gptc_backend *be;
    gptc_stream *stream;
    tp_context tp;
    gpt_placement place;

    int n_tensors;
    param_tensor *tensors;      /* [n_tensors] this rank's tensors, in buffer order */
    gptc_precision prec;        /* the backend's: the activation type */
    size_t n_params;            /* floats in each of params, grads, m, v */
    float *params, *grads;      /* [n_params] each: the fp32 master parameters, gradients */
    gptc_act *params_act;       /* [n_params] act: the copy compute reads (params itself
                                 * under fp32), refreshed by the optimizer and
                                 * gpt_params_changed */
    float *opt_m, *opt_v;       /* [n_opt] each, views of one allocation: this rank's
                                 * shard of every bucket, in bucket order */
    size_t n_opt;               /* n_params / shards */
    int n_buckets;
    grad_bucket *buckets;       /* [n_buckets] in buffer order */
    param_views p, g;           /* views into params_act and grads (NULL where not held) */
    int tied_copy;              /* this rank's wte is the last stage's copy of the first's */

    int B, T;                   /* micro-batch rows and sequence length */
    int n_chunks;
    chunk_info *chunks;         /* [n_chunks] in local chunk order */
    scratch_views scratch;
    void *act_memory;           /* [act_bytes] every activation and scratch view points into it */
    size_t act_bytes;
    /* [n_micro][B*T] host copies of the losses (pinned on a GPU), copied in the stream's
     * order and read by gpt_loss_sum once the step's work has finished; loss_micro
     * [n_micro] the micro-batches in the order their losses were computed */
    float *host_losses;
    int n_micro, n_losses, *loss_micro;
    /* called during the last micro-batch's backward: the flat gradients [0, ready) are
     * final (buffer order is completion order); the data-parallel policy hangs here */
    void (*on_grads_final)(void *ctx, size_t ready);
    /* called before compute reads the parameters of the flat range [lo, hi) (an
     * all-gather of sharded parameters may still be filling them) */
    void (*on_params_needed)(void *ctx, size_t lo, size_t hi);
    void *hook_ctx;
} gpt_model;

/* Checks a model shape for tp ranks; returns 0 or -1 with a one-line error naming the key. */
int gpt_check_shape(const gpt_shape *s, int tp, char *err, size_t errlen);
/* Allocates this rank's parameters, gradients, optimizer state and activations for
 * micro-batches of B rows of T tokens, n_micro of them per step; place says which chunks
 * of layers it holds (NULL: the whole model). Parameters start at zero; call
 * gpt_init_random or load them. */
int gpt_create(gpt_model *m, const gpt_shape *shape, int B, int T, int n_micro,
               const gptc_backend *be, const tp_context *tp, const gpt_placement *place,
               char *err, size_t errlen);
/* The whole model's tensors with unsharded shapes (for a checkpoint writer that must
 * name tensors other ranks hold); n_out receives the count. Free with free(). */
param_tensor *gpt_full_table(const gpt_shape *shape, int *n_out);
void gpt_destroy(gpt_model *m);
/* GPT-2 init (DESIGN section 3), a pure function of (seed, name, element index in the
 * unsharded tensor), so every layout draws the same model. */
void gpt_init_random(gpt_model *m, uint64_t seed);
/* Refreshes the parameter copy compute reads (params_act) from the fp32 masters after
 * they were written other than by the optimizer (init, a checkpoint load); a no-op under
 * fp32. */
void gpt_params_changed(gpt_model *m);
const param_tensor *gpt_find_tensor(const gpt_model *m, const char *name);

/* Forward of micro-batch `micro` through local chunk c, into activation slot
 * micro % n_slots. The first stage embeds tokens (host [B*T]); other stages read the
 * chunk's input buffer, filled by the pipeline. The last stage also computes the losses
 * and, in the same pass, dlogits scaled by dloss (the weight of one position in the
 * global mean), and queues their copy to the host without waiting for it (gpt_loss_sum). */
void gpt_chunk_forward(gpt_model *m, int c, int micro, const int32_t *tokens,
                       const int32_t *targets /* host [B*T] */, float dloss);
/* The sum of the losses of the micro-batches forwarded since the last call (the same on
 * every TP rank; 0 on stages without the head), each micro-batch summed in double and
 * those sums added in the order they were computed. Call after synchronising the
 * model's stream: waiting once per step, not once per micro-batch, lets the host queue
 * the next micro-batch's work while the device computes. */
double gpt_loss_sum(gpt_model *m);
/* Backward of micro-batch `micro` through chunk c. The last stage starts from its loss;
 * other stages from the chunk's grad buffer (received). Leaves the input gradient in the
 * grad buffer; gradients accumulate (+=). With final set (the chunk's last micro-batch of
 * the step) it calls m->on_grads_final as each layer's gradients become final. */
void gpt_chunk_backward(gpt_model *m, int c, int micro, int final);
/* The buffers a pipeline sends and receives for (chunk, micro): this rank's rows of the
 * residual stream, gpt_chunk_bytes each ([N,C], or [N/tp,C] with sequence parallelism). */
gptc_act *gpt_chunk_input(gpt_model *m, int c, int micro);
gptc_act *gpt_chunk_output(gpt_model *m, int c, int micro);
gptc_act *gpt_chunk_grad(gpt_model *m, int c, int micro);
size_t gpt_chunk_bytes(const gpt_model *m);
/* With sequence parallelism, sums over the TP group the LayerNorm gradients (each rank
 * saw only its rows) whose tensors start in the flat range [lo, hi). Call once per
 * step for every range, after those gradients are final. */
void gpt_sequence_parallel_grads(gpt_model *m, size_t lo, size_t hi);
/* Forward and backward of one micro-batch through the whole model on one stage (the
 * single-stage path and the tests). Returns the sum of the micro-batch's losses. */
double gpt_forward_backward(gpt_model *m, const int32_t *tokens /* host [B*T] */,
                            const int32_t *targets /* host [B*T] */, float dloss);
/* Piece shard_rank of m's bucket b (of place.shards equal pieces; the whole bucket without
 * sharding): flat [lo, hi) of the parameters and gradients. */
void gpt_bucket_piece(const gpt_model *m, int b, int shard_rank, size_t *lo, size_t *hi);

/* This rank's share of the squared global gradient norm: its TP shards, replicated
 * tensors on TP rank 0 only, the tied wte on the first stage only, and with sharded
 * optimizer state only its piece of each bucket, so a sum over the TP, PP (and, when
 * sharded, DP) groups counts each parameter once. */
double gpt_grad_sum_squares(gpt_model *m, int shard_rank);

#endif
