/* Config keys are rows of one table: the file parser, the command-line overrides, the
 * printer and the unknown-key check all walk it, so a key is declared exactly once. */
#define _POSIX_C_SOURCE 200809L
#include "engine/config.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

typedef enum { K_INT, K_LONG, K_U64, K_DOUBLE, K_BOOL, K_STR, K_CHOICE } key_type;

typedef struct {
    const char *section, *key;
    key_type type;
    size_t offset, size;   /* field in gptc_config; size for strings */
    double min, max;       /* inclusive range for numbers */
    const char *choices;   /* "a|b|c" for K_CHOICE */
} key_def;

#define F(field) offsetof(gptc_config, field), sizeof(((gptc_config *)0)->field)

static const key_def KEYS[] = {
    {"model", "n_layer", K_INT, F(n_layer), 0, 1 << 16, NULL},
    {"model", "n_head", K_INT, F(n_head), 0, 1 << 16, NULL},
    {"model", "d_model", K_INT, F(d_model), 0, 1 << 20, NULL},
    {"model", "n_ctx", K_INT, F(n_ctx), 0, 1 << 24, NULL},
    {"model", "vocab_size", K_INT, F(vocab_size), 0, 1 << 30, NULL},

    {"parallel", "tp", K_INT, F(tp), 1, 1 << 16, NULL},
    {"parallel", "pp", K_INT, F(pp), 1, 1 << 16, NULL},
    {"parallel", "dp", K_INT, F(dp), 0, 1 << 20, NULL},
    {"parallel", "schedule", K_CHOICE, F(schedule), 0, 0, "1f1b|gpipe|interleaved"},
    {"parallel", "virtual_stages", K_INT, F(virtual_stages), 1, 1 << 10, NULL},
    {"parallel", "sequence_parallel", K_BOOL, F(sequence_parallel), 0, 1, NULL},

    {"overlap", "dp", K_CHOICE, F(overlap_dp), 0, 0, "none|bucket"},
    {"overlap", "dp_bucket_mb", K_DOUBLE, F(dp_bucket_mb), 1e-6, 1e6, NULL},
    {"overlap", "dp_shard", K_CHOICE, F(dp_shard), 0, 0, "none|optimizer"},
    {"overlap", "tp", K_CHOICE, F(overlap_tp), 0, 0, "none|chunked"},
    {"overlap", "tp_chunks", K_INT, F(tp_chunks), 1, 1 << 16, NULL},
    {"overlap", "pp", K_CHOICE, F(overlap_pp), 0, 0, "none|async"},
    {"overlap", "comm_max_ctas", K_INT, F(comm_max_ctas), 0, 1 << 16, NULL},
    {"overlap", "comm_cta_policy", K_CHOICE, F(comm_cta_policy), 0, 0, "default|efficiency|zero"},
    {"overlap", "comm_priority", K_CHOICE, F(comm_priority), 0, 0, "high|normal"},

    {"train", "device", K_CHOICE, F(device), 0, 0, "cpu|cuda"},
    {"train", "precision", K_CHOICE, F(precision), 0, 0, "fp32|bf16"},
    {"train", "steps", K_LONG, F(steps), 0, 1e15, NULL},
    {"train", "global_batch", K_INT, F(global_batch), 1, 1 << 24, NULL},
    {"train", "micro_batch", K_INT, F(micro_batch), 0, 1 << 24, NULL},
    {"train", "seq_len", K_INT, F(seq_len), 0, 1 << 24, NULL},
    {"train", "lr", K_DOUBLE, F(lr), 0, 1e3, NULL},
    {"train", "lr_schedule", K_CHOICE, F(lr_schedule), 0, 0, "constant|cosine"},
    {"train", "warmup_steps", K_LONG, F(warmup_steps), 0, 1e15, NULL},
    {"train", "min_lr", K_DOUBLE, F(min_lr), 0, 1e3, NULL},
    {"train", "weight_decay", K_DOUBLE, F(weight_decay), 0, 1e3, NULL},
    {"train", "beta1", K_DOUBLE, F(beta1), 0, 0.999999999, NULL},
    {"train", "beta2", K_DOUBLE, F(beta2), 0, 0.999999999, NULL},
    /* 0 divides by zero where a gradient and its second moment are 0 (padded vocab rows) */
    {"train", "eps", K_DOUBLE, F(eps), 1e-30, 1, NULL},
    {"train", "grad_clip", K_DOUBLE, F(grad_clip), 0, 1e30, NULL},
    {"train", "seed", K_U64, F(seed), 0, 0, NULL},
    {"train", "init", K_STR, F(init), 0, 0, NULL},
    {"train", "save", K_STR, F(save), 0, 0, NULL},
    {"train", "save_every", K_LONG, F(save_every), 0, 1e15, NULL},
    {"train", "keep", K_INT, F(keep), 1, 1 << 20, NULL},
    {"train", "log_file", K_STR, F(log_file), 0, 0, NULL},
    /* below a second the watchdog fires on healthy multi-rank jobs */
    {"train", "comm_timeout_s", K_DOUBLE, F(comm_timeout_s), 1, 1e9, NULL},
    {"train", "nan_policy", K_CHOICE, F(nan_policy), 0, 0, "stop|skip"},

    {"data", "path", K_STR, F(data_path), 0, 0, NULL},
    {"data", "shuffle", K_BOOL, F(shuffle), 0, 1, NULL},

    {"profile", "timing", K_CHOICE, F(timing), 0, 0, "off|step|kernel"},
    {"profile", "trace", K_STR, F(trace), 0, 0, NULL},
    {"profile", "report", K_STR, F(report), 0, 0, NULL},
    {"profile", "nvtx", K_BOOL, F(nvtx), 0, 1, NULL},
    {"profile", "power", K_BOOL, F(power), 0, 1, NULL},
    {"profile", "contention_probe", K_INT, F(contention_probe), 0, 1 << 30, NULL},
    {"profile", "warmup", K_INT, F(prof_warmup), 0, 1 << 30, NULL},
};
#undef F

