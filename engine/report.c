/* Every rank turns its summaries into text; rank 0 gathers the text, merges the kernel
 * statistics by name and writes the files. Text keeps the gather to one per section and
 * the files readable by anything that reads JSON. */
#define _POSIX_C_SOURCE 200809L
#include "engine/report.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/log.h"
#include "engine/output_files.h"
#include "engine/timing.h"
#include "engine/watchdog.h"
#include "parallel/comm.h"

/* A growable string. */
typedef struct {
    char *s; /* [cap], n used */
    size_t n, cap;
} text;

static void put(text *t, const char *fmt, ...) {
    va_list ap;
    for (;;) {
        va_start(ap, fmt);
        int k = vsnprintf(t->s ? t->s + t->n : NULL, t->s ? t->cap - t->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) return;
        if (t->s && t->n + (size_t)k < t->cap) {
            t->n += (size_t)k;
            return;
        }
        size_t cap = t->cap ? 2 * t->cap : 65536;
        while (cap < t->n + (size_t)k + 1) cap *= 2;
        t->s = log_realloc(t->s, cap, "the report's text");
        t->cap = cap;
    }
}

/* take of comm_gather_host: appends a rank's text to the text arg */
static int append_text(int rank, const void *bytes, size_t n, void *arg) {
    text *all = arg;
    (void)rank;
    if (all->n + n + 1 > all->cap) {
        all->cap = all->n + n + 1 > 2 * all->cap ? all->n + n + 1 : 2 * all->cap;
        all->s = log_realloc(all->s, all->cap, "the report");
    }
    memcpy(all->s + all->n, bytes, n);
    all->n += n;
    all->s[all->n] = 0;
    return 0;
}

/* Concatenation of every rank's text on rank 0 (NULL elsewhere). In pieces, one rank's at a
 * time (comm_gather_host): eight ranks' traces at their cap pass 2 GiB together, where one
 * MPI_Gatherv's int displacements went negative (rank 0 crashed in it, no report). */
static char *gather_text(comm_group *world, const text *mine, size_t *len) {
    text all = {0};
    append_text(0, "", 0, &all); /* an empty text is "" */
    if (world) comm_gather_host(world, mine->s ? mine->s : "", mine->n, append_text, &all);
    else append_text(0, mine->s ? mine->s : "", mine->n, &all);
    *len = all.n;
    if (world && world->rank != 0) {
        free(all.s);
        return NULL;
    }
    return all.s;
}

/* The line at *p (without its newline) into *line, grown as needed (*cap); moves *p past
 * it. 0, or -1 at the end of the text. Each parse then reads one line: sscanf and strstr
 * on the rest of the whole text went to its end each time, so that the rows of a long
 * run took hours to read (8000 took 31 s, 16000 126 s). */
static int next_line(const char **p, char **line, size_t *cap) {
    static long lines;
    if (!*p || !**p) return -1;
    if (++lines % 65536 == 0) watchdog_beat(); /* a long run's rows take seconds */
    const char *nl = strchr(*p, '\n');
    size_t n = nl ? (size_t)(nl - *p) : strlen(*p);
    if (n + 1 > *cap) {
        *cap = 2 * (n + 1);
        *line = log_realloc(*line, *cap, "the report's lines");
    }
    memcpy(*line, *p, n);
    (*line)[n] = 0;
    *p += nl ? n + 1 : n;
    return 0;
}

/* ------------------------------------------------------------------ kernels */

/* A kernel's statistics merged over ranks (timing_kernel_stats), at one of three levels:
 * per parallelism and call size (as a rank keeps them), per parallelism (call_bytes NAN),
 * or over both (par -1 too). */
typedef struct {
    char name[64];
    int kind, probe;
    int par;           /* timing_par, or -1: every parallelism's instances together */
    double call_bytes; /* bytes of one call, or NAN: every size together */
    timing_split s, wait, moving;
    double flops, bytes; /* timing_work summed over the s.count instances */
    double moving_bytes; /* over the moving.count instances */
    long all_wait;       /* timing_kernel_stats.all_wait */
} merged_kernel;

enum { BY_SIZE, BY_PAR, BY_NAME }; /* the levels of merged_kernel, finest first */

/* Do x and y count instances of the same kernel (name, kind, probe)? */
static int same_kernel(const merged_kernel *x, const merged_kernel *y) {
    return x->kind == y->kind && x->probe == y->probe && strcmp(x->name, y->name) == 0;
}

static void split_merge(timing_split *into, const timing_split *x) {
    into->count += x->count;
    into->sum_us += x->sum_us;
    into->n_isolated += x->n_isolated;
    into->isolated_us += x->isolated_us;
    into->n_overlapped += x->n_overlapped;
    into->overlapped_us += x->overlapped_us;
}

/* Adds r into k[0..*n), to the entry that counts it at `level`, or to a new one; returns k,
 * grown as needed (*cap). */
static merged_kernel *add_kernel(merged_kernel *k, int *n, int *cap, const merged_kernel *r,
                                 int level) {
    int i = 0;
    while (i < *n && !(same_kernel(&k[i], r) && (level == BY_NAME || k[i].par == r->par) &&
                       (level != BY_SIZE || k[i].call_bytes == r->call_bytes)))
        i++;
    if (i == *n) {
        if (*n == *cap) {
            *cap = *cap ? 2 * *cap : 64;
            k = log_realloc(k, sizeof(*k) * (size_t)*cap, "the report's kernels");
        }
        k[(*n)++] = *r;
        if (level != BY_SIZE) k[i].call_bytes = NAN;
        if (level == BY_NAME) k[i].par = -1;
        return k;
    }
    split_merge(&k[i].s, &r->s);
    split_merge(&k[i].wait, &r->wait);
    split_merge(&k[i].moving, &r->moving);
    k[i].flops += r->flops;
    k[i].bytes += r->bytes;
    k[i].moving_bytes += r->moving_bytes;
    k[i].all_wait += r->all_wait;
    return k;
}

/* " count sum n_iso iso n_ovl ovl" of a split, as kernels_text writes it */
static void put_split(char *buf, size_t len, const timing_split *x) {
    snprintf(buf, len, " %ld %.6f %ld %.6f %ld %.6f", x->count, x->sum_us, x->n_isolated,
             x->isolated_us, x->n_overlapped, x->overlapped_us);
}

static int scan_split(const char **p, timing_split *x) {
    int used = 0;
    if (sscanf(*p, " %ld %lf %ld %lf %ld %lf%n", &x->count, &x->sum_us, &x->n_isolated,
               &x->isolated_us, &x->n_overlapped, &x->overlapped_us, &used) != 6)
        return -1;
    *p += used;
    return 0;
}

/* Every rank's kernel lines merged at the three levels */
typedef struct {
    merged_kernel *at[3]; /* [BY_SIZE], [BY_PAR], [BY_NAME] */
    int n[3];
} merged_kernels;

