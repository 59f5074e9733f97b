/* Run configuration: the INI keys of DESIGN section 4, with defaults, parsed from a file
 * (its INI dialect is described in config.c) and then overridden by --section.key=value
 * arguments. */
#ifndef GPTC_CONFIG_H
#define GPTC_CONFIG_H

#include <stddef.h>
#include <stdio.h>

enum { CFG_STR_MAX = 512 };

typedef struct {
    /* [model]: 0 = take it from train.init */
    int n_layer, n_head, d_model, n_ctx, vocab_size;

    /* [parallel] */
    int tp, pp, dp;                 /* dp 0 = world / (tp*pp) */
    char schedule[16];              /* 1f1b | gpipe | interleaved */
    int virtual_stages;
    int sequence_parallel;

    /* [overlap] */
    char overlap_dp[16];            /* none | bucket */
    double dp_bucket_mb;
    char dp_shard[16];              /* none | optimizer */
    char overlap_tp[16];            /* none | chunked */
    int tp_chunks;
    char overlap_pp[16];            /* none | async */
    int comm_max_ctas;
    char comm_cta_policy[16];       /* default | efficiency | zero */
    char comm_priority[16];         /* high | normal */

    /* [train] */
    char device[16];                /* cpu | cuda */
    char precision[16];             /* fp32 | bf16 */
    long steps;                     /* number of the last step */
    int global_batch;
    int micro_batch;                /* 0 = global_batch / dp: no accumulation */
    int seq_len;                    /* 0 = n_ctx */
    double lr;
    char lr_schedule[16];           /* constant | cosine */
    long warmup_steps;
    double min_lr;
    double weight_decay, beta1, beta2, eps, grad_clip;
    unsigned long long seed;
    char init[CFG_STR_MAX];
    char save[CFG_STR_MAX];
    long save_every;
    int keep;
    char log_file[CFG_STR_MAX];
    double comm_timeout_s;
    char nan_policy[16];            /* stop | skip */

    /* [data] */
    char data_path[CFG_STR_MAX];
    int shuffle;

    /* [profile] */
    char timing[16];                /* off | step | kernel */
    char trace[CFG_STR_MAX];
    char report[CFG_STR_MAX];
    int nvtx;
    int power;
    int contention_probe;
    int prof_warmup;  /* profile.warmup: the run's first steps, left out of the report's means */
    char source[CFG_STR_MAX]; /* the config file read (empty: none); a fact, not a key */
} gptc_config;

void config_defaults(gptc_config *c);
/* Reads path (NULL: defaults only), then applies argv overrides of the form
 * --section.key=value. Returns 0, or -1 with a one-line error naming the key. */
int config_load(gptc_config *c, const char *path, int argc, char **argv,
                char *err, size_t errlen);
/* Parses INI text (as a file's contents) into c; the fuzz target's entry. */
int config_load_text(gptc_config *c, const char *text, char *err, size_t errlen);
/* Sets one key from its text value; the same parser the file and overrides use. */
int config_set(gptc_config *c, const char *section, const char *key, const char *value,
               char *err, size_t errlen);
/* Checks values that do not depend on the model or the world size. */
int config_validate(const gptc_config *c, char *err, size_t errlen);
/* Writes the effective configuration as INI text. */
void config_print(const gptc_config *c, FILE *out);

#endif