enum { N_KEYS = sizeof(KEYS) / sizeof(KEYS[0]) };

void config_defaults(gptc_config *c) {
    memset(c, 0, sizeof(*c));
    c->tp = c->pp = 1;
    strcpy(c->schedule, "1f1b");
    c->virtual_stages = 1;
    strcpy(c->overlap_dp, "none");
    c->dp_bucket_mb = 25;
    strcpy(c->dp_shard, "none");
    strcpy(c->overlap_tp, "none");
    c->tp_chunks = 4;
    strcpy(c->overlap_pp, "none");
    strcpy(c->comm_cta_policy, "default");
    strcpy(c->comm_priority, "high");
    strcpy(c->device, "cpu");
    strcpy(c->precision, "fp32");
    c->steps = 20;
    c->global_batch = 8;
    c->lr = 3e-4;
    strcpy(c->lr_schedule, "constant");
    c->weight_decay = 0.1;
    c->beta1 = 0.9;
    c->beta2 = 0.95;
    c->eps = 1e-8;
    c->grad_clip = 1.0;
    c->seed = 1337;
    c->keep = 1;
    c->comm_timeout_s = 60;
    strcpy(c->nan_policy, "stop");
    strcpy(c->timing, "off");
    c->nvtx = 1;
}

static const key_def *find_key(const char *section, const char *key) {
    for (int i = 0; i < N_KEYS; i++)
        if (strcmp(KEYS[i].section, section) == 0 && strcmp(KEYS[i].key, key) == 0)
            return &KEYS[i];
    return NULL;
}

static int section_known(const char *section) {
    for (int i = 0; i < N_KEYS; i++)
        if (strcmp(KEYS[i].section, section) == 0) return 1;
    return 0;
}

static int choice_ok(const char *choices, const char *v) {
    size_t n = strlen(v);
    for (const char *p = choices; *p;) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == n && strncmp(p, v, n) == 0) return 1;
        if (!bar) break;
        p = bar + 1;
    }
    return 0;
}

/* v past the white space that strtod and strtoull skip themselves */
static const char *skip_space(const char *v) {
    while (isspace((unsigned char)*v)) v++;
    return v;
}

/* "0x..." or "0X...", after optional blanks and a sign */
static int is_hex(const char *v) {
    v = skip_space(v);
    if (*v == '+' || *v == '-') v++;
    return v[0] == '0' && (v[1] == 'x' || v[1] == 'X');
}

static int parse_bool(const char *v, int *out) {
    const char *t[] = {"true", "1", "yes", "on"}, *f[] = {"false", "0", "no", "off"};
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(v, t[i]) == 0) { *out = 1; return 0; }
        if (strcasecmp(v, f[i]) == 0) { *out = 0; return 0; }
    }
    return -1;
}