static void merge_kernels(const char *lines, merged_kernels *m) {
    int cap[3] = {0};
    memset(m, 0, sizeof(*m));
    char *line = NULL;
    size_t line_cap = 0;
    for (const char *p = lines; next_line(&p, &line, &line_cap) == 0;) {
        merged_kernel r = {0};
        int used = 0;
        const char *q = line;
        if (sscanf(q, "%63s %d %d %d %lf %lf %lf %lf %ld%n", r.name, &r.kind, &r.probe, &r.par,
                   &r.call_bytes, &r.flops, &r.bytes, &r.moving_bytes, &r.all_wait, &used) != 9)
            break;
        q += used;
        if (scan_split(&q, &r.s) || scan_split(&q, &r.wait) || scan_split(&q, &r.moving)) break;
        m->at[BY_SIZE] = add_kernel(m->at[BY_SIZE], &m->n[BY_SIZE], &cap[BY_SIZE], &r, BY_SIZE);
    }
    free(line);
    for (int level = BY_PAR; level <= BY_NAME; level++)
        for (int i = 0; i < m->n[BY_SIZE]; i++)
            m->at[level] = add_kernel(m->at[level], &m->n[level], &cap[level],
                                      &m->at[BY_SIZE][i], level);
}

static void free_kernels(merged_kernels *m) {
    for (int level = 0; level < 3; level++) free(m->at[level]);
}

/* A kernel's mean, isolated and overlapped means and their ratio (slowdown); NAN where it
 * has no such instances. */
typedef struct {
    double mean, iso, ovl, slow;
} split_means;

static split_means means_of_split(const timing_split *x) {
    split_means m = {x->count ? x->sum_us / x->count : NAN,
                     x->n_isolated ? x->isolated_us / x->n_isolated : NAN,
                     x->n_overlapped ? x->overlapped_us / x->n_overlapped : NAN, NAN};
    /* an isolated mean of 0 has no ratio: null, not an inf that is no JSON */
    if (x->n_isolated && x->n_overlapped && m.iso > 0) m.slow = m.ovl / m.iso;
    return m;
}

/* A slowdown from fewer instances than this on either side is marked: one slow call beside
 * a burst of communication is not a contention figure */
enum { FEW_INSTANCES = 10 };

static int few(const timing_split *x) {
    return x->n_isolated < FEW_INSTANCES || x->n_overlapped < FEW_INSTANCES;
}

/* A kernel's rates over its instances (engine/timing.h: timing_work): TFLOP/s of its
 * products and GB/s of its bytes, NAN where it counts none; a communication op's GB/s
 * over the time its data moved (its waits for other ranks left out) where they are known */
typedef struct {
    double tflops, gbps, gbps_moving;
} kernel_rates;

static kernel_rates rates_of(const merged_kernel *x) {
    int timed = x->s.count > 0 && x->s.sum_us > 0, moved = x->moving.sum_us > 0;
    return (kernel_rates){timed && x->flops > 0 ? x->flops / x->s.sum_us / 1e6 : NAN,
                          timed && x->bytes > 0 ? x->bytes / x->s.sum_us / 1e3 : NAN,
                          moved && x->moving_bytes > 0 ? x->moving_bytes / x->moving.sum_us / 1e3
                                                       : NAN};
}

/* v printed with fmt into buf[32], or `none` when v is NAN or infinite (JSON has neither) */
static const char *num(char *buf, const char *fmt, double v, const char *none) {
    if (!isfinite(v)) return none;
    snprintf(buf, 32, fmt, v);
    return buf;
}

/* "count", "n_isolated", "n_overlapped", "mean_us", "isolated_mean_us",
 * "overlapped_mean_us" and "slowdown" of x: null where a mean has no instances */
static void put_means(text *t, const timing_split *x) {
    split_means m = means_of_split(x);
    char a[32], b[32], c[32], d[32];
    put(t, "\"count\": %ld, \"n_isolated\": %ld, \"n_overlapped\": %ld, \"mean_us\": %s, "
           "\"isolated_mean_us\": %s, \"overlapped_mean_us\": %s, \"slowdown\": %s",
        x->count, x->n_isolated, x->n_overlapped, num(d, "%.4f", m.mean, "null"),
        num(a, "%.4f", m.iso, "null"), num(b, "%.4f", m.ovl, "null"),
        num(c, "%.4f", m.slow, "null"));
}

