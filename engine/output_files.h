/* Output paths and the checkpoint files of train.save (engine/output_files.c). */
#ifndef GPTC_OUTPUT_FILES_H
#define GPTC_OUTPUT_FILES_H

#include <stddef.h>

/* 0 when rank 0 will be able to write path (the value of key; empty: nothing to check)
 * at the end of a long run, else -1 with err naming key and the cause. replaced: the file
 * is written beside path and renamed over it (a checkpoint). */
int output_path_check(const char *key, const char *path, int replaced, char *err, size_t n);

/* Removes the PATH.tmp.<pid> files whose writer is gone (saves killed mid-write). */
void save_remove_stale(const char *path);

/* train.keep = keep > 1: keeps the checkpoint just written to path for step as a hard
 * link under a name with the step in it (ckpt.h5 -> ckpt.step42.h5), appends step to
 * kept[] (oldest first, room for keep + 1) and removes the links older than the newest
 * keep. */
void save_keep_version(const char *path, long step, int keep, long *kept, int *n_kept);

/* The versions an earlier run kept before step first, into kept[]: the newest keep of
 * them count against keep, older ones are removed, later ones left alone. */
void save_adopt_versions(const char *path, long first, int keep, long *kept, int *n_kept);

#endif