int config_set(gptc_config *c, const char *section, const char *key, const char *value,
               char *err, size_t errlen) {
    const key_def *k = find_key(section, key);
    if (!k) {
        if (!section_known(section))
            snprintf(err, errlen, "config: unknown section [%s] (key %s.%s)", section, section, key);
        else
            snprintf(err, errlen, "config: unknown key %s.%s", section, key);
        return -1;
    }
    /* a newline from the command line would split the one-line errors and the effective
     * config (which reads back as INI) */
    for (const char *p = value; *p; p++)
        if ((unsigned char)*p < 0x20 && *p != '\t') {
            snprintf(err, errlen, "config: %s.%s holds a control character (0x%02x): give it "
                     "on one line", section, key, (unsigned)(unsigned char)*p);
            return -1;
        }
    char *field = (char *)c + k->offset;
    char *end = NULL;
    errno = 0;
    switch (k->type) {
    case K_STR:
        if (strlen(value) >= k->size) {
            snprintf(err, errlen, "config: %s.%s is longer than %zu characters", section, key, k->size - 1);
            return -1;
        }
        strcpy(field, value);
        return 0;
    case K_CHOICE:
        if (!choice_ok(k->choices, value)) {
            snprintf(err, errlen, "config: %s.%s = '%s' is not one of %s", section, key, value, k->choices);
            return -1;
        }
        strcpy(field, value);
        return 0;
    case K_BOOL:
        if (parse_bool(value, (int *)field) != 0) {
            snprintf(err, errlen, "config: %s.%s = '%s' is not a boolean (true|false, yes|no, on|off, 1|0)", section, key, value);
            return -1;
        }
        return 0;
    case K_U64: {
        /* strtoull takes "-1" (after blanks too) for 2^64 - 1 */
        if (*skip_space(value) == '-') end = (char *)value;
        unsigned long long u = end ? 0 : strtoull(value, &end, 10);
        if (end == value || *skip_space(end) || errno) {
            snprintf(err, errlen, "config: %s.%s = '%s' is not a non-negative integer", section, key, value);
            return -1;
        }
        *(unsigned long long *)field = u;
        return 0;
    }
    default: break;
    }
    if (is_hex(value)) {
        /* strtod reads hex (0x10 = 16) while strtoull above is decimal: one notation */
        snprintf(err, errlen, "config: %s.%s = '%s' is not a decimal number", section, key, value);
        return -1;
    }
    /* blanks before and after, as strtod takes before; an underflow (ERANGE with a finite
     * result, 1e-320) is the tiny number it is, and the range check judges it */
    double d = strtod(value, &end);
    if (end == value || *skip_space(end)) {
        snprintf(err, errlen, "config: %s.%s = '%s' is not a number", section, key, value);
        return -1;
    }
    if (!isfinite(d)) {
        snprintf(err, errlen, "config: %s.%s = '%s' is not a finite number", section, key,
                 value);
        return -1;
    }
    if ((k->type == K_INT || k->type == K_LONG) && d != floor(d)) {
        snprintf(err, errlen, "config: %s.%s = '%s' is not an integer", section, key, value);
        return -1;
    }
    if (d < k->min || d > k->max) {
        snprintf(err, errlen, "config: %s.%s = %s is out of range [%.10g, %.10g]", section, key, value, k->min, k->max);
        return -1;
    }
    if (k->type == K_INT) *(int *)field = (int)d;
    else if (k->type == K_LONG) *(long *)field = (long)d;
    else *(double *)field = d;
    return 0;
}

/* The config file's INI dialect, parsed here. libinih, used before, cut lines at 199
 * characters (the tail was read as a line of its own), joined an indented line to the
 * value above, stopped at a NUL byte and let a repeated key win silently. Here:
 *   [section]        alone on its line (a comment may follow)
 *   key = value      or key: value; the blanks around key and value are dropped
 *   ; or #           a comment line; " ;" (';' after a blank) ends a value, as in inih
 * Lines end in LF or CRLF and may be of any length; a UTF-8 BOM may open the text. A key
 * before any [section], a key set twice and any other line are errors. */

/* Bigger than any config; it also bounds reading /dev/zero or an endless pipe. */
enum { CONFIG_MAX_BYTES = 1 << 20 };

typedef struct {
    gptc_config *c;
    const char *where;        /* the file's path, or "<text>" */
    char *err;
    size_t errlen;
    long line;                /* 1-based number of the line being parsed */
    const char *section;      /* of the last header; NULL before the first */
    long first_line[N_KEYS];  /* the line that set each key of KEYS; 0: not set */
} ini_parser;

static int is_blank(char ch) {
    return ch == ' ' || ch == '\t' || ch == '\r' || ch == '\v' || ch == '\f';
}