static int by_total(const void *a, const void *b) {
    double x = ((const merged_kernel *)a)->s.sum_us, y = ((const merged_kernel *)b)->s.sum_us;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* bytes in decimal units, to `digits` significant digits, into buf[32] */
static const char *size_text(char *buf, double bytes, int digits) {
    /* past four, trailing zeros kept: "12.620 MB" beside "12.621 MB", not "12.62 MB" */
    double v = bytes >= 1e9 ? bytes / 1e9 : bytes >= 1e6 ? bytes / 1e6 : bytes / 1e3;
    const char *unit = bytes >= 1e9 ? "GB" : bytes >= 1e6 ? "MB" : "KB";
    if (bytes < 1e3) snprintf(buf, 32, "%.0f B", bytes);
    else snprintf(buf, 32, digits > 4 ? "%#.*g %s" : "%.*g %s", digits, v, unit);
    return buf;
}

/* Means over the step rows of every rank, for the policy's steps and for the
 * contention probe's serialized steps. */
typedef struct {
    long n;
    double iter, compute, comm, exposed, ideal; /* ideal = max(compute, comm) */
    double par_comm[TIMING_PARS], par_exposed[TIMING_PARS]; /* by timing_par, as in a row */
    /* the exposed time lost waiting for other ranks (timing_step_summary's wait_ms), over
     * the n_wait rows that know it: NAN where none does */
    long n_wait;
    double wait, par_wait[TIMING_PARS];
    double exposed_w; /* exposed over the same n_wait rows, what the wait is a part of */
    /* the rows' iter_ms: their median; how many took over SLOW_ROW times it, the longest of
     * them; and the run's first step (warm-up included) */
    double median;
    long n_slow, slow_step, first_step;
    int slow_rank;
    double slow_ms;
} step_means;

/* A step row over this many times the median is named: a first step that loads, plans
 * and touches memory moves a mean of few steps far from the typical step */
#define SLOW_ROW 3.0

typedef struct {
    double ms;
    long step;
    int rank;
} row_time;

static int by_ms(const void *a, const void *b) {
    double x = ((const row_time *)a)->ms, y = ((const row_time *)b)->ms;
    return x < y ? -1 : x > y;
}

/* m's median and slow rows from its rows' times t[n] (sorted here) */
static void median_and_slow(row_time *t, long n, step_means *m) {
    m->median = NAN;
    if (n == 0) return;
    qsort(t, (size_t)n, sizeof(*t), by_ms);
    m->median = n % 2 ? t[n / 2].ms : (t[n / 2 - 1].ms + t[n / 2].ms) / 2;
    for (long i = 0; i < n; i++)
        if (t[i].ms > SLOW_ROW * m->median) m->n_slow++;
    if (m->n_slow) {
        m->slow_ms = t[n - 1].ms;
        m->slow_step = t[n - 1].step;
        m->slow_rank = t[n - 1].rank;
    }
}

/* The number after "key": in the row from `row` to `end`; 0 when it is there */
static int row_number(const char *row, const char *end, const char *key, double *v) {
    char k[64];
    snprintf(k, sizeof(k), "\"%.40s\": ", key);
    const char *q = strstr(row, k);
    return q && (!end || q < end) && sscanf(q + strlen(k), "%lf", v) == 1 ? 0 : -1;
}

static void add_wait_means(const char *row, const char *end, double exposed, step_means *m) {
    double w;
    if (row_number(row, end, "comm_wait_ms", &w) != 0) return;
    m->n_wait++;
    m->wait += w;
    m->exposed_w += exposed;
    for (int par = TP_DP; par < TIMING_PARS; par++) {
        char key[48];
        snprintf(key, sizeof(key), "%s_comm_wait_ms", timing_par_name(par));
        if (row_number(row, end, key, &w) == 0) m->par_wait[par] += w;
    }
}

/* Adds a step row's "<par>_comm_ms" and "<par>_exposed_comm_ms" to m; the row runs from
 * `row` (its "iter_ms") to `end` (its closing brace). */
static void add_par_means(const char *row, const char *end, step_means *m) {
    for (int par = TP_DP; par < TIMING_PARS; par++) {
        char comm[48], exposed[48];
        snprintf(comm, sizeof(comm), "%s_comm_ms", timing_par_name(par));
        snprintf(exposed, sizeof(exposed), "%s_exposed_comm_ms", timing_par_name(par));
        double c, e;
        if (row_number(row, end, comm, &c) != 0 || row_number(row, end, exposed, &e) != 0)
            continue;
        m->par_comm[par] += c;
        m->par_exposed[par] += e;
    }
}

static void mean_steps(const char *rows, int probe, step_means *m) {
    memset(m, 0, sizeof(*m));
    m->first_step = -1;
    char *line = NULL; /* one row a line */
    size_t line_cap = 0;
    row_time *times = NULL; /* [n] */
    size_t times_cap = 0;
    for (const char *q = rows; next_line(&q, &line, &line_cap) == 0;) {
        const char *p = strstr(line, "\"iter_ms\": ");
        long step;
        int rank;
        if (!p || sscanf(line, " {\"step\": %ld, \"rank\": %d", &step, &rank) != 2) continue;
        if (m->first_step < 0 || step < m->first_step) m->first_step = step;
        double a, b, c, d;
        char flag[8] = "", warm[8] = "";
        if (sscanf(p, "\"iter_ms\": %lf, \"compute_ms\": %lf, \"comm_ms\": %lf, "
                      "\"exposed_comm_ms\": %lf, \"probe\": %7[a-z], \"warmup\": %7[a-z]",
                   &a, &b, &c, &d, flag, warm) < 5 || (strcmp(flag, "true") == 0) != probe ||
            strcmp(warm, "true") == 0) /* warm-up steps: in the list, not in the means */
            continue;
        if ((size_t)m->n == times_cap) {
            times_cap = times_cap ? 2 * times_cap : 1024;
            times = log_realloc(times, times_cap * sizeof(*times), "the report's step times");
        }
        times[m->n] = (row_time){a, step, rank};
        m->n++;
        m->iter += a;
        m->compute += b;
        m->comm += c;
        m->exposed += d;
        m->ideal += b > c ? b : c;
        add_par_means(p, strchr(p, '}'), m);
        add_wait_means(p, strchr(p, '}'), d, m);
    }
    median_and_slow(times, m->n, m);
    free(times);
    free(line);
    if (m->n) {
        m->iter /= m->n;
        m->compute /= m->n;
        m->comm /= m->n;
        m->exposed /= m->n;
        m->ideal /= m->n;
        for (int par = 0; par < TIMING_PARS; par++) {
            m->par_comm[par] /= m->n;
            m->par_exposed[par] /= m->n;
        }
    }
    m->wait = m->n_wait ? m->wait / m->n_wait : NAN;
    m->exposed_w = m->n_wait ? m->exposed_w / m->n_wait : NAN;
    for (int par = 0; par < TIMING_PARS; par++)
        m->par_wait[par] = m->n_wait ? m->par_wait[par] / m->n_wait : NAN;
}

/* The part of a step when no timed op was in flight: on a GPU, the device waiting for the
 * host (launches, syncs, the step's own bookkeeping before its last sync). iter_ms is the
 * host's clock and the unions the device's, so a rounding may dip below 0. */
static double idle_ms(const step_means *m) {
    double idle = m->iter - m->compute - m->exposed;
    return idle > 0 ? idle : 0.0;
}

/* The work of a step and rank (means over the policy steps' rows): the compute ops'
 * flops and bytes, and the bytes communicated */
typedef struct {
    double flops, bytes, comm_bytes;
} step_work;

static step_work work_per_step(const merged_kernel *k, int n, long rows) {
    step_work w = {0};
    for (int i = 0; rows && i < n; i++) {
        if (k[i].probe) continue;
        if (k[i].kind == TK_COMM) {
            w.comm_bytes += k[i].bytes / rows;
        } else {
            w.flops += k[i].flops / rows;
            w.bytes += k[i].bytes / rows;
        }
    }
    return w;
}

/* x's statistics in the contention probe's steps, or NULL: none, or calls of another size
 * there (overlap.tp = chunked: a probe step runs each product whole, the policy in row
 * pieces, and their ratio would measure the pieces, not the policy) */
static const merged_kernel *probe_twin(const merged_kernel *k, int n, const merged_kernel *x) {
    for (int i = 0; i < n; i++) {
        if (!k[i].probe || k[i].kind != x->kind || strcmp(k[i].name, x->name) != 0) continue;
        double b = x->bytes / x->s.count, bp = k[i].bytes / k[i].s.count;
        return fabs(b - bp) <= 1e-6 * (b > bp ? b : bp) ? &k[i] : NULL;
    }
    return NULL;
}

/* "12.34", with a '*' when it comes from few instances (FEW_INSTANCES) */
static const char *slowdown_text(char *buf, double slow, const timing_split *x) {
    if (!isfinite(slow)) return "-";
    snprintf(buf, 32, "%.2f%s", slow, few(x) ? "*" : "");
    return buf;
}

/* x's row of the table; probe: its twin in the contention probe's steps, or NULL. A ratio
 * to a probe mean of few instances is marked as a slowdown is: the probe steps are few. */
static void print_row(const char *name, const char *kind, const merged_kernel *x,
                      const merged_kernel *probe) {
    split_means m = means_of_split(&x->s), mv = means_of_split(&x->moving);
    kernel_rates r = rates_of(x);
    double wait = means_of_split(&x->wait).mean;
    double probe_mean = probe ? means_of_split(&probe->s).mean : NAN;
    char a[32], b[32], c[32], d[32], e[32], f[32], g[32], h[32], n[48], w[32];
    snprintf(n, sizeof n, "%ld/%ld", x->s.n_isolated, x->s.n_overlapped);
    if (probe && isfinite(m.mean / probe_mean))
        snprintf(e, sizeof e, "%.2f%s", m.mean / probe_mean,
                 probe->s.count < FEW_INSTANCES ? "*" : "");
    else
        probe = NULL; /* no ratio to give */
    printf("%-26s %-7s %8ld %11.2f %10.1f %8s %8s %13s %11s %11s %9s %9s %10s %8s %8s\n", name,
           kind, x->s.count, x->s.sum_us / 1e3, m.mean, num(f, "%.2f", r.tflops, "-"),
           num(g, "%.1f", x->kind == TK_COMM && !isnan(r.gbps_moving) ? r.gbps_moving : r.gbps, "-"),
           n, num(a, "%.1f", m.iso, "-"), num(b, "%.1f", m.ovl, "-"),
           slowdown_text(c, m.slow, &x->s), slowdown_text(w, mv.slow, &x->moving),
           num(d, "%.1f", probe_mean, "-"), probe ? e : "-",
           num(h, "%.0f%%", m.mean > 0 ? 100.0 * wait / m.mean : NAN, "-"));
}

/* Is s (at the BY_SIZE level) calls of one size of x (one name, and par unless it is -1)? */
static int size_of(const merged_kernel *s, const merged_kernel *x) {
    return same_kernel(s, x) && (x->par < 0 || s->par == x->par);
}

/* The rows of x's calls of each size (k: the merged kernels' BY_SIZE level), named
 * `indent` and the size, where x (one name, and par unless it is -1) ran calls of several
 * sizes and has a slowdown: it mixes the sizes of its isolated and overlapped calls. */
static void print_size_rows(const merged_kernel *x, const merged_kernel *k, int n,
                            const char *indent) {
    enum { SHOWN = 6 };
    int sizes = 0, shown = 0;
    for (int i = 0; i < n; i++) sizes += size_of(&k[i], x);
    if (sizes < 2 || isnan(means_of_split(&x->s).slow)) return;
    /* four digits, or as many more as it takes to tell x's sizes apart: a layer's
     * LayerNorm gradient and the final one's differ by a few KB in tens of MB */
    int digits = 4;
    for (int clash = 1; clash && digits < 12;) {
        clash = 0;
        for (int i = 0; i < n && !clash; i++)
            for (int j = i + 1; j < n && !clash; j++) {
                if (!size_of(&k[i], x) || !size_of(&k[j], x)) continue;
                char si[32], sj[32];
                clash = strcmp(size_text(si, k[i].call_bytes, digits),
                               size_text(sj, k[j].call_bytes, digits)) == 0;
            }
        if (clash) digits++;
    }
    for (int i = 0; i < n && shown < SHOWN; i++) {
        if (!size_of(&k[i], x)) continue;
        char name[64], sz[32];
        snprintf(name, sizeof name, "%s%s", indent, size_text(sz, k[i].call_bytes, digits));
        print_row(name, "", &k[i], NULL);
        shown++;
    }
    if (sizes > shown) printf("%s(%d more sizes in the report's by_size)\n", indent, sizes - shown);
}

/* A comm op's parallelism in the table: "world" for the reductions over every rank (the
 * loss's and the gradient norm's, on the host), not "none", which reads as a policy */
static const char *par_label(int par) { return par == TP_NONE ? "world" : timing_par_name(par); }

/* One parallelism's communication measured alone, and its part waiting for a rank */
static void print_par_line(const step_means *pol, int par) {
    char w[96] = "";
    if (!isnan(pol->par_wait[par]))
        snprintf(w, sizeof(w), ", %.2f ms of it waiting for another rank", pol->par_wait[par]);
    printf("  %s communication alone: %.2f ms, exposed %.2f ms (%.0f%% hidden)%s\n",
           timing_par_name(par), pol->par_comm[par], pol->par_exposed[par],
           100.0 * (pol->par_comm[par] - pol->par_exposed[par]) / pol->par_comm[par], w);
}

/* The table on stdout. A communication op is named with its parallelism, or when several
 * parallelisms run it (a tp and a dp all-reduce), followed by a row for each; an op whose
 * calls differ in size is followed by a row for each size where its slowdown mixes them. */
static void print_table(const merged_kernels *mk, const step_means *pol, const step_means *probe,
                        const step_work *work, int ranks, long dropped, long omitted,
                        const long untimed[2]) {
    const merged_kernel *k = mk->at[BY_NAME], *kp = mk->at[BY_PAR], *ks = mk->at[BY_SIZE];
    int n = mk->n[BY_NAME], np = mk->n[BY_PAR], ns = mk->n[BY_SIZE];
    printf("\n# per-kernel timing (all ranks; 'overlapped' = ran while the other kind was in "
           "flight; n iso/ovl = the instances of each; slowdown = overlapped / isolated mean, "
           "'*' from fewer than %d of either, or for 'vs probe' of the probe's)\n", FEW_INSTANCES);
    printf("# communication: GB/s and 'excl wait' count each call's time after the last rank "
           "it needs had started it (its duration less its wait; on an oversubscribed CPU it "
           "includes a peer descheduled after it started), 'excl wait' that time's slowdown, "
           "overlapped when compute ran beside it; 'waiting' = the wait's share of the mean\n");
    if (timing_warmup() > 0)
        printf("# the run's first %d step(s) left out as warm-up (profile.warmup): they are "
               "in the trace only\n", timing_warmup());
    printf("%-26s %-7s %8s %11s %10s %8s %8s %13s %11s %11s %9s %9s %10s %8s %8s\n", "kernel",
           "kind", "count", "total ms", "mean us", "TFLOP/s", "GB/s", "n iso/ovl", "isolated",
           "overlapped", "slowdown", "excl wait", "probe us", "vs probe", "waiting");
    int rows = 0;
    for (int i = 0; i < n; i++) {
        if (k[i].probe) continue;
        rows++;
        const merged_kernel *t = probe_twin(k, n, &k[i]), *only = NULL;
        int pars = 0;
        for (int j = 0; j < np; j++)
            if (same_kernel(&kp[j], &k[i])) pars++, only = &kp[j];
        char name[96];
        if (k[i].kind == TK_COMM && pars == 1)
            snprintf(name, sizeof(name), "%s [%s]", k[i].name, par_label(only->par));
        else
            snprintf(name, sizeof(name), "%s", k[i].name);
        print_row(name, timing_kind_name(k[i].kind), &k[i], t);
        if (k[i].kind != TK_COMM || pars == 1) {
            print_size_rows(&k[i], ks, ns, "  ");
            continue;
        }
        for (int j = 0; j < np; j++)
            if (same_kernel(&kp[j], &k[i])) {
                snprintf(name, sizeof(name), "  [%s]", par_label(kp[j].par));
                print_row(name, "", &kp[j], NULL);
                print_size_rows(&kp[j], ks, ns, "    ");
            }
    }
    if (!rows) /* rather than a header over nothing */
        printf("(no kernel rows: %s)\n", timing_n_steps() == 0
                   ? "no step ran"
                   : "no step ran outside the warm-up and the contention probes");
    if (pol->n)
        printf("per step and rank (mean of %ld over %d rank(s)): iter %.2f ms (median %.2f), "
               "compute %.2f ms, comm %.2f ms, exposed comm %.2f ms (%.0f%% of comm hidden), "
               "nothing timed in flight %.2f ms\n",
               pol->n, ranks, pol->iter, pol->median, pol->compute, pol->comm, pol->exposed,
               pol->comm > 0 ? 100.0 * (pol->comm - pol->exposed) / pol->comm : 0.0, idle_ms(pol));
    if (pol->n_slow) {
        /* the first steps of a run (loads, plans, first touches) are the usual cause */
        long k = pol->slow_step - pol->first_step + 1;
        printf("  %ld step row(s) took over %.0fx the median (the longest: step %ld on rank %d, "
               "%.2f ms): the means include them", pol->n_slow, SLOW_ROW, pol->slow_step,
               pol->slow_rank, pol->slow_ms);
        if (k >= 1 && k <= 3) printf("; --profile.warmup=%ld leaves the run's first %ld out", k, k);
        printf("\n");
    }
    if (pol->n && !isnan(pol->wait) && pol->exposed_w > 0)
        printf("  of the exposed comm, %.2f ms (%.0f%%) waited for another rank to arrive (a "
               "pipeline bubble, a slower rank) with no data moving\n",
               pol->wait, 100.0 * pol->wait / pol->exposed_w);
    if (pol->n && pol->iter > 0)
        printf("work per step and rank: %.2f GFLOP in products (%.2f TFLOP/s over the step), "
               "%.3f GB moved by compute, %.3f GB communicated\n",
               work->flops / 1e9, work->flops / pol->iter / 1e9, work->bytes / 1e9,
               work->comm_bytes / 1e9);
    for (int par = TP_DP; pol->n && par < TIMING_PARS; par++)
        if (pol->par_comm[par] > 0) print_par_line(pol, par);
    if (probe->n && pol->n) {
        double gain = probe->iter / pol->iter;
        char how[64] = "about as fast as serialized"; /* within 1%: noise on most machines */
        if (fabs(gain - 1) >= 0.01)
            snprintf(how, sizeof how, "%.2fx %s than serialized", gain >= 1 ? gain : 1 / gain,
                     gain >= 1 ? "faster" : "slower");
        printf("contention probe (%ld serialized step rows): iter %.2f ms (median %.2f), ideal "
               "max(compute, comm) %.2f ms; with the policies the step is %s (gain %.2fx)\n",
               probe->n, probe->iter, probe->median, probe->ideal, how, gain);
    }
    else if (probe->n) /* every step a probe (or a warm-up): no gain to give */
        printf("contention probe (%ld serialized step rows): iter %.2f ms, ideal max(compute, comm) "
               "%.2f ms; no step ran with the policies to compare\n",
               probe->n, probe->iter, probe->ideal);
    if (dropped)
        printf("%ld record(s) dropped untimed: more ops in a step than the timing could hold\n",
               dropped);
    if (omitted)
        printf("%ld record(s) timed but left out of the trace: past its cap (2e6 records per rank)\n",
               omitted);
    /* a collective always launches work: if none was seen, the figures above lack it */
    if (untimed[1])
        printf("%ld communication record(s) untimed: the device timer saw no work of theirs "
               "(GPTC_TIMER=events times them), and every figure above leaves them out\n",
               untimed[1]);
}

/* ------------------------------------------------------------------ device kernels */

/* one op's kernel, merged over ranks (us) */
typedef struct {
    char op[64], kernel[256];
    timing_split s;
    double op_sum; /* of every kernel of its op: the table's order */
} merged_device;

static void device_text(text *t) {
    const timing_device_kernel *d = timing_device_kernels();
    for (int i = 0; i < timing_n_device_kernels(); i++) {
        char sp[160];
        put_split(sp, sizeof sp, &d[i].s);
        put(t, "%s %s%s\n", d[i].op, d[i].kernel, sp);
    }
}

static int by_op_then_kernel(const void *a, const void *b) {
    const merged_device *x = a, *y = b;
    if (x->op_sum != y->op_sum) return x->op_sum < y->op_sum ? 1 : -1;
    int c = strcmp(x->op, y->op);
    if (c) return c;
    return x->s.sum_us < y->s.sum_us ? 1 : x->s.sum_us > y->s.sum_us ? -1 : 0;
}

/* Every rank's lines merged by op and kernel, the ops with the most device time first
 * and each op's kernels by time; returns the length of *out. */
static int merge_device(const char *lines, merged_device **out) {
    merged_device *d = NULL;
    int n = 0, cap = 0;
    char *line = NULL;
    size_t line_cap = 0;
    for (const char *p = lines; next_line(&p, &line, &line_cap) == 0;) {
        merged_device r = {0};
        int used = 0;
        const char *q = line;
        if (sscanf(q, "%63s %255s%n", r.op, r.kernel, &used) != 2) break;
        q += used;
        if (scan_split(&q, &r.s) != 0) break;
        int i = 0;
        while (i < n && !(strcmp(d[i].op, r.op) == 0 && strcmp(d[i].kernel, r.kernel) == 0)) i++;
        if (i == n) {
            if (n == cap) {
                cap = cap ? 2 * cap : 64;
                d = log_realloc(d, sizeof(*d) * (size_t)cap, "the report's device kernels");
            }
            d[n++] = r;
        } else {
            split_merge(&d[i].s, &r.s);
        }
    }
    free(line);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++)
            if (strcmp(d[i].op, d[j].op) == 0) d[i].op_sum += d[j].s.sum_us;
    if (n) qsort(d, (size_t)n, sizeof(*d), by_op_then_kernel);
    *out = d;
    return n;
}

