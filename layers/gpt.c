/* GPT-2 forward and backward over explicit buffers, one backend op per line. */
#include "layers/gpt.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/log.h"
#include "engine/rng.h"
#include "engine/timing.h"
#include "engine/watchdog.h"

int gpt_check_shape(const gpt_shape *s, int tp, char *err, size_t errlen) {
    const char *bad = NULL;
    if (s->n_layer < 1) bad = "model.n_layer must be >= 1";
    else if (s->n_head < 1) bad = "model.n_head must be >= 1";
    else if (s->d_model < 1) bad = "model.d_model must be >= 1";
    else if (s->d_model % s->n_head != 0) bad = "model.d_model must be a multiple of model.n_head";
    else if (s->n_ctx < 1) bad = "model.n_ctx must be >= 1";
    else if (s->vocab_size < 1) bad = "model.vocab_size must be >= 1";
    else if (s->n_head % tp != 0) bad = "model.n_head must be a multiple of parallel.tp";
    if (bad) {
        snprintf(err, errlen, "config: %s (n_layer %d, n_head %d, d_model %d, n_ctx %d, vocab_size %d, tp %d)",
                 bad, s->n_layer, s->n_head, s->d_model, s->n_ctx, s->vocab_size, tp);
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------ parameter table */

typedef struct {
    gpt_model *m;
    size_t offset;
} table_builder;

static void add_tensor(table_builder *tb, const char *name, long d0, long d1, init_kind init,
                       shard_kind shard) {
    gpt_model *m = tb->m;
    param_tensor *t = &m->tensors[m->n_tensors++];
    snprintf(t->name, sizeof(t->name), "%s", name);
    t->ndim = d1 ? 2 : 1;
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->rows = d1 ? d0 : 1;
    t->cols = d1 ? d1 : d0;
    t->padded_rows = t->rows;
    t->shard = shard;
    t->decay = t->ndim >= 2;
    t->replicated = shard == SHARD_NONE;
    t->init = init;
    tp_shard_shape(shard, t->rows, t->cols, t->padded_rows, m->tp.size, &t->local_rows, &t->local_cols);
    t->numel = (size_t)t->local_rows * (size_t)t->local_cols;
    t->offset = tb->offset;
    tb->offset += t->numel;
}

static void add_layer_tensor(table_builder *tb, int l, const char *what, long d0, long d1,
                             init_kind init, shard_kind shard) {
    char name[48];
    snprintf(name, sizeof(name), "h.%d.%s", l, what);
    add_tensor(tb, name, d0, d1, init, shard);
}

static int holds_layer(const gpt_model *m, int l) {
    for (int c = 0; c < m->n_chunks; c++)
        if (l >= m->chunks[c].first_layer && l < m->chunks[c].first_layer + m->chunks[c].n_layers)
            return 1;
    return 0;
}

static int has_embedding(const gpt_model *m) { return m->chunks[0].has_embedding; }
static int has_head(const gpt_model *m) { return m->chunks[m->n_chunks - 1].has_head; }

/* The most tensors build_table adds: 12 a layer, and ln_f's two, wpe and wte. */
static size_t max_tensors(const gpt_shape *s) { return (size_t)12 * s->n_layer + 4; }

/* Buffer order = order in which backward completes the gradients. */
static void build_table(gpt_model *m) {
    const gpt_shape *s = &m->shape;
    long C = s->d_model;
    table_builder tb = {m, 0};
    m->n_tensors = 0;
    if (has_head(m)) {
        add_tensor(&tb, "ln_f.weight", C, 0, INIT_ONE, SHARD_NONE);
        add_tensor(&tb, "ln_f.bias", C, 0, INIT_ZERO, SHARD_NONE);
    }
    for (int l = s->n_layer - 1; l >= 0; l--) {
        if (!holds_layer(m, l)) continue;
        add_layer_tensor(&tb, l, "mlp.c_proj.weight", 4 * C, C, INIT_RESIDUAL, SHARD_ROWS);
        add_layer_tensor(&tb, l, "mlp.c_proj.bias", C, 0, INIT_ZERO, SHARD_NONE);
        add_layer_tensor(&tb, l, "mlp.c_fc.weight", C, 4 * C, INIT_NORMAL, SHARD_COLS);
        add_layer_tensor(&tb, l, "mlp.c_fc.bias", 4 * C, 0, INIT_ZERO, SHARD_COLS);
        add_layer_tensor(&tb, l, "ln_2.weight", C, 0, INIT_ONE, SHARD_NONE);
        add_layer_tensor(&tb, l, "ln_2.bias", C, 0, INIT_ZERO, SHARD_NONE);
        add_layer_tensor(&tb, l, "attn.c_proj.weight", C, C, INIT_RESIDUAL, SHARD_ROWS);
        add_layer_tensor(&tb, l, "attn.c_proj.bias", C, 0, INIT_ZERO, SHARD_NONE);
        add_layer_tensor(&tb, l, "attn.c_attn.weight", C, 3 * C, INIT_NORMAL, SHARD_QKV_COLS);
        add_layer_tensor(&tb, l, "attn.c_attn.bias", 3 * C, 0, INIT_ZERO, SHARD_QKV_COLS);
        add_layer_tensor(&tb, l, "ln_1.weight", C, 0, INIT_ONE, SHARD_NONE);
        add_layer_tensor(&tb, l, "ln_1.bias", C, 0, INIT_ZERO, SHARD_NONE);
    }
    if (has_embedding(m)) add_tensor(&tb, "wpe", s->n_ctx, C, INIT_NORMAL, SHARD_NONE);
    if (has_embedding(m) || has_head(m)) {
        /* wte is split over the padded vocabulary: the LM head reads whole padded rows,
         * and the padded ones stay zero. First and last stage each hold a copy (tied). */
        param_tensor *wte = &m->tensors[m->n_tensors];
        add_tensor(&tb, "wte", s->vocab_size, C, INIT_NORMAL, SHARD_ROWS);
        tb.offset -= wte->numel;
        wte->padded_rows = s->vocab_padded;
        tp_shard_shape(SHARD_ROWS, wte->rows, wte->cols, wte->padded_rows, m->tp.size,
                       &wte->local_rows, &wte->local_cols);
        wte->numel = (size_t)wte->local_rows * wte->local_cols;
        tb.offset += wte->numel;
    }
    m->n_params = tb.offset;
}

const param_tensor *gpt_find_tensor(const gpt_model *m, const char *name) {
    for (int i = 0; i < m->n_tensors; i++)
        if (strcmp(m->tensors[i].name, name) == 0) return &m->tensors[i];
    return NULL;
}

/* base: a buffer in parameter layout of elem-byte elements */
static void *view(const gpt_model *m, void *base, size_t elem, const char *name) {
    const param_tensor *t = gpt_find_tensor(m, name);
    return t ? (char *)base + t->offset * elem : NULL;
}

static void fill_views(const gpt_model *m, void *base, size_t elem, param_views *v) {
    char name[64];
    v->wte = view(m, base, elem, "wte");
    v->wpe = view(m, base, elem, "wpe");
    v->lnfw = view(m, base, elem, "ln_f.weight");
    v->lnfb = view(m, base, elem, "ln_f.bias");
    for (int l = 0; l < m->shape.n_layer; l++) {
        if (!holds_layer(m, l)) continue;
        block_views *b = &v->h[l];
        struct { void **dst; const char *what; } items[] = {
            {&b->ln1w, "ln_1.weight"}, {&b->ln1b, "ln_1.bias"},
            {&b->qkvw, "attn.c_attn.weight"}, {&b->qkvb, "attn.c_attn.bias"},
            {&b->attprojw, "attn.c_proj.weight"}, {&b->attprojb, "attn.c_proj.bias"},
            {&b->ln2w, "ln_2.weight"}, {&b->ln2b, "ln_2.bias"},
            {&b->fcw, "mlp.c_fc.weight"}, {&b->fcb, "mlp.c_fc.bias"},
            {&b->fcprojw, "mlp.c_proj.weight"}, {&b->fcprojb, "mlp.c_proj.bias"},
        };
        for (size_t i = 0; i < sizeof(items) / sizeof(items[0]); i++) {
            snprintf(name, sizeof(name), "h.%d.%s", l, items[i].what);
            *items[i].dst = view(m, base, elem, name);
        }
    }
}

/* ------------------------------------------------------------------ activations */

/* Hands out consecutive slices of the single activation allocation; run once with
 * base == NULL to count. */
typedef struct {
    char *base;  /* [act_bytes]: the activation allocation; NULL while counting */
    size_t used; /* bytes */
} arena;

static void *take(arena *a, size_t bytes) {
    void *p = a->base ? a->base + a->used : NULL;
    a->used += (bytes + 63) & ~(size_t)63;
    return p;
}

/* Local widths under tensor parallelism: this rank's heads and hidden columns. */
typedef struct {
    int B, T, N, C, Cl, NHl, Fl, Vl, v_start, v_valid;
    int Nl, row0; /* this rank's rows of the residual stream (all without SP) */
} dims;

static dims model_dims(const gpt_model *m) {
    const gpt_shape *sh = &m->shape;
    int tp = m->tp.size, N = m->B * m->T, sp = m->tp.sequence_parallel;
    dims d = {m->B, m->T, N, sh->d_model, sh->d_model / tp, sh->n_head / tp,
              4 * sh->d_model / tp, sh->vocab_padded / tp, 0, 0,
              sp ? N / tp : N, sp ? m->tp.rank * (N / tp) : 0};
    d.v_start = m->tp.rank * d.Vl;
    d.v_valid = sh->vocab_size - d.v_start;
    d.v_valid = d.v_valid < 0 ? 0 : d.v_valid > d.Vl ? d.Vl : d.v_valid;
    return d;
}

/* a: bytes of an activation-type element */
static void layout_layer(layer_acts *la, arena *ar, size_t B, size_t T, size_t C, size_t Cl,
                         size_t att_floats, size_t Nl, size_t a) {
    size_t N = B * T, f = sizeof(float);
    la->ln1 = take(ar, N * C * a);
    la->ln1_mean = take(ar, Nl * f);
    la->ln1_rstd = take(ar, Nl * f);
    la->qkv = take(ar, N * 3 * Cl * a);
    la->att = take(ar, att_floats * f);
    la->atty = take(ar, N * Cl * a);
    la->res2 = take(ar, Nl * C * a);
    la->ln2 = take(ar, N * C * a);
    la->ln2_mean = take(ar, Nl * f);
    la->ln2_rstd = take(ar, Nl * f);
    la->fch = take(ar, N * 4 * Cl * a);
    la->fch_gelu = take(ar, N * 4 * Cl * a);
    la->res3 = take(ar, Nl * C * a);
}

static void layout_acts(gpt_model *m, arena *ar) {
    const gpt_shape *s = &m->shape;
    size_t tp = (size_t)m->tp.size;
    size_t B = m->B, T = m->T, N = B * T, C = s->d_model, Cl = C / tp, NH = s->n_head / tp;
    size_t f = sizeof(float), a = gptc_act_bytes(m->prec), Nl = (size_t)model_dims(m).Nl;
    for (int c = 0; c < m->n_chunks; c++) {
        chunk_info *ch = &m->chunks[c];
        for (int k = 0; k < ch->n_slots; k++) {
            slot_acts *sa = &ch->slots[k];
            sa->input = take(ar, N * C * a);
            sa->grad = take(ar, N * C * a);
            for (int l = 0; l < ch->n_layers; l++)
                layout_layer(&sa->layer[l], ar, B, T, C, Cl,
                             m->be->attention_state_floats((int)B, (int)T, (int)NH), Nl, a);
            sa->tokens = take(ar, N * sizeof(int32_t));
            sa->targets = take(ar, N * sizeof(int32_t));
            if (!ch->has_head) continue;
            sa->lnf = take(ar, N * C * a);
            sa->lnf_mean = take(ar, Nl * f);
            sa->lnf_rstd = take(ar, Nl * f);
            sa->logits = take(ar, N * (size_t)s->vocab_padded / tp * a);
            sa->loss_max = take(ar, N * f);
            sa->loss_stats = take(ar, 2 * N * f);
            sa->losses = take(ar, N * f);
        }
    }
    scratch_views *x = &m->scratch;
    x->dbtc = take(ar, N * C * a);
    x->dqkv = take(ar, N * 3 * Cl * a);
    size_t ndatt = m->be->attention_scratch_floats
                       ? m->be->attention_scratch_floats((int)B, (int)T, (int)Cl, (int)NH)
                       : m->be->attention_state_floats((int)B, (int)T, (int)NH);
    x->datt = take(ar, ndatt * f);
    x->dfch = take(ar, N * 4 * Cl * a);
}

/* Chunk c of this rank is pipeline stage c*pp + pp_rank of pp*v equal runs of layers. */
static int place_chunks(gpt_model *m, const gpt_placement *pl) {
    int stages = pl->pp * pl->v, per = m->shape.n_layer / stages;
    m->n_chunks = pl->v;
    m->chunks = calloc((size_t)pl->v, sizeof(chunk_info));
    if (!m->chunks) return -1;
    for (int c = 0; c < pl->v; c++) {
        chunk_info *ch = &m->chunks[c];
        ch->stage = c * pl->pp + pl->pp_rank;
        ch->first_layer = ch->stage * per;
        ch->n_layers = per;
        ch->has_embedding = ch->stage == 0;
        ch->has_head = ch->stage == stages - 1;
        ch->n_slots = pl->slots ? pl->slots[c] : 1;
        ch->slots = calloc((size_t)ch->n_slots, sizeof(slot_acts));
        if (!ch->slots) return -1;
        for (int k = 0; k < ch->n_slots; k++) {
            ch->slots[k].layer = calloc((size_t)per, sizeof(layer_acts));
            if (!ch->slots[k].layer) return -1;
        }
    }
    return 0;
}

/* Groups the tensors into buckets of about bucket_floats (whole tensors; the first one
 * at most 1 MiB, so its reduction can start as early as possible) and moves them apart
 * so that every bucket ends padded to a multiple of `shards` pieces of 64 elements. Whole
 * pieces for the sharded optimizer state; of 64 so that each piece, and each bucket after
 * it, starts on 256 bytes of the fp32 buffers and 128 of the bf16 copy (and so every
 * tensor whose predecessors' sizes are multiples of 8, as GPT-2's are): a bucket padded
 * to a multiple of 3 alone moved all later tensors to odd offsets, where the GPU's vector
 * loads and cuBLASLt's fused epilogues do not go. */
static int cut_buckets(gpt_model *m, size_t bucket_floats, int shards) {
    m->buckets = calloc((size_t)m->n_tensors, sizeof(grad_bucket));
    if (!m->buckets) return -1;
    size_t pad = shards > 1 ? (size_t)shards * 64 : 1;
    size_t cap = bucket_floats ? bucket_floats : (size_t)-1;
    size_t first_cap = cap < 262144 ? cap : 262144;
    size_t cur = 0;
    grad_bucket *b = NULL;
    for (int i = 0; i < m->n_tensors; i++) {
        param_tensor *t = &m->tensors[i];
        size_t limit = m->n_buckets <= 1 ? first_cap : cap;
        if (!b || (b->count > 0 && b->count + t->numel > limit)) {
            if (b) {
                b->count = (b->count + pad - 1) / pad * pad;
                cur = b->offset + b->count;
            }
            b = &m->buckets[m->n_buckets++];
            b->offset = cur;
            b->first_tensor = i;
        }
        t->offset = b->offset + b->count;
        b->count += t->numel;
        b->n_tensors++;
    }
    if (b) b->count = (b->count + pad - 1) / pad * pad;
    m->n_params = b ? b->offset + b->count : 0;
    m->n_opt = m->n_params / shards;
    return 0;
}

int gpt_create(gpt_model *m, const gpt_shape *shape, int B, int T, int n_micro,
               const gptc_backend *be, const tp_context *tp, const gpt_placement *place,
               char *err, size_t errlen) {
    static const gpt_placement whole = {1, 0, 1, NULL, 0, 1};
    memset(m, 0, sizeof(*m));
    m->tp = *tp;
    m->tp.be = be;
    if (m->tp.chunks < 1) m->tp.chunks = 1;
    m->place = place ? *place : whole;
    m->shape = *shape;
    int pad = 128 * tp->size; /* any vocab works with any tp: pad to a multiple of both */
    m->shape.vocab_padded = (shape->vocab_size + pad - 1) / pad * pad;
    m->be = be;
    m->prec = be->get_precision();
    m->B = B;
    m->T = T;
    if (gpt_check_shape(&m->shape, tp->size, err, errlen) != 0) return -1;
    if (shape->n_layer % (m->place.pp * m->place.v) != 0) {
        snprintf(err, errlen, "config: model.n_layer = %d is not divisible by parallel.pp * parallel.virtual_stages = %d * %d",
                 shape->n_layer, m->place.pp, m->place.v);
        return -1;
    }

    m->tensors = calloc(max_tensors(shape), sizeof(param_tensor));
    m->p.h = calloc((size_t)shape->n_layer, sizeof(block_views));
    m->g.h = calloc((size_t)shape->n_layer, sizeof(block_views));
    m->n_micro = n_micro > 0 ? n_micro : 1;
    m->host_losses = be->alloc_host((size_t)m->n_micro * B * T * sizeof(float));
    m->loss_micro = calloc((size_t)m->n_micro, sizeof(int));
    if (!m->tensors || !m->p.h || !m->g.h || !m->host_losses || !m->loss_micro ||
        place_chunks(m, &m->place) != 0)
        goto oom;
    build_table(m);
    if (cut_buckets(m, m->place.bucket_floats, m->place.shards > 0 ? m->place.shards : 1) != 0)
        goto oom;
    /* with several stages the last one holds a second wte, tied to the first stage's */
    m->tied_copy = has_head(m) && !has_embedding(m);

    size_t bytes = m->n_params * sizeof(float);
    m->params = be->alloc(bytes);
    m->grads = be->alloc(bytes);
    m->opt_m = be->alloc(2 * m->n_opt * sizeof(float));
    if (!m->params || !m->grads || !m->opt_m) goto oom;
    m->opt_v = m->opt_m + m->n_opt;
    m->params_act = m->prec == GPTC_FP32 ? m->params : be->alloc(m->n_params * gptc_act_bytes(m->prec));
    if (!m->params_act) goto oom;
    fill_views(m, m->params_act, gptc_act_bytes(m->prec), &m->p);
    fill_views(m, m->grads, sizeof(float), &m->g);

    arena count = {NULL, 0};
    layout_acts(m, &count);
    m->act_memory = be->alloc(count.used);
    if (!m->act_memory) {
        snprintf(err, errlen, "out of %s memory for the activations: %.1f MiB on top of %.1f MiB "
                 "of parameters, gradients and optimizer state (lower train.micro_batch)",
                 be->name, count.used / 1048576.0,
                 (2.0 * bytes + 2.0 * m->n_opt * sizeof(float)) / 1048576.0);
        gpt_destroy(m);
        return -1;
    }
    m->act_bytes = count.used;
    arena real = {(char *)m->act_memory, 0};
    layout_acts(m, &real);
    return 0;
oom:
    snprintf(err, errlen, "out of %s memory allocating a model of %zu parameters (%.1f MiB with "
             "gradients and optimizer state)", be->name, m->n_params,
             (2.0 * m->n_params + 2.0 * m->n_opt) * sizeof(float) / 1048576.0);
    gpt_destroy(m);
    return -1;
}

void gpt_destroy(gpt_model *m) {
    if (m->be) {
        tp_free(&m->tp);
        if (m->params_act && m->params_act != m->params) m->be->release(m->params_act);
        if (m->params) m->be->release(m->params);
        if (m->grads) m->be->release(m->grads);
        if (m->opt_m) m->be->release(m->opt_m);
        if (m->act_memory) m->be->release(m->act_memory);
    }
    free(m->tensors);
    free(m->p.h);
    free(m->g.h);
    for (int c = 0; m->chunks && c < m->n_chunks; c++) {
        for (int k = 0; m->chunks[c].slots && k < m->chunks[c].n_slots; k++)
            free(m->chunks[c].slots[k].layer);
        free(m->chunks[c].slots);
    }
    free(m->chunks);
    free(m->buckets);
    if (m->host_losses) m->be->release_host(m->host_losses);
    free(m->loss_micro);
    memset(m, 0, sizeof(*m));
}

void gpt_init_random(gpt_model *m, uint64_t seed) {
    float resid_std = 0.02f / sqrtf(2.0f * (float)m->shape.n_layer);
    size_t bytes = m->n_params * sizeof(float);
    /* [n_params] staged on the host, then copied once; bucket padding stays 0 */
    float *host = log_calloc(m->n_params, sizeof(float), "the initial parameters");
    for (int i = 0; i < m->n_tensors; i++) {
        const param_tensor *t = &m->tensors[i];
        float *dst = host + t->offset;
        uint64_t key = rng_key(seed, t->name);
        float std = t->init == INIT_RESIDUAL ? resid_std : 0.02f;
        /* a large model's takes minutes on one thread: progress, row by row */
        #pragma omp parallel for schedule(static)
        for (long li = 0; li < t->local_rows; li++) {
            watchdog_beat();
            for (long lj = 0; lj < t->local_cols; lj++) {
                long g = tp_global_index(t->shard, t->rows, t->cols, t->local_rows,
                                         t->local_cols, m->tp.rank, li, lj);
                float v = 0.0f; /* padded vocab rows */
                if (g >= 0 && t->init == INIT_ONE) v = 1.0f;
                else if (g >= 0 && t->init != INIT_ZERO) v = std * rng_normal(key, (uint64_t)g);
                dst[li * t->local_cols + lj] = v;
            }
        }
    }
    m->be->copy_from_host(m->params, host, bytes, m->stream);
    free(host);
    gpt_params_changed(m);
}

void gpt_params_changed(gpt_model *m) {
    if (m->params_act != m->params) m->be->to_act(m->params_act, m->params, m->n_params, m->stream);
}

/* ------------------------------------------------------------------ forward / backward */

/* element i of an activation-type buffer of the model */
static gptc_act *at(const gpt_model *m, const gptc_act *p, size_t i) {
    return gptc_act_at(p, i, m->prec);
}

/* The LayerNorm that reads a layer's output, which block_forward fuses with the layer's
 * last residual add: the next layer's ln_1, or ln_f after the last layer. */
typedef struct {
    gptc_act *out;         /* [N,C]; this rank's rows start at row0 */
    float *mean, *rstd;    /* [Nl] */
    const gptc_act *w, *b; /* [C] */
} ln_next;

/* x [Nl,C]: this rank's rows of the residual stream entering layer l. ln1_done: the
 * previous layer's last add already wrote ln_1 (next != NULL there). next: the LayerNorm
 * of this layer's output to fuse into its last add, or NULL. */
static void block_forward(gpt_model *m, layer_acts *la, int l, const gptc_act *x, int ln1_done,
                          const ln_next *next, const dims *d) {
    const gptc_backend *be = m->be;
    gptc_stream *s = m->stream;
    block_views *w = &m->p.h[l];
    gptc_act *tmp = m->scratch.dbtc; /* [N,C] partial sums of the row-parallel projections */
    int N = d->N, Nl = d->Nl, C = d->C;
    size_t mine = (size_t)d->row0 * C, nl = (size_t)Nl * C;
    if (!ln1_done)
        be->layernorm_forward(at(m, la->ln1, mine), la->ln1_mean, la->ln1_rstd, x, w->ln1w,
                              w->ln1b, Nl, C, s);
    timing_matmul_role("qkv");
    tp_column_parallel_forward(&m->tp, la->qkv, la->ln1, w->qkvw, w->qkvb, N, C, 3 * d->Cl, 0, NULL,
                               s);
    be->attention_forward(la->atty, la->att, la->qkv, d->B, d->T, d->Cl, d->NHl, s);
    timing_matmul_role("attn_proj");
    const gptc_act *y = /* [Nl,C] */
        tp_row_parallel_forward(&m->tp, tmp, la->atty, w->attprojw, w->attprojb, N, d->Cl, C, s);
    be->add_layernorm_forward(la->res2, at(m, la->ln2, mine), la->ln2_mean, la->ln2_rstd, x, y,
                              w->ln2w, w->ln2b, Nl, C, s);
    timing_matmul_role("fc"); /* with the GELU: fch_gelu = gelu(fch) */
    tp_column_parallel_forward(&m->tp, la->fch, la->ln2, w->fcw, w->fcb, N, C, d->Fl, 0,
                               la->fch_gelu, s);
    timing_matmul_role("fc_proj");
    y = tp_row_parallel_forward(&m->tp, tmp, la->fch_gelu, w->fcprojw, w->fcprojb, N, d->Fl, C, s);
    if (next)
        be->add_layernorm_forward(la->res3, at(m, next->out, mine), next->mean, next->rstd,
                                  la->res2, y, next->w, next->b, Nl, C, s);
    else
        be->add(la->res3, la->res2, y, nl, s);
}

/* The bias gradients of the row-parallel projections (attn_proj, fc_proj) are the column
 * sums of the residual stream's gradient that a LayerNorm backward has just written: it
 * takes them (layernorm_backward's dsum) while it holds the rows, instead of another pass
 * over them. Not under sequence parallelism, where a LayerNorm holds a slice of the rows
 * and the projection's backward the gathered whole. */
static int ln_sums_bias(const gpt_model *m) {
    return !m->tp.sequence_parallel || m->tp.size == 1;
}

/* dfull [N,C] holds this rank's rows of the gradient of the layer's output at their
 * place (dres = dfull + row0*C); on return dres is the gradient of its input x.
 * fcproj_bias_done: the LayerNorm backward that wrote dfull took its column sums into
 * c_proj's bias gradient already (ln_sums_bias); prev_fcproj_bias: where this layer's ln_1
 * backward adds them (the previous layer's c_proj bias gradient), or NULL. */
static void block_backward(gpt_model *m, layer_acts *la, int l, gptc_act *dfull,
                           const gptc_act *x /* [Nl,C] */, const dims *d, int fcproj_bias_done,
                           float *prev_fcproj_bias) {
    const gptc_backend *be = m->be;
    gptc_stream *s = m->stream;
    scratch_views *a = &m->scratch;
    block_views *w = &m->p.h[l], *dw = &m->g.h[l];
    int N = d->N, Nl = d->Nl, C = d->C;
    gptc_act *dres = at(m, dfull, (size_t)d->row0 * C);
    /* MLP branch; the c_fc input gradient is partial per TP rank until reduced */
    timing_matmul_role("fc_proj"); /* through the GELU: dfch = d(fch), not d(fch_gelu) */
    tp_row_parallel_backward(&m->tp, a->dfch, dw->fcprojw, fcproj_bias_done ? NULL : dw->fcprojb,
                             dfull, la->fch_gelu, w->fcprojw, N, d->Fl, C, la->fch, s);
    timing_matmul_role("fc");
    const gptc_act *dln2 = tp_column_parallel_backward(&m->tp, a->dbtc, dw->fcw, dw->fcb, a->dfch,
                                                    la->ln2, w->fcw, N, C, d->Fl, 0, s);
    int sums = ln_sums_bias(m);
    be->layernorm_backward(dres, dw->ln2w, dw->ln2b, sums ? dw->attprojb : NULL, dln2, la->res2,
                           w->ln2w, la->ln2_mean, la->ln2_rstd, Nl, C, s);
    /* attention branch: dbtc first holds d(atty) [N,Cl], then d(ln1) [N,C] */
    timing_matmul_role("attn_proj");
    tp_row_parallel_backward(&m->tp, a->dbtc, dw->attprojw, sums ? NULL : dw->attprojb, dfull,
                             la->atty, w->attprojw, N, d->Cl, C, NULL, s);
    /* the qkv bias gradient comes with dqkv (a GPU adds it while dqkv is in registers), so
     * the projection's backward skips it */
    be->attention_backward(a->dqkv, dw->qkvb, a->datt, a->dbtc, la->atty, la->qkv, la->att,
                           d->B, d->T, d->Cl, d->NHl, s);
    timing_matmul_role("qkv");
    const gptc_act *dln1 = tp_column_parallel_backward(&m->tp, a->dbtc, dw->qkvw, NULL, a->dqkv,
                                                    la->ln1, w->qkvw, N, C, 3 * d->Cl, 0, s);
    be->layernorm_backward(dres, dw->ln1w, dw->ln1b, prev_fcproj_bias, dln1, x, w->ln1w,
                           la->ln1_mean, la->ln1_rstd, Nl, C, s);
}

/* Tells the owner that compute is about to read the tensors a .. b (buffer order). */
static void params_needed(gpt_model *m, const char *a, const char *b) {
    const param_tensor *x = gpt_find_tensor(m, a), *y = gpt_find_tensor(m, b);
    if (!m->on_params_needed || !x || !y) return;
    size_t lo = x->offset < y->offset ? x->offset : y->offset;
    size_t hi = x->offset < y->offset ? y->offset + y->numel : x->offset + x->numel;
    m->on_params_needed(m->hook_ctx, lo, hi);
}

static slot_acts *slot_of(gpt_model *m, int c, int micro) {
    chunk_info *ch = &m->chunks[c];
    return &ch->slots[micro % ch->n_slots];
}

/* input and grad are [N,C] so that collectives over rows run in place; a rank's own
 * rows start at row0 */
static size_t own_rows(const gpt_model *m) {
    return (size_t)model_dims(m).row0 * m->shape.d_model;
}
gptc_act *gpt_chunk_input(gpt_model *m, int c, int micro) {
    return at(m, slot_of(m, c, micro)->input, own_rows(m));
}
gptc_act *gpt_chunk_grad(gpt_model *m, int c, int micro) {
    return at(m, slot_of(m, c, micro)->grad, own_rows(m));
}
size_t gpt_chunk_bytes(const gpt_model *m) {
    return (size_t)model_dims(m).Nl * m->shape.d_model * gptc_act_bytes(m->prec);
}
gptc_act *gpt_chunk_output(gpt_model *m, int c, int micro) {
    slot_acts *sa = slot_of(m, c, micro);
    return sa->layer[m->chunks[c].n_layers - 1].res3;
}

/* The last stage: ln_f, the tied LM head and the vocab-parallel cross-entropy, which
 * never puts the full logits on any rank. */
static void head_forward(gpt_model *m, slot_acts *sa, const gptc_act *x /* [Nl,C] */,
                         int lnf_done, const dims *d, int micro, float dloss) {
    const gptc_backend *be = m->be;
    gptc_stream *s = m->stream;
    param_views *p = &m->p;
    int N = d->N, C = d->C;
    if (!lnf_done) /* else the last layer's add wrote it */
        be->layernorm_forward(at(m, sa->lnf, (size_t)d->row0 * C), sa->lnf_mean, sa->lnf_rstd, x,
                              p->lnfw, p->lnfb, d->Nl, C, s);
    timing_matmul_role("lm_head");
    tp_column_parallel_forward(&m->tp, sa->logits, sa->lnf, p->wte, NULL, N, C, d->Vl, 1, NULL, s);
    if (m->tp.size == 1) { /* nothing to sum over ranks between the steps */
        be->cross_entropy(sa->losses, sa->logits, sa->loss_max, sa->loss_stats, sa->targets, N,
                          d->Vl, d->v_valid, dloss, s);
    } else {
        be->vocab_max(sa->loss_max, sa->logits, N, d->Vl, d->v_valid, s);
        tp_allreduce_max(&m->tp, sa->loss_max, (size_t)N);
        be->vocab_expsum(sa->loss_stats, sa->logits, sa->loss_max, sa->targets, N, d->Vl,
                         d->v_valid, d->v_start, s);
        tp_allreduce_sum(&m->tp, sa->loss_stats, 2 * (size_t)N);
        be->vocab_ce_finish(sa->losses, sa->logits, sa->loss_max, sa->loss_stats, sa->targets,
                            N, d->Vl, d->v_valid, d->v_start, dloss, s);
    }
    if (m->n_losses >= m->n_micro) {
        log_error("rank %d: more than %d micro-batches forwarded through the head in one step",
                  log_rank(), m->n_micro);
        exit(EXIT_FAILURE);
    }
    m->loss_micro[m->n_losses++] = micro;
    be->copy_async(m->host_losses + (size_t)micro * N, sa->losses, (size_t)N * sizeof(float), s);
}

double gpt_loss_sum(gpt_model *m) {
    size_t N = (size_t)m->B * m->T;
    double total = 0.0;
    for (int k = 0; k < m->n_losses; k++) {
        const float *l = m->host_losses + (size_t)m->loss_micro[k] * N;
        double sum = 0.0;
        for (size_t n = 0; n < N; n++) sum += l[n];
        total += sum;
    }
    m->n_losses = 0;
    return total;
}

/* dres [Nl,C] = gradient of the head's input x (this rank's rows); fcproj_bias: where
 * ln_f's backward adds its column sums (the last layer's c_proj bias gradient), or NULL */
static void head_backward(gpt_model *m, slot_acts *sa, gptc_act *dres, const gptc_act *x,
                          const dims *d, float *fcproj_bias) {
    const gptc_backend *be = m->be;
    gptc_stream *s = m->stream;
    param_views *p = &m->p, *g = &m->g;
    int N = d->N, C = d->C;
    /* logits already hold dlogits (fused into the loss) */
    timing_matmul_role("lm_head");
    const gptc_act *dlnf = tp_column_parallel_backward(&m->tp, m->scratch.dbtc, g->wte, NULL,
                                                    sa->logits, sa->lnf, p->wte, N, C, d->Vl, 1, s);
    be->zero(dres, (size_t)d->Nl * C * gptc_act_bytes(m->prec), s);
    be->layernorm_backward(dres, g->lnfw, g->lnfb, fcproj_bias, dlnf, x, p->lnfw, sa->lnf_mean,
                           sa->lnf_rstd, d->Nl, C, s);
}

void gpt_chunk_forward(gpt_model *m, int c, int micro, const int32_t *tokens,
                       const int32_t *targets, float dloss) {
    const gptc_backend *be = m->be;
    gptc_stream *s = m->stream;
    chunk_info *ch = &m->chunks[c];
    slot_acts *sa = slot_of(m, c, micro);
    dims d = model_dims(m);
    size_t N = (size_t)d.N;
    timing_set_context(-1, micro, PH_FWD);
    char a[48], b[48];
    if (ch->has_embedding) {
        params_needed(m, "wpe", "wte");
        /* vocab-parallel embedding: each rank adds the rows it holds (wpe once), then sum */
        be->copy_from_host(sa->tokens, tokens, N * sizeof(int32_t), s);
        be->embedding_forward(sa->input, sa->tokens, m->p.wte, m->tp.rank == 0 ? m->p.wpe : NULL,
                              d.N, d.T, d.C, d.v_start, d.Vl, s);
        tp_reduce_rows(&m->tp, sa->input, d.Nl, d.C);
    }
    /* [Nl,C] this rank's rows of the residual stream entering each layer */
    const gptc_act *x = at(m, sa->input, (size_t)d.row0 * d.C);
    for (int i = 0; i < ch->n_layers; i++) {
        int l = ch->first_layer + i;
        timing_set_context(l, micro, PH_FWD);
        snprintf(a, sizeof(a), "h.%d.mlp.c_proj.weight", l); /* the layer's first tensor */
        snprintf(b, sizeof(b), "h.%d.ln_1.bias", l);         /* and its last */
        params_needed(m, a, b);
        /* the LayerNorm after this layer, when it runs on this chunk: fused into its add */
        ln_next next, *nx = NULL;
        if (i + 1 < ch->n_layers) {
            layer_acts *nl = &sa->layer[i + 1];
            snprintf(a, sizeof(a), "h.%d.ln_1.weight", l + 1);
            snprintf(b, sizeof(b), "h.%d.ln_1.bias", l + 1);
            params_needed(m, a, b);
            next = (ln_next){nl->ln1, nl->ln1_mean, nl->ln1_rstd, m->p.h[l + 1].ln1w,
                             m->p.h[l + 1].ln1b};
            nx = &next;
        } else if (ch->has_head) {
            params_needed(m, "ln_f.weight", "ln_f.bias");
            next = (ln_next){sa->lnf, sa->lnf_mean, sa->lnf_rstd, m->p.lnfw, m->p.lnfb};
            nx = &next;
        }
        block_forward(m, &sa->layer[i], l, x, i > 0, nx, &d);
        x = sa->layer[i].res3;
    }
    timing_set_context(-1, micro, PH_FWD);
    if (!ch->has_head) return;
    params_needed(m, "ln_f.weight", "ln_f.bias");
    params_needed(m, "wte", "wte");
    be->copy_from_host(sa->targets, targets, N * sizeof(int32_t), s);
    head_forward(m, sa, x, ch->n_layers > 0, &d, micro, dloss);
}

/* Tells the owner that every gradient up to and including tensor `name` is final. */
static void grads_final(gpt_model *m, const char *name) {
    const param_tensor *t = gpt_find_tensor(m, name);
    if (m->on_grads_final && t) m->on_grads_final(m->hook_ctx, t->offset + t->numel);
}

void gpt_chunk_backward(gpt_model *m, int c, int micro, int final) {
    chunk_info *ch = &m->chunks[c];
    char name[48];
    slot_acts *sa = slot_of(m, c, micro);
    dims d = model_dims(m);
    /* gradient of the residual stream, this rank's rows at row0; each branch adds into it */
    gptc_act *dres = at(m, sa->grad, (size_t)d.row0 * d.C);
    int last = ch->n_layers - 1, sums = ln_sums_bias(m) && ch->n_layers > 0;
    timing_set_context(-1, micro, PH_BWD);
    if (ch->has_head) {
        head_backward(m, sa, dres, sa->layer[last].res3, &d,
                      sums ? m->g.h[ch->first_layer + last].fcprojb : NULL);
        if (final) grads_final(m, "ln_f.bias");
    }
    for (int i = last; i >= 0; i--) {
        int l = ch->first_layer + i;
        timing_set_context(l, micro, PH_BWD);
        /* the LayerNorm after this layer (the next layer's ln_1, or ln_f) ran on this chunk
         * and took the sums of c_proj's bias gradient; this one's ln_1 takes the previous
         * layer's, when that layer is on this chunk */
        int done = sums && (i < last || ch->has_head);
        block_backward(m, &sa->layer[i], l, sa->grad,
                       i == 0 ? at(m, sa->input, (size_t)d.row0 * d.C) : sa->layer[i - 1].res3, &d,
                       done, sums && i > 0 ? m->g.h[l - 1].fcprojb : NULL);
        snprintf(name, sizeof(name), "h.%d.ln_1.bias", l); /* the layer's last tensor */
        if (final) grads_final(m, name);
    }
    timing_set_context(-1, micro, PH_BWD);
    if (ch->has_embedding) {
        m->be->embedding_backward(m->g.wte, m->g.wpe,
                                  tp_gather_rows(&m->tp, sa->grad, d.Nl, d.C),
                                  sa->tokens, d.N, d.T, d.C, d.v_start, d.Vl, m->stream);
        if (final) grads_final(m, "wpe"); /* wte may still take the tied stage's part */
    }
}

double gpt_forward_backward(gpt_model *m, const int32_t *tokens, const int32_t *targets,
                            float dloss) {
    gpt_chunk_forward(m, 0, 0, tokens, targets, dloss);
    gpt_chunk_backward(m, 0, 0, 1);
    m->be->stream_synchronize(m->stream);
    return gpt_loss_sum(m);
}

void gpt_sequence_parallel_grads(gpt_model *m, size_t lo, size_t hi) {
    if (!m->tp.sequence_parallel || m->tp.size == 1) return;
    /* a LayerNorm saw only this rank's rows: its gradient is a partial sum */
    for (int i = 0; i < m->n_tensors; i++) {
        const param_tensor *t = &m->tensors[i];
        if (strstr(t->name, "ln_") && t->offset >= lo && t->offset < hi)
            tp_allreduce_sum(&m->tp, m->grads + t->offset, t->numel);
    }
}

void gpt_bucket_piece(const gpt_model *m, int b, int shard_rank, size_t *lo, size_t *hi) {
    const grad_bucket *bk = &m->buckets[b];
    int shards = m->place.shards > 0 ? m->place.shards : 1;
    size_t piece = bk->count / (size_t)shards;
    *lo = bk->offset + (size_t)shard_rank * piece;
    *hi = *lo + piece;
}

/* Adjacent counted tensors are summed as one run: on a GPU each sum is a round trip to
 * the host, so one per run rather than one per tensor. */
double gpt_grad_sum_squares(gpt_model *m, int shard_rank) {
    double sum = 0.0;
    size_t run_lo = 0, run_hi = 0; /* the run of counted elements not yet summed */
    for (int b = 0; b < m->n_buckets; b++) {
        const grad_bucket *bk = &m->buckets[b];
        size_t a, z;
        gpt_bucket_piece(m, b, shard_rank, &a, &z);
        for (int i = bk->first_tensor; i < bk->first_tensor + bk->n_tensors; i++) {
            const param_tensor *t = &m->tensors[i];
            if (t->replicated && m->tp.rank != 0) continue;
            if (m->tied_copy && strcmp(t->name, "wte") == 0) continue;
            size_t lo = t->offset > a ? t->offset : a;
            size_t hi = t->offset + t->numel < z ? t->offset + t->numel : z;
            if (lo >= hi) continue;
            if (lo == run_hi && run_hi > run_lo) {
                run_hi = hi;
                continue;
            }
            if (run_hi > run_lo) sum += m->be->sum_squares(m->grads + run_lo, run_hi - run_lo, m->stream);
            run_lo = lo;
            run_hi = hi;
        }
    }
    if (run_hi > run_lo) sum += m->be->sum_squares(m->grads + run_lo, run_hi - run_lo, m->stream);
    return sum;
}

param_tensor *gpt_full_table(const gpt_shape *shape, int *n_out) {
    gpt_model m;
    memset(&m, 0, sizeof(m));
    m.shape = *shape;
    m.tp = (tp_context){.size = 1};
    m.tensors = calloc(max_tensors(shape), sizeof(param_tensor));
    chunk_info whole = {0, 0, shape->n_layer, 1, 1, 0, NULL};
    m.chunks = &whole;
    m.n_chunks = 1;
    if (m.tensors) build_table(&m);
    *n_out = m.n_tensors;
    return m.tensors;
}