/* [s, end) without the blanks at either end, NUL-terminated in place */
static char *trim(char *s, char *end) {
    while (s < end && is_blank(*s)) s++;
    while (end > s && is_blank(end[-1])) end--;
    *end = '\0';
    return s;
}

/* A ';' only starts a comment after a blank, so that "a;b" stays a value. */
static void cut_inline_comment(char *s) {
    for (char *p = s; *p; p++)
        if (*p == ';' && p > s && is_blank(p[-1])) {
            *p = '\0';
            return;
        }
}

static int syntax_error(ini_parser *x, const char *why) {
    snprintf(x->err, x->errlen, "config: %s line %ld: syntax error (%s)", x->where, x->line, why);
    return -1;
}

/* s: a trimmed line that starts with '[' */
static int parse_header(ini_parser *x, char *s) {
    char *close = strchr(s, ']');
    const char *rest = close ? close + 1 : "";
    while (is_blank(*rest)) rest++;
    if (!close || (*rest && *rest != ';' && *rest != '#'))
        return syntax_error(x, "a section header is [name] alone on its line");
    x->section = trim(s + 1, close);
    if (!section_known(x->section)) { /* else a misspelt empty section passes unnoticed */
        snprintf(x->err, x->errlen, "config: %s line %ld: unknown section [%s]", x->where,
                 x->line, x->section);
        return -1;
    }
    return 0;
}

/* s: a trimmed line that is not blank, a comment or a header */
static int parse_pair(ini_parser *x, char *s) {
    char *sep = strpbrk(s, "=:");
    if (!sep || sep == s) return syntax_error(x, "expected key = value, [section] or a comment");
    char *value = trim(sep + 1, sep + 1 + strlen(sep + 1));
    char *key = trim(s, sep);
    if (!x->section) {
        snprintf(x->err, x->errlen, "config: %s line %ld: key %s comes before any [section]",
                 x->where, x->line, key);
        return -1;
    }
    const key_def *k = find_key(x->section, key);
    long *first = k ? &x->first_line[k - KEYS] : NULL;
    if (first && *first) {
        snprintf(x->err, x->errlen, "config: %s line %ld: %s.%s is set twice (first on line %ld)",
                 x->where, x->line, x->section, key, *first);
        return -1;
    }
    char msg[600];
    if (config_set(x->c, x->section, key, value, msg, sizeof(msg)) != 0) {
        /* name the file too: the same key may also come from the command line */
        snprintf(x->err, x->errlen, "%s (in %s)", msg, x->where);
        return -1;
    }
    *first = x->line; /* config_set knew the key, so k is set */
    return 0;
}

static int parse_line(ini_parser *x, char *line) {
    char *s = trim(line, line + strlen(line));
    if (*s == '\0' || *s == ';' || *s == '#') return 0;
    cut_inline_comment(s);
    s = trim(s, s + strlen(s));
    return *s == '[' ? parse_header(x, s) : parse_pair(x, s);
}

static long line_of(const char *text, const char *at) {
    long line = 1;
    for (const char *p = text; p < at; p++) line += *p == '\n';
    return line;
}

/* Parses text[0, len) (text[len] is a NUL), which it cuts into lines in place. */
static int load_ini(gptc_config *c, char *text, size_t len, const char *where, char *err,
                    size_t errlen) {
    const char *nul = memchr(text, '\0', len);
    if (nul) {
        snprintf(err, errlen, "config: %s line %ld: NUL byte (not a text file?)", where,
                 line_of(text, nul));
        return -1;
    }
    ini_parser x = {.c = c, .where = where, .err = err, .errlen = errlen};
    char *p = text, *end = text + len;
    if (len >= 3 && memcmp(p, "\xEF\xBB\xBF", 3) == 0) p += 3;
    for (x.line = 1; p <= end; x.line++) {
        char *eol = memchr(p, '\n', (size_t)(end - p));
        if (!eol) eol = end;
        *eol = '\0';
        if (parse_line(&x, p) != 0) return -1;
        p = eol + 1;
    }
    return 0;
}

int config_load_text(gptc_config *c, const char *text, char *err, size_t errlen) {
    char *copy = strdup(text); /* load_ini cuts its text into lines */
    if (!copy) {
        snprintf(err, errlen, "config: out of memory");
        return -1;
    }
    int rc = load_ini(c, copy, strlen(copy), "<text>", err, errlen);
    free(copy);
    return rc;
}

/* path's contents (malloc'd, NUL-terminated, *len bytes before the NUL), or NULL with
 * errno set: EFBIG past CONFIG_MAX_BYTES. Read to its end rather than by its size, so
 * that a pipe (bash's <(...)) works as a file does; a directory, which fopen opens on
 * Linux, is refused. */