/* How many times op ran (policy steps, every kind), from the merged kernel statistics;
 * 0 for work outside the ops. */
static long op_count(const merged_kernel *k, int n, const char *op) {
    long c = 0;
    for (int i = 0; i < n; i++)
        if (!k[i].probe && strcmp(k[i].name, op) == 0) c += k[i].s.count;
    return c;
}

static void device_json(text *t, const merged_device *d, int n, const merged_kernel *k, int nk,
                        long rows) {
    for (int i = 0; i < n; i++) {
        long calls = op_count(k, nk, d[i].op);
        char a[32];
        put(t, "    {\"op\": \"%s\", \"kernel\": \"%s\", ", d[i].op, d[i].kernel);
        put_means(t, &d[i].s);
        put(t, ", \"total_us_per_step\": %.4f, \"per_op_call\": %s}%s\n",
            rows ? d[i].s.sum_us / rows : 0.0,
            num(a, "%.4f", calls ? (double)d[i].s.count / calls : NAN, "null"), i + 1 < n ? "," : "");
    }
}

enum { DEVICE_ROWS = 48, DEVICE_NAME_COLS = 64 };

static void print_device(const merged_device *d, int n, const merged_kernel *k, int nk,
                         long rows) {
    if (n == 0) return;
    printf("\n# device kernels behind each op (CUPTI records, all ranks; '%s' = launched "
           "outside every op)\n", TIMING_NO_OP);
    printf("%-20s %-*s %8s %10s %9s %8s\n", "op", DEVICE_NAME_COLS, "kernel", "per call",
           "mean us", "ms/step", "slowdown");
    for (int i = 0; i < n && i < DEVICE_ROWS; i++) {
        long calls = op_count(k, nk, d[i].op);
        char a[32], name[DEVICE_NAME_COLS + 1];
        size_t len = strlen(d[i].kernel), half = DEVICE_NAME_COLS / 2 - 1;
        if (len > DEVICE_NAME_COLS) { /* long cuBLAS names: the start, then the end */
            memcpy(name, d[i].kernel, half);
            memcpy(name + half, "..", 2);
            memcpy(name + half + 2, d[i].kernel + len - half, half + 1); /* its NUL too */
        } else {
            memcpy(name, d[i].kernel, len + 1);
        }
        int same_op = i > 0 && strcmp(d[i - 1].op, d[i].op) == 0;
        char b[32];
        printf("%-20s %-*s %8s %10.1f %9.3f %8s\n", same_op ? "" : d[i].op, DEVICE_NAME_COLS,
               name, num(a, "%.2f", calls ? (double)d[i].s.count / calls : NAN, "-"),
               d[i].s.count ? d[i].s.sum_us / d[i].s.count : 0.0,
               rows ? d[i].s.sum_us / rows / 1e3 : 0.0, slowdown_text(b, means_of_split(&d[i].s).slow, &d[i].s));
    }
    if (n > DEVICE_ROWS)
        printf("(%d more in the report's device_kernels)\n", n - DEVICE_ROWS);
}

