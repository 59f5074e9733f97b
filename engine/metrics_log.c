/* train.log_file: the metrics JSONL, its lines and what a resumed run does to them. */
#define _POSIX_C_SOURCE 200809L
#include "engine/metrics_log.h"

#include <errno.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/config.h"
#include "engine/log.h"
#include "engine/output_files.h"

/* Drops the lines of the metrics log at path whose step is first or later (a resumed
 * run writes them anew); lines it cannot read as a step are kept. 0, or -1 with err. */
static int trim_log(const char *path, long first, char *err, size_t n) {
    FILE *in = fopen(path, "r");
    if (!in && errno == ENOENT) return 0; /* nothing written yet */
    if (!in) {
        snprintf(err, n, "train.log_file %s: %s", path, strerror(errno));
        return -1;
    }
    char tmp[CFG_STR_MAX + 32];
    snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", path, (long)getpid());
    FILE *out = fopen(tmp, "w");
    if (!out) {
        snprintf(err, n, "train.log_file %s: cannot write beside it: %s", path, strerror(errno));
        fclose(in);
        return -1;
    }
    char line[4096];
    long step, dropped = 0;
    int whole = 1; /* the last fgets ended its line: the next one starts a line */
    while (fgets(line, sizeof(line), in)) {
        int starts = whole;
        whole = strchr(line, '\n') != NULL;
        if (starts && sscanf(line, "{\"step\": %ld", &step) == 1 && step >= first) {
            dropped++;
            while (!whole && fgets(line, sizeof(line), in)) whole = strchr(line, '\n') != NULL;
            continue;
        }
        fputs(line, out);
    }
    int bad = ferror(in) || fclose(out) != 0;
    fclose(in);
    if (bad || rename(tmp, path) != 0) {
        snprintf(err, n, "train.log_file %s: cannot rewrite it: %s", path, strerror(errno));
        unlink(tmp);
        return -1;
    }
    if (dropped)
        log_info("train.log_file %s: dropped %ld line(s) of steps >= %ld, which this run "
                 "writes again\n", path, dropped, first);
    return 0;
}

FILE *metrics_open(const char *path, long first, char *err, size_t n) {
    struct stat st; /* a terminal or /dev/null has no earlier lines to drop */
    int regular = stat(path, &st) != 0 || S_ISREG(st.st_mode);
    if (first > 1 && regular && trim_log(path, first, err, n) != 0) return NULL;
    FILE *f = output_stream_open(path, first > 1);
    char why[128];
    if (!f)
        snprintf(err, n, "train.log_file %s: %s", path,
                 output_stream_error(errno, why, sizeof why));
    return f;
}

/* buf[64] = v in fmt, or null where v is not finite: JSON has no NaN (printf's "-nan"
 * broke every reader of the metrics file on a skipped step). A whole number keeps a
 * ".0", so that readers see one type in a column (%g writes a loss of 26185034 or an
 * lr of 1000 as an integer). */
static const char *json_number(char *buf, const char *fmt, double v) {
    if (!isfinite(v)) {
        snprintf(buf, 64, "null");
        return buf;
    }
    int len = snprintf(buf, 64, fmt, v); /* "%.1f" of up to 1e61 fits */
    if (len > 0 && len < 62 && !strpbrk(buf, ".e")) strcat(buf, ".0");
    return buf;
}

int metrics_write(FILE *f, long step, double loss, double grad_norm, double lr, double iter_ms,
                  double tokens_per_s, int skipped, const power_sample *power) {
    char a[64], b[64], c[64], d[64];
    fprintf(f, "{\"step\": %ld, \"loss\": %s, \"grad_norm\": %s, \"lr\": %s, "
               "\"iter_ms\": %.3f, \"tokens_per_s\": %s",
            step, json_number(a, "%.9g", loss), json_number(b, "%.9g", grad_norm),
            json_number(c, "%.9g", lr), iter_ms, json_number(d, "%.1f", tokens_per_s));
    if (skipped) fputs(", \"skipped\": true", f);
    if (power) { /* rank 0's GPU readings of the step; a failed reading is null */
        const char *key[3] = {"energy_j", "power_w", "sm_clock_mhz"};
        double v[3] = {power->energy_j, power->power_w, power->sm_clock_mhz};
        for (int i = 0; i < 3; i++) fprintf(f, ", \"%s\": %s", key[i], json_number(a, "%.3f", v[i]));
    }
    fputs("}\n", f);
    return fflush(f) != 0 || ferror(f) ? -1 : 0;
}
