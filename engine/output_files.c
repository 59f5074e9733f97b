/* The files a run writes besides its metrics: every output path checked before step 1,
 * and the checkpoints of train.save (the versions train.keep holds, and what an
 * interrupted save left behind). Rank 0 calls these; it writes them all. */
#define _XOPEN_SOURCE 700 /* realpath */
#include "engine/output_files.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "data/tokens.h"
#include "engine/config.h"
#include "engine/h5_checks.h"
#include "engine/log.h"

/* A path's directory and last name, as dirname and basename give them; each works on a
 * copy of its own, since both may write into the string they are given. */
typedef struct {
    char dir[CFG_STR_MAX];
    char base[CFG_STR_MAX];
} path_parts;

static void path_split(const char *path, path_parts *p) {
    char copy[CFG_STR_MAX];
    snprintf(copy, sizeof copy, "%s", path);
    snprintf(p->dir, sizeof p->dir, "%s", dirname(copy));
    snprintf(copy, sizeof copy, "%s", path);
    snprintf(p->base, sizeof p->base, "%s", basename(copy));
}

/* 1 when the file at fp has HDF5's signature where HDF5 looks for it: at byte 0, 512,
 * 1024, 2048, ... (after a user block) */
static int has_hdf5_signature(FILE *fp, long size) {
    static const unsigned char sig[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
    for (long at = 0; at + 8 <= size; at = at ? 2 * at : 512) {
        unsigned char head[8];
        if (fseek(fp, at, SEEK_SET) != 0 || fread(head, 1, 8, fp) != 8) return 0;
        if (memcmp(head, sig, 8) == 0) return 1;
    }
    return 0;
}

/* the next character of fp that is not JSON whitespace, or EOF */
static int next_nonspace(FILE *fp) {
    int c;
    do c = fgetc(fp);
    while (c == ' ' || c == '\t' || c == '\n' || c == '\r');
    return c;
}

/* the first key of a JSON object whose '{' was just read from fp, into key[n]; "" if none */
static void first_key(FILE *fp, char *key, size_t n) {
    int c = next_nonspace(fp);
    size_t k = 0;
    if (c == '"')
        while ((c = fgetc(fp)) != EOF && c != '"' && k + 1 < n) key[k++] = (char)c;
    key[k] = 0;
}

static const char *const STREAM_KEY[] = {[OUTPUT_METRICS] = "step",
                                         [OUTPUT_TRACE] = "traceEvents",
                                         [OUTPUT_REPORT] = "ranks"};
static const char *const STREAM_NAME[] = {[OUTPUT_METRICS] = "a metrics file",
                                          [OUTPUT_TRACE] = "a trace",
                                          [OUTPUT_REPORT] = "a timing report"};

/* An existing file an output would overwrite must be one of its own kind: a checkpoint
 * (replaced) a checkpoint, a token file one with /tokens, a stream (metrics, trace,
 * report: JSON, appended to or rewritten) one that starts with '{' and, if its first key
 * is another stream's, that stream's (a kept report given as the trace was lost); an
 * empty file, or an HDF5 file HDF5 cannot open (a damaged one), is any. Else a typo or a
 * swapped pair of paths would destroy the file (a checkpoint given as train.log_file, a
 * token file as train.save). 0, or -1 with err set. */
static int existing_is_own_kind(const char *key, const char *path, output_kind kind, char *err,
                                size_t n) {
    int stream = kind == OUTPUT_METRICS || kind == OUTPUT_TRACE || kind == OUTPUT_REPORT;
    FILE *fp = fopen(path, "rb");
    if (!fp) return 0; /* the write check that follows names the trouble */
    long size = fseek(fp, 0, SEEK_END) == 0 ? ftell(fp) : -1;
    int c = EOF, hdf5 = size > 0 && has_hdf5_signature(fp, size);
    char first[16] = "";
    if (size > 0 && !hdf5 && fseek(fp, 0, SEEK_SET) == 0) {
        c = next_nonspace(fp);
        if (c == '{') first_key(fp, first, sizeof first);
    }
    fclose(fp);
    if (size <= 0) return 0;
    const char *what = NULL;
    char other[64];
    if (stream && hdf5) what = "an HDF5 file, not JSON";
    else if (stream && c != '{' && c != EOF) what = "not JSON (no '{' first)";
    else if (stream && c == '{' && strcmp(first, STREAM_KEY[kind]) != 0) {
        /* a swapped pair of the three (a trace given as the report) */
        for (int k = OUTPUT_METRICS; k <= OUTPUT_REPORT; k++)
            if (strcmp(first, STREAM_KEY[k]) == 0) {
                snprintf(other, sizeof other, "%s, not %s", STREAM_NAME[k], STREAM_NAME[kind]);
                what = other;
            }
    } else if (!stream && !hdf5) what = "not an HDF5 file";
    else if (!stream) {
        h5_kind is = h5_file_kind(path), want = kind == OUTPUT_CHECKPOINT ? H5_CHECKPOINT : H5_TOKENS;
        if (is != H5_UNKNOWN && is != want)
            what = is == H5_CHECKPOINT ? "a checkpoint, not a token file"
                   : is == H5_TOKENS   ? "a token file (it has /tokens), not a checkpoint"
                   : kind == OUTPUT_CHECKPOINT
                       ? "an HDF5 file that is not a checkpoint (no format attribute)"
                       : "an HDF5 file that is not a token file (no /tokens)";
    }
    if (!what) return 0;
    snprintf(err, n, "%s %s: exists and is %s, which this run would overwrite (name a new "
             "file, or remove this one)", key, path, what);
    return -1;
}

/* 1 when path (its links followed) is a mount point (/proc/self/mountinfo's fifth field):
 * a file bind-mounted there cannot be renamed over, EBUSY */
static int is_mount_point(const char *path) {
    char *real = realpath(path, NULL);
    FILE *f = real ? fopen("/proc/self/mountinfo", "r") : NULL;
    char line[8192];
    int found = 0;
    while (f && !found && fgets(line, sizeof line, f)) {
        char *p = line; /* "id parent major:minor root mount-point options ..." */
        for (int i = 0; i < 4 && p; i++) p = (p = strchr(p, ' ')) ? p + 1 : NULL;
        char *end = p ? strchr(p, ' ') : NULL;
        if (!end) continue;
        *end = '\0';
        char *o = p; /* unescape \ooo (a space is \040) in place */
        for (char *q = p; *q; q++, o++) {
            if (q[0] == '\\' && q[1] >= '0' && q[1] <= '3' && q[2] >= '0' && q[2] <= '7' &&
                q[3] >= '0' && q[3] <= '7') {
                *o = (char)((q[1] - '0') * 64 + (q[2] - '0') * 8 + (q[3] - '0'));
                q += 3;
            } else {
                *o = *q;
            }
        }
        *o = '\0';
        found = strcmp(p, real) == 0;
    }
    if (f) fclose(f);
    free(real);
    return found;
}

static int own_descriptor(const char *path);

/* 1 when path is in /proc, or is a link into it (/dev/stdout, /dev/stderr, /dev/fd,
 * /dev/stdin: the process's descriptors) */
static int in_proc(const char *path) {
    char target[16];
    ssize_t len = readlink(path, target, sizeof target - 1);
    if (len >= 0) target[len] = '\0';
    return strncmp(path, "/proc/", 6) == 0 || own_descriptor(path) >= 0 ||
           (len >= 6 && strncmp(target, "/proc/", 6) == 0);
}

/* 1 or 2 when st is the regular file that descriptor 1 or 2 writes to (a shell's > FILE),
 * else 0. A descriptor that is a pipe or a terminal may be forwarded by the parent process
 * (mpirun, whose ranks write to a pty and a pipe, or the far end of a shell's pipe): then
 * the parent's descriptor is the file, and *parent names the parent (its comm). /dev/null
 * and other devices forward nothing. */
static int std_output_of(const struct stat *st, char *parent, size_t n) {
    for (int fd = 1; fd <= 2; fd++) {
        struct stat o;
        int via_parent = 0;
        if (fstat(fd, &o) != 0) continue;
        if (S_ISFIFO(o.st_mode) || isatty(fd)) {
            char p[64];
            snprintf(p, sizeof p, "/proc/%ld/fd/%d", (long)getppid(), fd);
            if (stat(p, &o) != 0) continue;
            via_parent = 1;
        }
        if (!S_ISREG(o.st_mode) || o.st_dev != st->st_dev || o.st_ino != st->st_ino) continue;
        parent[0] = '\0';
        if (via_parent) {
            char p[64];
            snprintf(p, sizeof p, "/proc/%ld/comm", (long)getppid());
            FILE *f = fopen(p, "r");
            if (!f || !fgets(parent, (int)n, f)) snprintf(parent, n, "its parent process");
            parent[strcspn(parent, "\n")] = '\0';
            if (f) fclose(f);
        }
        return fd;
    }
    return 0;
}

/* Refuses an output path (key names it) that rank 0, which writes them all, could not write
 * at the end of a long run, or would block on: checkpoints, the trace and the report are
 * written after the last step. A replaced file (not a stream) is written beside and
 * renamed over the path, so its own permissions do not matter. */
int output_path_check(const char *key, const char *path, output_kind kind, char *err, size_t n) {
    if (!path[0]) return 0;
    int replaced = kind == OUTPUT_CHECKPOINT || kind == OUTPUT_TOKENS;
    /* the rename would replace the link /dev/stdout itself (root may write in /dev), not
     * the file the shell sent stdout to: every later process's /dev/stdout broken */
    if (replaced && in_proc(path)) {
        snprintf(err, n, "%s %s: names a descriptor or a /proc file, not a file to replace (it "
                 "is written beside its path and renamed over it): name a file", key, path);
        return -1;
    }
    path_parts parts;
    path_split(path, &parts);
    const char *dir = parts.dir;
    struct stat st;
    int fd, found = stat(dir, &st) == 0;
    if (!found && errno == ENOENT) {
        snprintf(err, n, "%s %s: directory %s does not exist", key, path, dir);
        return -1;
    }
    if ((found && !S_ISDIR(st.st_mode)) || (!found && errno == ENOTDIR)) {
        snprintf(err, n, "%s %s: %s is not a directory", key, path, dir);
        return -1;
    }
    int exists = stat(path, &st) == 0, why = errno; /* following links */
    if (exists && S_ISDIR(st.st_mode)) {
        snprintf(err, n, "%s %s: is a directory (name a file in it)", key, path);
        return -1;
    }
    /* opened anew (or replaced) under its own name, the file the shell sent stdout to
     * took the run's lines at one offset and the output at another: each wrote over the
     * other (/dev/stdout is written through the descriptor, output_stream_open) */
    char parent[64] = "";
    int std = exists && own_descriptor(path) < 0 ? std_output_of(&st, parent, sizeof parent) : 0;
    if (std) {
        const char *name = std == 1 ? "stdout" : "stderr";
        snprintf(err, n, "%s %s: is the file this run's %s goes to%s%s%s: the run's lines and "
                 "this output would write over each other (name another file%s%s%s)", key, path,
                 name, parent[0] ? " (through " : "", parent, parent[0] ? ")" : "",
                 replaced ? "" : ", or /dev/", replaced ? "" : name, replaced ? "" : " to mix them");
        return -1;
    }
    if (exists && !S_ISREG(st.st_mode)) {
        /* a stream may go to a terminal, /dev/null or a FIFO (/dev/stdout in a pipe; its
         * reader is the user's: a probe here would end the reader's input, and
         * output_stream_open refuses a FIFO with no reader when it opens it); a
         * checkpoint must be a file */
        if (replaced || !(S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode))) {
            snprintf(err, n, "%s %s: is not a regular file", key, path);
            return -1;
        }
        return 0;
    }
    if (exists && existing_is_own_kind(key, path, kind, err, n) != 0) return -1;
    if (exists && replaced && is_mount_point(path)) {
        snprintf(err, n, "%s %s: is a mount point (a bind-mounted file): the file is written "
                 "beside it and renamed over it, which a mount point refuses; name a path in "
                 "the mounted directory instead", key, path);
        return -1;
    }
    if (!exists && lstat(path, &st) == 0) {
        snprintf(err, n, "%s %s: is a symbolic link %s", key, path,
                 why == ELOOP ? "in a loop of links" : "to nowhere");
        return -1;
    }
    /* access() says yes to root in /proc or on a read-only mount: create a file there */
    char probe[CFG_STR_MAX + 32];
    snprintf(probe, sizeof(probe), "%s.tmp.%ld", path, (long)getpid());
    fd = open(probe, O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (fd < 0) {
        snprintf(err, n, "%s %s: cannot create a file in directory %s: %s", key, path, dir,
                 strerror(errno));
        return -1;
    }
    close(fd);
    unlink(probe);
    if (replaced || !exists) return 0;
    fd = open(path, O_WRONLY | O_APPEND); /* writes nothing: the file stays as it is */
    if (fd < 0) {
        snprintf(err, n, "%s %s: cannot write: %s", key, path, strerror(errno));
        return -1;
    }
    close(fd);
    return 0;
}

static int g_std_closed[3]; /* descriptors 0-2 that were closed at the start */

/* 1 when fd is one of 0-2 and was closed at the start (/dev/null stands in for it) */
static int closed_at_start(int fd) { return fd >= 0 && fd < 3 && g_std_closed[fd]; }

int output_guard_std_fds(void) {
    for (int fd = 0; fd < 3; fd++) {
        if (fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
        /* the lowest free number is fd itself */
        int got = open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
        g_std_closed[fd] = 1;
        if (got != fd) {
            if (got >= 0) close(got);
            return -1;
        }
    }
    return 0;
}

/* The descriptor path names when it is one of this process's open files: /dev/stdout,
 * /dev/stderr, /dev/fd/N, /proc/self/fd/N; else -1. Opened anew, such a path is a second
 * open file with an offset of its own: into a file the shell redirected stdout to, it
 * truncated the run's lines (O_TRUNC) or wrote over them, and the lines after it wrote
 * over it. A dup shares the one offset. */
static int own_descriptor(const char *path) {
    if (strcmp(path, "/dev/stdout") == 0) return STDOUT_FILENO;
    if (strcmp(path, "/dev/stderr") == 0) return STDERR_FILENO;
    const char *n = strncmp(path, "/dev/fd/", 8) == 0           ? path + 8
                    : strncmp(path, "/proc/self/fd/", 14) == 0 ? path + 14
                                                                : NULL;
    if (!n || !*n || strlen(n) > 6 || strspn(n, "0123456789") != strlen(n)) return -1;
    return atoi(n);
}

int output_names_closed_std(const char *path) {
    int own = strcmp(path, "-") == 0 || strcmp(path, "/dev/stdin") == 0 ? STDIN_FILENO
                                                                        : own_descriptor(path);
    return closed_at_start(own);
}

FILE *output_stream_open(const char *path, int append) {
    int own = own_descriptor(path);
    if (closed_at_start(own)) {
        errno = EBADF;
        return NULL;
    }
    if (own >= 0) {
        fflush(stdout); /* what the run printed goes first */
        int fd = dup(own);
        FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
        if (!f && fd >= 0) close(fd);
        return f;
    }
    int fd = open(path, O_WRONLY | O_CREAT | (append ? O_APPEND : O_TRUNC) | O_NONBLOCK, 0644);
    if (fd < 0) return NULL;
    int flags = fcntl(fd, F_GETFL); /* blocking again: a slow reader slows the writes */
    FILE *f = flags >= 0 && fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) == 0
                  ? fdopen(fd, append ? "a" : "w")
                  : NULL;
    if (!f) {
        int e = errno;
        close(fd);
        errno = e;
    }
    return f;
}

const char *output_stream_error(int errnum, char *buf, size_t n) {
    if (errnum == ENXIO) snprintf(buf, n, "a FIFO with no reader (start its reader first)");
    else if (errnum == EBADF)
        snprintf(buf, n, "the descriptor is not open (the run started with it closed)");
    else snprintf(buf, n, "%s", strerror(errnum));
    return buf;
}

int output_replace(const char *tmp, const char *path, char *why, size_t n) {
    const char *step = NULL;
    int fd = open(tmp, O_RDONLY), e = 0;
    if (fd < 0 || fsync(fd) != 0) step = "cannot fsync", e = errno;
    if (fd >= 0) close(fd);
    if (!step && rename(tmp, path) != 0) step = "cannot rename into place", e = errno;
    if (step) {
        snprintf(why, n, "%s temporary file %s: %s", step, tmp, strerror(e));
        return -1;
    }
    /* the rename is durable only once the directory entry is on disk */
    char *copy = strdup(path);
    const char *dir = copy ? dirname(copy) : ".";
    fd = open(dir, O_RDONLY | O_DIRECTORY);
    int rc = fd >= 0 && fsync(fd) == 0 ? 0 : -1;
    if (rc) snprintf(why, n, "cannot fsync directory %s: %s", dir, strerror(errno));
    if (fd >= 0) close(fd);
    free(copy);
    return rc;
}

/* removes o's temporary file, if any (gone after a rename; else a partial copy) */
static void whole_free(output_whole *o) {
    if (o->tmp) unlink(o->tmp);
    free(o->path);
    free(o->tmp);
    *o = (output_whole){0};
}

/* The FIFOs output_whole_hold opened, each until output_whole_open takes it */
enum { HELD_MAX = 4 };
static struct {
    char *path; /* as the caller named it */
    FILE *f;
} held[HELD_MAX];

int output_whole_hold(const char *path, char *why, size_t n) {
    struct stat st;
    if (!path[0] || stat(path, &st) != 0 || !S_ISFIFO(st.st_mode)) return 0;
    int i = 0;
    while (i < HELD_MAX && held[i].f) i++;
    if (i == HELD_MAX) return 0; /* opened at the end, as any other output */
    FILE *f = output_stream_open(path, 0);
    char *copy = f ? strdup(path) : NULL;
    if (!copy) {
        output_stream_error(errno, why, n);
        if (f) fclose(f);
        return -1;
    }
    held[i].path = copy;
    held[i].f = f;
    return 0;
}

/* the stream output_whole_hold opened for path, taken out of the table, or NULL */
static FILE *take_held(const char *path) {
    for (int i = 0; i < HELD_MAX; i++)
        if (held[i].f && strcmp(held[i].path, path) == 0) {
            FILE *f = held[i].f;
            free(held[i].path);
            held[i].path = NULL;
            held[i].f = NULL;
            return f;
        }
    return NULL;
}

int output_whole_open(output_whole *o, const char *path, char *why, size_t n) {
    *o = (output_whole){0};
    FILE *f = take_held(path);
    if (f) {
        fflush(stdout); /* a pipe that stdout goes to as well: the run's lines first */
        o->path = strdup(path);
        if (!o->path) {
            snprintf(why, n, "%s", strerror(errno));
            fclose(f);
            return -1;
        }
        o->f = f;
        return 0;
    }
    struct stat st;
    /* /dev/stdout is a link, through /proc, to whatever stdout is: a file the shell
     * redirected it to is written through stdout's descriptor (output_stream_open), not
     * replaced under the shell */
    /* and a bind-mounted file, which a rename cannot replace */
    int in_place = strncmp(path, "/dev/", 5) == 0 || strncmp(path, "/proc/", 6) == 0 ||
                   (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) || is_mount_point(path);
    o->path = in_place ? strdup(path) : realpath(path, NULL);
    if (!o->path && errno == ENOENT) o->path = strdup(path); /* not yet made */
    size_t len = o->path ? strlen(o->path) + 32 : 0;
    o->tmp = in_place || !o->path ? NULL : malloc(len);
    if (!o->path || (!in_place && !o->tmp)) {
        snprintf(why, n, "%s", strerror(errno));
        whole_free(o);
        return -1;
    }
    if (o->tmp) snprintf(o->tmp, len, "%s.tmp.%ld", o->path, (long)getpid());
    o->f = output_stream_open(o->tmp ? o->tmp : o->path, 0);
    if (!o->f) {
        output_stream_error(errno, why, n);
        whole_free(o);
        return -1;
    }
    return 0;
}

int output_whole_close(output_whole *o, char *why, size_t n) {
    errno = 0;
    int bad = fflush(o->f) != 0 || ferror(o->f), e = errno;
    if (fclose(o->f) != 0 && !bad) bad = 1, e = errno;
    int rc = 0;
    if (bad) {
        snprintf(why, n, "%s", e ? strerror(e) : "write error");
        rc = -1;
    } else if (o->tmp) {
        rc = output_replace(o->tmp, o->path, why, n);
    }
    whole_free(o);
    return rc;
}

void output_whole_abandon(output_whole *o) {
    fclose(o->f);
    whole_free(o);
}

/* 1 when a and b name one file: one regular file's inode where both exist (two streams to
 * /dev/null or one terminal are fine); where neither does (both outputs yet to be made),
 * one directory and one name in it. */
static int same_file(const char *a, const char *b) {
    struct stat sa, sb;
    int ea = stat(a, &sa) == 0, eb = stat(b, &sb) == 0;
    if (ea || eb)
        return ea && eb && S_ISREG(sa.st_mode) && S_ISREG(sb.st_mode) && sa.st_dev == sb.st_dev &&
               sa.st_ino == sb.st_ino;
    path_parts pa, pb;
    path_split(a, &pa);
    path_split(b, &pb);
    return strcmp(pa.base, pb.base) == 0 && stat(pa.dir, &sa) == 0 && stat(pb.dir, &sb) == 0 &&
           sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

int output_paths_distinct(const named_path *paths, int n, char *err, size_t errlen) {
    for (int i = 0; i < n; i++) {
        if (!paths[i].output || !paths[i].path[0]) continue;
        for (int j = 0; j < n; j++) {
            const named_path *o = &paths[i], *p = &paths[j];
            if (j == i || !p->path[0] || (p->output && j < i)) continue; /* each pair once */
            if (strcmp(o->key, "train.save") == 0 && strcmp(p->key, "train.init") == 0) continue;
            if (!same_file(o->path, p->path)) continue;
            if (p->output)
                snprintf(err, errlen, "%s %s and %s %s are one file: one would overwrite the "
                         "other (give each output a path of its own)", o->key, o->path, p->key,
                         p->path);
            else
                snprintf(err, errlen, "%s %s is also %s %s: writing it would destroy it "
                         "(give the output another path)", o->key, o->path, p->key, p->path);
            return -1;
        }
    }
    return 0;
}

/* The largest pid Linux hands out (PID_MAX_LIMIT on 64-bit systems, the most
 * kernel.pid_max takes) */
enum { PID_LIMIT = 4194304 };

/* A save killed mid-write leaves PATH.tmp.<pid> (engine/checkpoint.c, output_whole_open)
 * behind: removes entry (of dir) if it is one whose writer is gone, so crashes do not pile
 * up partial copies. Only that name, a pid as a writer writes it after ".tmp." (no leading
 * zero, at most PID_LIMIT): a user's PATH.tmp.notes, PATH.tmp.0 or PATH.tmp.20251129 (a
 * date, which no process has for its pid) is theirs. */
static void remove_if_stale(const char *dir, const char *base, const char *entry) {
    size_t len = strlen(base);
    if (strncmp(entry, base, len) != 0 || strncmp(entry + len, ".tmp.", 5) != 0) return;
    const char *digits = entry + len + 5;
    size_t n = strlen(digits);
    if (n == 0 || digits[0] == '0' || strspn(digits, "0123456789") != n) return;
    long pid = strtol(digits, NULL, 10);
    if (pid > PID_LIMIT) return;
    if (kill((pid_t)pid, 0) != 0 && errno == ESRCH) {
        char full[2 * CFG_STR_MAX];
        snprintf(full, sizeof(full), "%s/%s", dir, entry);
        if (unlink(full) == 0) log_info("removed %s, left by a write that was killed\n", full);
    }
}

/* remove_if_stale on every entry of dir: the temporary files of base's killed writers */
static void remove_stale_in(const char *dir, const char *base) {
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) remove_if_stale(dir, base, e->d_name);
    if (d) closedir(d);
}

/* The name under which the checkpoint of one step is kept: ckpt.h5 -> ckpt.step42.h5 */
static void versioned_name(const char *path, long step, char *out, size_t n) {
    size_t len = strlen(path);
    if (len > 3 && strcmp(path + len - 3, ".h5") == 0)
        snprintf(out, n, "%.*s.step%ld.h5", (int)(len - 3), path, step);
    else
        snprintf(out, n, "%s.step%ld", path, step);
}

/* train.keep = k > 1 keeps the last k checkpoints as hard links to what path held, so
 * path is always the newest and every kept file is complete. Older links are removed. */
/* 0 when the file at name, which a version of the checkpoint would replace, is absent or
 * a checkpoint; else -1 with err: it is not a regular file (a FIFO's open would wait for a
 * writer), or a file of another kind */
static int version_replaceable(const char *name, char *err, size_t n) {
    struct stat st;
    if (lstat(name, &st) != 0) return 0;
    if (!S_ISREG(st.st_mode)) {
        snprintf(err, n, "train.keep %s: exists and is not a regular file, which this run "
                 "would replace (name a new file, or remove this one)", name);
        return -1;
    }
    tokens_hdf5_lock(); /* a loader's thread may read HDF5 meanwhile */
    int rc = existing_is_own_kind("train.keep", name, OUTPUT_CHECKPOINT, err, n);
    tokens_hdf5_unlock();
    return rc;
}

void save_keep_version(const char *path, long step, int keep, long *kept, int *n_kept) {
    char name[CFG_STR_MAX + 32], why[CFG_STR_MAX + 256];
    versioned_name(path, step, name, sizeof(name));
    /* save_versions_check saw the steps a run saves by train.save_every; a save on a stop
     * signal comes at any step */
    if (version_replaceable(name, why, sizeof why) != 0) {
        log_warn("did not keep %s: a file of another kind has that name", name);
        return;
    }
    unlink(name);
    if (link(path, name) != 0) {
        log_warn("could not keep %s: %s", name, strerror(errno));
        return;
    }
    kept[(*n_kept)++] = step;
    while (*n_kept > keep) {
        versioned_name(path, kept[0], name, sizeof(name));
        unlink(name);
        memmove(kept, kept + 1, sizeof(long) * (size_t)--(*n_kept));
    }
}

/* The step of a version of base (versioned_name) that entry names, or 0 when it is none */
static long version_step(const char *base, const char *entry) {
    size_t len = strlen(base);
    int h5 = len > 3 && strcmp(base + len - 3, ".h5") == 0;
    char prefix[CFG_STR_MAX + 8], name[CFG_STR_MAX + 32]; /* versioned_name's, up to the step */
    snprintf(prefix, sizeof(prefix), "%.*s.step", (int)(h5 ? len - 3 : len), base);
    size_t plen = strlen(prefix);
    if (strncmp(entry, prefix, plen) != 0) return 0;
    char *end;
    long step = strtol(entry + plen, &end, 10);
    if (end == entry + plen || step < 1) return 0;
    versioned_name(base, step, name, sizeof(name));
    return strcmp(name, entry) == 0 ? step : 0; /* else another file's name */
}

int save_versions_check(const char *path, long first, long last, long every, int keep,
                        char *err, size_t n) {
    if (!path[0] || keep < 2 || last < first) return 0;
    path_parts parts;
    path_split(path, &parts);
    const char *base = parts.base, *dir = parts.dir;
    DIR *d = opendir(dir);
    int rc = 0;
    for (struct dirent *e; d && rc == 0 && (e = readdir(d));) {
        long step = version_step(base, e->d_name);
        if (step < first || step > last || (step != last && (every <= 0 || step % every)))
            continue; /* not one this run saves */
        char full[2 * CFG_STR_MAX + 32];
        versioned_name(path, step, full, sizeof(full));
        rc = version_replaceable(full, err, n);
    }
    if (d) closedir(d);
    return rc;
}

void output_tidy_stale(const char *path) {
    if (!path[0] || strncmp(path, "/dev/", 5) == 0 || strncmp(path, "/proc/", 6) == 0) return;
    char *real = realpath(path, NULL); /* NULL: not made yet, or its directory is not */
    path_parts parts;
    path_split(real ? real : path, &parts);
    free(real);
    remove_stale_in(parts.dir, parts.base);
}

void save_dir_tidy(const char *path, long first, int keep, long *kept, int *n_kept) {
    path_parts parts;
    path_split(path, &parts);
    const char *base = parts.base, *dir = parts.dir;
    remove_stale_in(dir, base);
    DIR *d = keep > 1 ? opendir(dir) : NULL; /* else no version is kept: none to count */
    if (!d) return;
    long found[SAVE_KEPT_FOUND]; /* [n]: the newest versions */
    int n = 0, n_later = 0;
    long later_lo = 0, later_hi = 0; /* the steps of versions at or past first */
    for (struct dirent *e; (e = readdir(d));) {
        long step = version_step(base, e->d_name);
        if (step >= first) { /* of an earlier run that went further */
            later_lo = n_later == 0 || step < later_lo ? step : later_lo;
            later_hi = step > later_hi ? step : later_hi;
            n_later++;
        }
        if (step == 0 || step >= first) continue; /* not one an earlier run kept */
        if (n < SAVE_KEPT_FOUND) found[n++] = step;
        else {
            int oldest = 0;
            for (int i = 1; i < n; i++) if (found[i] < found[oldest]) oldest = i;
            if (step > found[oldest]) found[oldest] = step;
        }
    }
    closedir(d);
    /* a run resumed from before the newest version (a rewind, or a wrong train.init) must
     * not delete them: they may be all that is left of the run that went further */
    if (n_later > 0) {
        char lo[CFG_STR_MAX + 32], hi[CFG_STR_MAX + 32];
        versioned_name(path, later_lo, lo, sizeof lo);
        versioned_name(path, later_hi, hi, sizeof hi);
        log_warn("train.keep: %d version(s) of steps from this run's first (%ld) on, %s%s%s, "
                 "are of an earlier run that went further: where this run saves the same step "
                 "it replaces them, the others stay as they are and do not count against "
                 "train.keep = %d", n_later, first, lo, n_later > 1 ? " to " : "",
                 n_later > 1 ? hi : "", keep);
    }
    for (int i = 1; i < n; i++) /* ascending */
        for (int j = i; j > 0 && found[j] < found[j - 1]; j--) {
            long t = found[j];
            found[j] = found[j - 1], found[j - 1] = t;
        }
    /* they count against keep, and the first save removes the oldest past it: not here,
     * where a run that fails or saves nothing would have removed them for nothing */
    for (int i = 0; i < n; i++) kept[(*n_kept)++] = found[i];
}
