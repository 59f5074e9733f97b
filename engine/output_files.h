/* Output paths and the checkpoint files of train.save (engine/output_files.c). */
#ifndef GPTC_OUTPUT_FILES_H
#define GPTC_OUTPUT_FILES_H

#include <stddef.h>
#include <stdio.h>

/* What an output is: a stream (metrics, trace, report: appended to or rewritten in place),
 * or a file written beside its path and renamed over it (a checkpoint, gptc-data's token
 * file), which an existing file at path must be one of. The streams are told apart by
 * their first key ("step", "traceEvents", "ranks"). */
typedef enum {
    OUTPUT_METRICS, OUTPUT_TRACE, OUTPUT_REPORT, OUTPUT_CHECKPOINT, OUTPUT_TOKENS
} output_kind;

/* 0 when rank 0 will be able to write path (the value of key; empty: nothing to check)
 * at the end of a long run, else -1 with err naming key and the cause. */
int output_path_check(const char *key, const char *path, output_kind kind, char *err, size_t n);

/* fopen(path, append ? "a" : "w") for a stream output (metrics, trace, report), except
 * that a FIFO with no reader fails at once, errno ENXIO (output_stream_error says so),
 * where fopen would wait for a reader forever; one with a reader is written as a file.
 * /dev/stdout, /dev/stderr, /dev/fd/N and /proc/self/fd/N are written through a dup of
 * that descriptor, after stdout is flushed: into a file the shell redirected stdout to,
 * the output lands between the run's lines, not over them. */
FILE *output_stream_open(const char *path, int append);

/* Opens /dev/null on each of descriptors 0, 1 and 2 that the process started with closed,
 * and notes which: otherwise the next file opened (a log, a checkpoint) takes the number,
 * and the run's lines, written to stdout, land in it. A later /dev/stdout (or its fd name)
 * as an output path is then refused, EBADF. Call first in main; -1 when /dev/null could
 * not be opened (the caller must stop: its files would take the numbers). */
int output_guard_std_fds(void);
/* 1 when path ("-" for stdin, /dev/stdin, /dev/fd/N, ...) names one of descriptors 0-2
 * that the process started with closed: reading it would read /dev/null's nothing */
int output_names_closed_std(const char *path);

/* buf[n] = why output_stream_open failed, from its errno */
const char *output_stream_error(int errnum, char *buf, size_t n);

/* Puts the finished file tmp in place of path, durably: fsyncs tmp, renames it over path,
 * fsyncs path's directory. 0, or -1 with why = "cannot fsync temporary file TMP: cause",
 * "cannot rename into place temporary file TMP: cause" (tmp is then left for the caller
 * to remove) or "cannot fsync directory DIR: cause" (path is then the new file). */
int output_replace(const char *tmp, const char *path, char *why, size_t n);

/* An output written whole at the end of a run (the timing report, the trace). A regular
 * file, or a name not yet taken, is written as PATH.tmp.<pid> beside it and put in its
 * place by output_whole_close, so that a full disk or a kill leaves the earlier file as it
 * was, never a torn one; a symbolic link's target is the file replaced. A FIFO or a device
 * (a reader, /dev/stdout) is written in place, as output_stream_open does, and so is any
 * path under /dev or /proc. */
typedef struct {
    FILE *f;
    char *path; /* the file replaced (a link's target) */
    char *tmp;  /* NULL: written in place */
} output_whole;

/* 0 with o->f open for writing, or -1 with why[n]. A path output_whole_hold opened is
 * not opened again: o->f is the stream it holds. */
int output_whole_open(output_whole *o, const char *path, char *why, size_t n);

/* Opens now, and holds until output_whole_open takes it, an output written at the end
 * that is a FIFO: one with no reader is refused at the start (-1, why[n] says so), not
 * after the last step with the run's report lost, and the reader that is there gets no
 * end of file between this check and the writing (a probe opened and closed would give it
 * one). 0 for any other path, which is not opened. */
int output_whole_hold(const char *path, char *why, size_t n);

/* Flushes, checks and closes o->f and puts the file in place: 0, or -1 with why[n] (the
 * cause of a failed write: "No space left on device"), the temporary file removed. */
int output_whole_close(output_whole *o, char *why, size_t n);
/* Closes o->f and leaves the earlier file as it was (the temporary one removed): for a
 * writing that cannot be completed (a gather that failed part way) */
void output_whole_abandon(output_whole *o);

/* A file a run names: key (e.g. "train.save") = path, and whether the run writes it. */
typedef struct {
    const char *key, *path;
    int output;
} named_path;

/* 0 when no output of paths[n] is the file of another of them (empty paths aside), else
 * -1 with err naming both keys: writing it would destroy the other (a config, the data,
 * the checkpoint resumed from, another output). train.save may be train.init's file:
 * resuming writes over the checkpoint it read. */
int output_paths_distinct(const named_path *paths, int n, char *err, size_t errlen);

/* Room kept[] needs: the newest SAVE_KEPT_FOUND versions an earlier run kept, and keep + 1 */
enum { SAVE_KEPT_FOUND = 64 };

/* train.keep = keep > 1: keeps the checkpoint just written to path for step as a hard
 * link under a name with the step in it (ckpt.h5 -> ckpt.step42.h5), appends step to
 * kept[] (oldest first) and removes the links older than the newest keep. */
void save_keep_version(const char *path, long step, int keep, long *kept, int *n_kept);

/* At the start of a run that saves to path (rank 0), in its directory: removes the
 * PATH.tmp.<pid> files whose writer is gone (saves killed mid-write); and with keep > 1,
 * puts the versions an earlier run kept before step first (the newest SAVE_KEPT_FOUND)
 * into kept[] (oldest first), so that they count against keep: the first save removes
 * those older than the newest keep. Later versions (of a run that went further) are left
 * alone, with a warning naming them. */
void save_dir_tidy(const char *path, long first, int keep, long *kept, int *n_kept);

/* The same removal beside another output written whole through a temporary file (the
 * report, the trace, a trimmed metrics log), as output_whole_open names it: beside the
 * file path resolves to (rank 0, at the start) */
void output_tidy_stale(const char *path);

/* With keep > 1, the versions this run will write (steps first..last: every every-th, and
 * the last) replace files of their names: 0 when none of those that exist is other than a
 * checkpoint (a user's file named like one), else -1 with err naming it. */
int save_versions_check(const char *path, long first, long last, long every, int keep,
                        char *err, size_t n);

#endif
