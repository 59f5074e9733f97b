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
    int bad = ferror(in) || ferror(out), e = errno;
    if (fclose(out) != 0 && !bad) bad = 1, e = errno;
    fclose(in);
    char why[CFG_STR_MAX + 96];
    if (bad) snprintf(why, sizeof why, "%s", strerror(e));
    if (bad || output_replace(tmp, path, why, sizeof why) != 0) {
        snprintf(err, n, "train.log_file %s: cannot rewrite it: %s", path, why);
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

/* Writes s[len] to fd whole or not at all: a write cut short (a full disk) is taken back,
 * so that a later line, written once there is room again, does not carry on a torn one
 * (which broke the file's JSON). A FIFO or terminal has no offset to take it back to; a
 * line shorter than PIPE_BUF (4096) goes into a pipe whole anyway. */
static int write_whole_line(int fd, const char *s, size_t len) {
    off_t start = lseek(fd, 0, SEEK_END); /* where O_APPEND puts the line; -1: a FIFO */
    size_t done = 0;
    while (done < len) {
        ssize_t w = write(fd, s + done, len - done);
        if (w < 0 && errno == EINTR) continue;
        if (w > 0) {
            done += (size_t)w;
            continue;
        }
        int e = w < 0 ? errno : ENOSPC;
        if (done > 0 && start >= 0 && ftruncate(fd, start) != 0)
            e = errno; /* the torn line stays: the caller says the file is damaged */
        errno = e;
        return -1;
    }
    return 0;
}

int metrics_write(FILE *f, long step, double loss, double grad_norm, double lr, double iter_ms,
                  double tokens_per_s, int skipped, const power_sample *power) {
    char a[64], b[64], c[64], d[64], line[1024]; /* at most about 420 characters */
    int len = snprintf(line, sizeof line,
                       "{\"step\": %ld, \"loss\": %s, \"grad_norm\": %s, \"lr\": %s, "
                       "\"iter_ms\": %.3f, \"tokens_per_s\": %s%s",
                       step, json_number(a, "%.9g", loss), json_number(b, "%.9g", grad_norm),
                       json_number(c, "%.9g", lr), iter_ms, json_number(d, "%.1f", tokens_per_s),
                       skipped ? ", \"skipped\": true" : "");
    if (power) { /* rank 0's GPU readings of the step; a failed reading is null */
        const char *key[3] = {"energy_j", "power_w", "sm_clock_mhz"};
        double v[3] = {power->energy_j, power->power_w, power->sm_clock_mhz};
        for (int i = 0; i < 3; i++)
            len += snprintf(line + len, sizeof line - (size_t)len, ", \"%s\": %s", key[i],
                            json_number(a, "%.3f", v[i]));
    }
    len += snprintf(line + len, sizeof line - (size_t)len, "}\n");
    /* the stream is written past stdio, one write() a line: nothing of it is buffered */
    return write_whole_line(fileno(f), line, (size_t)len);
}