/* ------------------------------------------------------------------ writing */

/* path = the parts, in order, up to a NULL; the earlier file is replaced only once the new
 * one is whole (output_whole). Parts, not one formatted string: vsnprintf stops at INT_MAX
 * bytes, which a long run's step rows can pass. */
static int write_file(const char *path, const char *what, const char *const *parts, char *err,
                      size_t errlen) {
    output_whole o;
    char why[512];
    double bytes = 0;
    for (int i = 0; parts[i]; i++) bytes += (double)strlen(parts[i]);
    watchdog_hold(watchdog_io_s(bytes));
    if (output_whole_open(&o, path, why, sizeof why) != 0) {
        snprintf(err, errlen, "profile.%s %s: cannot write: %s", what, path, why);
        return -1;
    }
    for (int i = 0; parts[i]; i++) fputs(parts[i], o.f);
    if (output_whole_close(&o, why, sizeof why) != 0) {
        snprintf(err, errlen, "profile.%s %s: write failed: %s", what, path, why);
        return -1;
    }
    return 0;
}

/* ", flops_per_call, bytes_per_call, tflops, gbps" of x (engine/timing.h: timing_work) */
static void put_work(text *t, const merged_kernel *x) {
    kernel_rates r = rates_of(x);
    char a[32], b[32];
    put(t, ", \"flops_per_call\": %.17g, \"bytes_per_call\": %.17g, \"tflops\": %s, \"gbps\": %s",
        x->s.count ? x->flops / x->s.count : 0.0, x->s.count ? x->bytes / x->s.count : 0.0,
        num(a, "%.6g", r.tflops, "null"), num(b, "%.6g", r.gbps, "null"));
}