static char *read_text(const char *path, size_t *len) {
    FILE *f = fopen(path, "r");
    if (!f) return NULL;
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) {
        fclose(f);
        errno = EISDIR;
        return NULL;
    }
    size_t n = 0, cap = 4096;
    char *text = malloc(cap); /* [cap], n used, then a NUL */
    while (text) {
        size_t room = cap - 1 - n, got = fread(text + n, 1, room, f);
        n += got;
        if (got < room || n > CONFIG_MAX_BYTES) break; /* the end, an error, or too much */
        /* never more than one byte past the limit: /dev/zero has no end */
        size_t grown_cap = 2 * cap < CONFIG_MAX_BYTES + 2 ? 2 * cap : CONFIG_MAX_BYTES + 2;
        char *grown = realloc(text, grown_cap);
        if (!grown) free(text);
        text = grown;
        cap = grown_cap;
    }
    int e = !text ? ENOMEM : ferror(f) ? EIO : n > CONFIG_MAX_BYTES ? EFBIG : 0;
    fclose(f);
    if (e) {
        free(text);
        errno = e;
        return NULL;
    }
    text[n] = '\0';
    *len = n;
    return text;
}

int config_load(gptc_config *c, const char *path, int argc, char **argv,
                char *err, size_t errlen) {
    if (path) {
        size_t len = 0;
        char *text = read_text(path, &len);
        if (!text && errno == EFBIG) {
            snprintf(err, errlen, "config: %s is larger than 1 MiB (not a config file?)", path);
            return -1;
        }
        if (!text) {
            snprintf(err, errlen, "config: cannot read %s: %s", path, strerror(errno));
            return -1;
        }
        int rc = load_ini(c, text, len, path, err, errlen);
        free(text);
        if (rc != 0) return -1;
        snprintf(c->source, sizeof(c->source), "%s", path);
    }
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        const char *dot = strchr(a, '.'), *eq = strchr(a, '=');
        if (strncmp(a, "--", 2) != 0 || !dot || !eq || dot > eq || dot == a + 2 || eq == dot + 1) {
            snprintf(err, errlen, "config: bad argument '%s' (expected --section.key=value)", a);
            return -1;
        }
        char section[64], key[64];
        size_t ls = (size_t)(dot - a - 2), lk = (size_t)(eq - dot - 1);
        if (ls >= sizeof(section) || lk >= sizeof(key)) {
            snprintf(err, errlen, "config: bad argument '%s' (key too long)", a);
            return -1;
        }
        memcpy(section, a + 2, ls);
        section[ls] = 0;
        memcpy(key, dot + 1, lk);
        key[lk] = 0;
        if (config_set(c, section, key, eq + 1, err, errlen) != 0) return -1;
    }
    return 0;
}

int config_validate(const gptc_config *c, char *err, size_t errlen) {
    if (c->min_lr > c->lr) {
        snprintf(err, errlen, "config: train.min_lr = %g is larger than train.lr = %g", c->min_lr, c->lr);
        return -1;
    }
    if (c->data_path[0] == 0) {
        snprintf(err, errlen, "config: data.path is not set (make a token file with gptc-data)");
        return -1;
    }
    if (strcmp(c->schedule, "interleaved") != 0 && c->virtual_stages != 1) {
        snprintf(err, errlen, "config: parallel.virtual_stages = %d needs parallel.schedule = interleaved",
                 c->virtual_stages);
        return -1;
    }
    return 0;
}

static void print_value(const key_def *k, const gptc_config *c, FILE *out) {
    const char *field = (const char *)c + k->offset;
    switch (k->type) {
    case K_INT: fprintf(out, "%d", *(const int *)field); break;
    case K_LONG: fprintf(out, "%ld", *(const long *)field); break;
    case K_U64: fprintf(out, "%llu", *(const unsigned long long *)field); break;
    case K_DOUBLE: fprintf(out, "%.10g", *(const double *)field); break;
    case K_BOOL: fputs(*(const int *)field ? "true" : "false", out); break;
    default: fputs(field, out); break;
    }
}

void config_print(const gptc_config *c, FILE *out) {
    const char *section = "";
    for (int i = 0; i < N_KEYS; i++) {
        if (strcmp(KEYS[i].section, section) != 0) {
            section = KEYS[i].section;
            fprintf(out, "%s[%s]\n", i ? "\n" : "", section);
        }
        fprintf(out, "%s = ", KEYS[i].key);
        print_value(&KEYS[i], c, out);
        fputc('\n', out);
    }
}