/* "key": v to the given decimals, null where there is none (a reading that failed, a
 * mean of no steps: NaN); the first of an object (after its "{") has no comma */
static void put_number(text *t, const char *key, double v, int decimals) {
    const char *sep = t->n > 0 && t->s[t->n - 1] == '{' ? "" : ", ";
    if (isfinite(v)) put(t, "%s\"%s\": %.*f", sep, key, decimals, v);
    else put(t, "%s\"%s\": null", sep, key);
}

static void steps_text(text *t, int rank) {
    const timing_step_summary *s = timing_steps();
    for (int i = 0; i < timing_n_steps(); i++) {
        put(t, "    {\"step\": %ld, \"rank\": %d, \"iter_ms\": %.4f, \"compute_ms\": %.4f, "
               "\"comm_ms\": %.4f, \"exposed_comm_ms\": %.4f, \"probe\": %s",
            s[i].step, rank, s[i].iter_ms, s[i].compute_ms, s[i].comm_ms, s[i].exposed_comm_ms,
            s[i].probe ? "true" : "false");
        if (s[i].warmup) put(t, ", \"warmup\": true");
        for (int par = TP_DP; par < TIMING_PARS; par++)
            put(t, ", \"%s_comm_ms\": %.4f, \"%s_exposed_comm_ms\": %.4f", timing_par_name(par),
                s[i].par_comm_ms[par], timing_par_name(par), s[i].par_exposed_ms[par]);
        if (s[i].has_wait) {
            put_number(t, "comm_wait_ms", s[i].wait_ms, 4);
            for (int par = TP_DP; par < TIMING_PARS; par++) {
                char key[48];
                snprintf(key, sizeof(key), "%s_comm_wait_ms", timing_par_name(par));
                put_number(t, key, s[i].par_wait_ms[par], 4);
            }
        }
        if (s[i].has_power) {
            put_number(t, "energy_j", s[i].energy_j, 3);
            put_number(t, "power_w", s[i].power_w, 3);
            put_number(t, "sm_clock_mhz", s[i].sm_clock_mhz, 3);
        }
        put(t, "},\n");
    }
}

static void kernels_text(text *t) {
    const timing_kernel_stats *k = timing_kernels();
    for (int i = 0; i < timing_n_kernels(); i++) {
        char sp[3][160];
        put_split(sp[0], sizeof sp[0], &k[i].s);
        put_split(sp[1], sizeof sp[1], &k[i].wait);
        put_split(sp[2], sizeof sp[2], &k[i].moving);
        put(t, "%s %d %d %d %.17g %.17g %.17g %.17g %ld%s%s%s\n", k[i].name, k[i].kind,
            k[i].probe, k[i].par, k[i].call_bytes, k[i].flops, k[i].bytes, k[i].moving_bytes,
            k[i].all_wait, sp[0], sp[1], sp[2]);
    }
}

/* ", wait_mean_us, wait_isolated_mean_us, wait_overlapped_mean_us": x's waits for other
 * ranks over the instances that know one, all and split as its durations are (null where
 * none does: compute, one rank): how much of an overlapped comm op's slowdown is waiting */
static void put_waits(text *t, const merged_kernel *x) {
    split_means w = means_of_split(&x->wait);
    put_number(t, "wait_mean_us", w.mean, 4);
    put_number(t, "wait_isolated_mean_us", w.iso, 4);
    put_number(t, "wait_overlapped_mean_us", w.ovl, 4);
}

/* ", net_of_wait" of a communication op x: its instances whose wait for other ranks is
 * known (in steps the trace kept whole), each less its wait: the time it moved data,
 * split by whether compute ran beside that part; and how many of them waited all along
 * (n_all_wait, left out of the means); null where no wait is known (one rank, a step
 * past the trace's cap) */
static void put_net_of_wait(text *t, const merged_kernel *x) {
    if (x->kind != TK_COMM) return;
    if (x->moving.count == 0 && x->all_wait == 0) {
        put(t, ", \"net_of_wait\": null");
        return;
    }
    char a[32];
    put(t, ", \"net_of_wait\": {");
    put_means(t, &x->moving);
    put(t, ", \"gbps\": %s, \"n_all_wait\": %ld}", num(a, "%.6g", rates_of(x).gbps_moving, "null"),
        x->all_wait);
}

/* ", by_size": the rows of x's calls of each size (k[n]: the BY_SIZE level), where x ran
 * calls of more than one size */
static void put_by_size(text *t, const merged_kernel *x, const merged_kernel *k, int n, long rows) {
    int sizes = 0;
    for (int i = 0; i < n; i++) sizes += size_of(&k[i], x);
    if (sizes < 2) return;
    put(t, ", \"by_size\": [");
    for (int i = 0, first = 1; i < n; i++) {
        if (!size_of(&k[i], x)) continue;
        put(t, "%s{\"bytes_per_call\": %.17g", first ? "" : ", ", k[i].call_bytes);
        if (x->kind == TK_COMM) put(t, ", \"parallelism\": \"%s\"", timing_par_name(k[i].par));
        put(t, ", ");
        put_means(t, &k[i].s);
        put(t, ", \"total_us_per_step\": %.4f", rows ? k[i].s.sum_us / rows : 0.0);
        put_waits(t, &k[i]); /* null for compute, as on the kernel entry */
        put_net_of_wait(t, &k[i]);
        put(t, "}");
        first = 0;
    }
    put(t, "]");
}

/* One kernel of the report's "kernels" (or "probe_kernels"): x at the BY_NAME level, its
 * parallelisms' and sizes' rows from m; rows: the step rows its time per step is over;
 * probe: its twin in the contention probe's steps, or NULL */
static void kernel_json(text *t, const merged_kernel *x, const merged_kernels *m, long rows,
                        const merged_kernel *probe) {
    split_means mm = means_of_split(&x->s);
    double probe_mean = probe ? means_of_split(&probe->s).mean : NAN;
    char a[32], b[32];
    put(t, "    {\"name\": \"%s\", \"kind\": \"%s\", ", x->name, timing_kind_name(x->kind));
    put_means(t, &x->s);
    /* per step and rank: shows a decomposition (chunking) as well as slowdown */
    put(t, ", \"total_us_per_step\": %.4f, \"probe_mean_us\": %s, \"slowdown_vs_probe\": %s",
        rows ? x->s.sum_us / rows : 0.0, num(a, "%.4f", probe_mean, "null"),
        num(b, "%.4f", mm.mean / probe_mean, "null"));
    put_work(t, x);
    put_waits(t, x);
    put_net_of_wait(t, x);
    /* the same op of different parallelisms differs in size and contention */
    const merged_kernel *kp = m->at[BY_PAR];
    for (int j = 0, first = 1; x->kind == TK_COMM && j < m->n[BY_PAR]; j++) {
        if (!same_kernel(&kp[j], x)) continue;
        put(t, "%s\"%s\": {", first ? ", \"by_parallelism\": {" : ", ",
            timing_par_name(kp[j].par));
        put_means(t, &kp[j].s);
        put_work(t, &kp[j]);
        put_waits(t, &kp[j]);
        put_net_of_wait(t, &kp[j]);
        put(t, "}");
        first = 0;
    }
    if (x->kind == TK_COMM) put(t, "}");
    put_by_size(t, x, m->at[BY_SIZE], m->n[BY_SIZE], rows);
    put(t, "},\n");
}

static void trace_text(text *t, int rank) {
    static const char *streams[TIMING_STREAMS] = {"compute", "comm tp", "comm pp", "comm dp"};
    put(t, "  {\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, \"args\": {\"name\": \"rank %d\"}},\n",
        rank, rank);
    for (int s = 0; s < TIMING_STREAMS; s++)
        put(t, "  {\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": %d, \"args\": {\"name\": \"%s\"}},\n",
            rank, s, streams[s]);
    /* Each step is an async span (a "b" / "e" pair, an id local to the rank), so Perfetto
     * draws it on a track of its own: the contract's complete ("X") events are the timed
     * records alone, each of category compute or comm. A warm-up or probe step says so in
     * its name: it is not a step of the policies. */
    const timing_step_summary *st = timing_steps();
    for (int i = 0; i < timing_n_steps(); i++) {
        const char *what = st[i].warmup ? " (warm-up)" : st[i].probe ? " (probe)" : "";
        for (int end = 0; end < 2; end++)
            put(t, "  {\"name\": \"step %ld%s\", \"cat\": \"step\", \"ph\": \"%s\", "
                   "\"id2\": {\"local\": \"%ld\"}, \"ts\": %.3f, \"pid\": %d, \"tid\": 0, "
                   "\"args\": {\"step\": %ld, \"probe\": %s, \"warmup\": %s}},\n",
                st[i].step, what, end ? "e" : "b", st[i].step,
                end ? st[i].end_us : st[i].start_us, rank, st[i].step,
                st[i].probe ? "true" : "false", st[i].warmup ? "true" : "false");
    }
    const timing_record *r = timing_trace();
    for (size_t i = 0; i < timing_n_trace(); i++) {
        if (i % 65536 == 0) watchdog_beat(); /* millions of records take seconds */
        put(t, "  {\"name\": \"%s\", \"cat\": \"%s\", \"ph\": \"X\", \"ts\": %.3f, \"dur\": %.3f, "
               "\"pid\": %d, \"tid\": %d, \"args\": {\"step\": %d, \"layer\": %d, \"micro\": %d, "
               "\"phase\": \"%s\", \"parallelism\": \"%s\"",
            r[i].name, timing_kind_name(r[i].kind), r[i].start_us, r[i].end_us - r[i].start_us, rank,
            r[i].stream, r[i].step, r[i].layer, r[i].micro, timing_phase_name(r[i].phase),
            timing_par_name(r[i].par));
        /* the call's work (Perfetto shows it on a click), where it counts any */
        if (r[i].flops > 0) put(t, ", \"flops\": %.9g", (double)r[i].flops);
        if (r[i].bytes > 0) put(t, ", \"bytes\": %.9g", (double)r[i].bytes);
        if (r[i].kind == TK_COMM && r[i].wait_us >= 0)
            put(t, ", \"wait_us\": %.3f", (double)r[i].wait_us);
        /* who it waited for: a transfer's other rank, a broadcast's or reduce's root */
        if (r[i].peer_rank >= 0)
            put(t, ", \"%s\": %d",
                r[i].match.kind == TM_SEND || r[i].match.kind == TM_RECV ? "peer" : "root",
                r[i].peer_rank);
        put(t, "}},\n");
    }
}

/* Where comm_gather_host's take puts each rank's trace events: straight into the file, so
 * that rank 0 holds one rank's text at a time (up to the trace's cap, ~0.4 GB) and not
 * every rank's (64 ranks at the cap are 25 GB). f NULL: received and dropped (the report
 * could not be written). */
typedef struct {
    FILE *f;
    int first; /* no event written yet */
    int error; /* errno of the write that failed, or 0 */
} trace_sink;

static int put_trace_events(int rank, const void *bytes, size_t n, void *arg) {
    trace_sink *s = arg;
    const char *p = bytes;
    (void)rank;
    if (!s->f) return 0;
    /* each event ends ",\n": the last of a rank's is followed by the next rank's, or by
     * the end of the list, where JSON allows no comma */
    if (n >= 2 && p[n - 2] == ',' && p[n - 1] == '\n') n -= 2;
    if (n == 0) return 0;
    watchdog_hold(watchdog_io_s((double)n)); /* the gather's beat after the take ends it */
    errno = 0;
    if ((!s->first && fputs(",\n", s->f) == EOF) || fwrite(p, 1, n, s->f) != n) {
        s->error = errno ? errno : EIO;
        return -1;
    }
    s->first = 0;
    return 0;
}

/* Every rank's trace events (mine: this rank's) into path on rank 0, as they come, where
 * `write` (rank 0's report went well); the file replaces an earlier one only once it is
 * whole. Collective: every rank sends its events whether or not they are written. */
static int write_trace(comm_group *world, const text *mine, const char *path, int write,
                       char *err, size_t errlen) {
    int root = !world || world->rank == 0, failed = 0;
    trace_sink sink = {NULL, 1, 0};
    output_whole o;
    char why[512];
    if (root && write) {
        watchdog_hold(watchdog_io_s((double)mine->n)); /* opening a FIFO waits for its reader */
        if (output_whole_open(&o, path, why, sizeof why) != 0) {
            snprintf(err, errlen, "profile.trace %s: cannot write: %s", path, why);
            failed = 1;
        } else {
            sink.f = o.f;
            fputs("{\"traceEvents\": [\n", o.f);
        }
    }
    const char *bytes = mine->s ? mine->s : "";
    int rc = world ? comm_gather_host(world, bytes, mine->n, put_trace_events, &sink)
                   : put_trace_events(0, bytes, mine->n, &sink);
    if (!root) return rc;
    if (!sink.f) return failed ? -1 : rc;
    if (rc != 0) { /* a write failed, or a rank's events never came */
        output_whole_abandon(&o);
        snprintf(err, errlen, "profile.trace %s: write failed: %s", path,
                 sink.error ? strerror(sink.error) : "a rank's events did not arrive");
        return -1;
    }
    fputs("\n], \"displayTimeUnit\": \"ms\"}\n", o.f);
    if (output_whole_close(&o, why, sizeof why) != 0) {
        snprintf(err, errlen, "profile.trace %s: write failed: %s", path, why);
        return -1;
    }
    return 0;
}

/* Drops the ",\n" after the last element of a list built line by line. */
static void close_list(char *s, size_t n) {
    if (n >= 2 && s[n - 2] == ',') {
        s[n - 2] = '\n';
        s[n - 1] = 0;
    }
}

int report_write(comm_group *world, const char *report_path, const char *trace_path,
                 char *err, size_t errlen) {
    int rank = world ? world->rank : 0, size = world ? world->size : 1, rc = 0;
    text st = {0}, kt = {0}, tt = {0}, dt = {0};
    steps_text(&st, rank);
    kernels_text(&kt);
    device_text(&dt);
    if (trace_path && trace_path[0]) trace_text(&tt, rank);
    /* dropped records, trace events omitted, untimed compute ops, untimed comm ops, and
     * the bytes of text rank 0 gathers, reads and writes */
    double counts[5] = {(double)timing_dropped(),
                        trace_path && trace_path[0] ? (double)timing_trace_omitted() : 0,
                        (double)timing_untimed(TK_COMPUTE), (double)timing_untimed(TK_COMM),
                        (double)(st.n + kt.n + dt.n + tt.n)};
    if (world && size > 1) comm_sum_doubles(world, counts, 5);
    /* every rank waits for rank 0 to take in, read and write all of it: not a hang */
    watchdog_hold(watchdog_io_s(counts[4]));
    size_t ns, nk, nd;
    char *steps = gather_text(world, &st, &ns), *kern = gather_text(world, &kt, &nk);
    char *dev = gather_text(world, &dt, &nd);
    long dropped = (long)counts[0], omitted = (long)counts[1];
    long untimed[2] = {(long)counts[2], (long)counts[3]};
    if (rank == 0) {
        merged_kernels mk;
        merge_kernels(kern, &mk);
        for (int level = 0; level < 3; level++) /* the most time first, at every level */
            if (mk.n[level] > 0)
                qsort(mk.at[level], (size_t)mk.n[level], sizeof(merged_kernel), by_total);
        const merged_kernel *k = mk.at[BY_NAME];
        int n = mk.n[BY_NAME];
        step_means pol, probe;
        mean_steps(steps, 0, &pol);
        mean_steps(steps, 1, &probe);
        step_work work = work_per_step(k, n, pol.n); /* the table's and the report's */
        merged_device *d = NULL;
        int ndev = merge_device(dev, &d);
        if (report_path && report_path[0]) {
            text kj = {0}, pj = {0};
            for (int i = 0; i < n; i++) {
                const merged_kernel *t = k[i].probe ? NULL : probe_twin(k, n, &k[i]);
                kernel_json(k[i].probe ? &pj : &kj, &k[i], &mk, k[i].probe ? probe.n : pol.n, t);
            }
            close_list(steps, ns);
            if (kj.s) close_list(kj.s, kj.n);
            if (pj.s) close_list(pj.s, pj.n);
            text head = {0}, tail = {0}, dj = {0};
            device_json(&dj, d, ndev, k, n, pol.n);
            put(&head, "{\n  \"ranks\": %d,\n  \"dropped_records\": %ld,\n  \"trace_omitted_records\": %ld,\n"
                       "  \"untimed_records\": {\"compute\": %ld, \"comm\": %ld},\n"
                       "  \"warmup_steps\": %d,\n  \"steps\": [\n",
                size, dropped, omitted, untimed[0], untimed[1], timing_warmup());
            /* means over the steps run with the policies: null where none did (each a probe
             * or a warm-up), not a 0 that reads as a measurement */
            double have = pol.n ? 0.0 : NAN;
            put(&tail, "  ],\n  \"probe_kernels\": [\n%s  ],\n  \"device_kernels\": [\n%s  ],\n"
                       "  \"overlap\": {\"policy_steps\": %ld, \"probe_steps\": %ld",
                pj.s ? pj.s : "", dj.s ? dj.s : "", pol.n, probe.n);
            put_number(&tail, "iter_ms", pol.iter + have, 4);
            put_number(&tail, "iter_ms_median", pol.median, 4);
            put_number(&tail, "compute_ms", pol.compute + have, 4);
            put_number(&tail, "comm_ms", pol.comm + have, 4);
            put_number(&tail, "exposed_comm_ms", pol.exposed + have, 4);
            put_number(&tail, "hidden_comm_ms", pol.comm - pol.exposed + have, 4);
            put_number(&tail, "idle_ms", idle_ms(&pol) + have, 4);
            put_number(&tail, "comm_wait_ms", pol.wait, 4);
            put(&tail, ", \"by_parallelism\": {");
            for (int par = TP_DP; par < TIMING_PARS; par++) {
                put(&tail, "%s\"%s\": {", par > TP_DP ? ", " : "", timing_par_name(par));
                put_number(&tail, "comm_ms", pol.par_comm[par] + have, 4);
                put_number(&tail, "exposed_comm_ms", pol.par_exposed[par] + have, 4);
                put_number(&tail, "hidden_comm_ms", pol.par_comm[par] - pol.par_exposed[par] + have, 4);
                put_number(&tail, "comm_wait_ms", pol.par_wait[par], 4);
                put(&tail, "}");
            }
            put(&tail, "}, ");
            /* the step's work, and the products' rate over the whole step */
            char tf[32], fl[32], by[32], cb[32];
            put(&tail, "\"flops_per_step\": %s, \"tflops\": %s, \"bytes_per_step\": %s, "
                       "\"comm_bytes_per_step\": %s, ",
                num(fl, "%.17g", work.flops + have, "null"),
                num(tf, "%.6g", pol.iter > 0 ? work.flops / pol.iter / 1e9 : NAN, "null"),
                num(by, "%.17g", work.bytes + have, "null"),
                num(cb, "%.17g", work.comm_bytes + have, "null"));
            char g[32];
            if (probe.n)
                put(&tail, "\"serialized_iter_ms\": %.4f, \"serialized_iter_ms_median\": %.4f, "
                           "\"ideal_iter_ms\": %.4f, \"gain\": %s}\n}\n",
                    probe.iter, probe.median, probe.ideal,
                    num(g, "%.4f", pol.n && pol.iter > 0 ? probe.iter / pol.iter : NAN, "null"));
            else
                put(&tail, "\"serialized_iter_ms\": null, \"serialized_iter_ms_median\": null, "
                           "\"ideal_iter_ms\": null, \"gain\": null}\n}\n");
            const char *parts[] = {head.s, steps, "  ],\n  \"kernels\": [\n", kj.s ? kj.s : "",
                                   tail.s, NULL};
            rc = write_file(report_path, "report", parts, err, errlen);
            free(head.s);
            free(tail.s);
            free(dj.s);
            free(kj.s);
            free(pj.s);
        }
        print_table(&mk, &pol, &probe, &work, size, dropped, omitted, untimed);
        print_device(d, ndev, k, n, pol.n);
        free(d);
        free_kernels(&mk);
    }
    /* the trace last: the largest, and streamed to its file rank by rank */
    free(st.s);
    free(kt.s);
    free(dt.s);
    free(dev);
    free(steps);
    free(kern);
    if (trace_path && trace_path[0]) {
        int t = write_trace(world, &tt, trace_path, rc == 0, err, errlen);
        if (rc == 0) rc = t;
    }
    free(tt.s);
    if (world && size > 1) rc = comm_max_int(world, rc != 0) ? -1 : 0;
    watchdog_beat(); /* rank 0 is done: the hold above ends here, not a disk's time later */
    return rc;
}
