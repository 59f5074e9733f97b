/* Token files (HDF5, DESIGN section 4) and the batch loader (DESIGN section 3).
 *
 * A token file holds one 1-D dataset /tokens of uint16 or uint32 and an int64
 * attribute vocab_size on the file root or on the dataset. The loader cuts the token
 * array into W = floor((N-1)/T) windows of T+1 tokens and hands each optimizer step its
 * rows, reading only those windows (hyperslabs), with the next step prefetched on a
 * background thread. */
#ifndef GPTC_TOKENS_H
#define GPTC_TOKENS_H

#include <stddef.h>
#include <stdint.h>

typedef struct token_file token_file;

/* Opens and validates path (exists, is HDF5, has a 1-D integer /tokens, has vocab_size).
 * model_vocab > 0: tokens must also be below it (a file's vocab_size may be larger: a
 * small model on part of a tokenizer's vocabulary). NULL + err on failure; err is one line
 * naming the file and what is wrong. */
token_file *tokens_open(const char *path, long model_vocab, char *err, size_t errlen);
long tokens_count(const token_file *f);      /* N, number of tokens */
long tokens_vocab(const token_file *f);      /* the file's vocab_size attribute */
/* Reads tokens [start, start+count) into dst. A token >= the vocab limit is an error
 * naming the file and position. The limit is the smaller of the file's vocab_size and
 * open's model_vocab, so a token the model cannot embed is always caught (and so is a
 * file that breaks its own vocab_size). */
int tokens_read(token_file *f, long start, long count, int32_t *dst, char *err, size_t errlen);
/* 0 when the files besides f's own that /tokens is read from (virtual sources, external
 * files) are as at open, or were replaced by whole files; else -1 with err. tokens_read
 * checks f's own file after each read, and the loader calls this once a step (a stat of
 * each source: thousands of shards make it milliseconds). */
int tokens_check_sources(token_file *f, char *err, size_t errlen);
/* Hashes this rank's share (part of parts) of the bytes of f's file and of its sources,
 * so that a later same-size write into that share (which a new modification time alone
 * does not tell from a touch) stops the next read, wherever in the share it fell. The
 * files must be as at open. Returns 0, or -1 with err. */
int tokens_watch(token_file *f, int part, int parts, char *err, size_t errlen);
/* The bytes of f's file and of its sources, as at open */
double tokens_file_bytes(token_file *f);
void tokens_close(token_file *f);

/* HDF5 builds without the thread-safe option must not be entered by two threads at
 * once, and a loader reads on a background thread. Every HDF5 call in tokens.c holds
 * this process-wide lock; other code that calls HDF5 while a loader exists (checkpoint
 * save/load) can hold it too. Not recursive: do not call tokens_* or loader_* while
 * holding it. */
void tokens_hdf5_lock(void);
void tokens_hdf5_unlock(void);

typedef struct batch_loader batch_loader;

/* A loader for rows [row_begin, row_end) of a global batch of B windows of T+1 tokens.
 * shuffle = 0: step s (1-based) uses windows ((s-1)*B + j) mod W for j = 0..B-1.
 * shuffle = 1: the same global index g = (s-1)*B + j goes through a seeded permutation
 * of [0, W) that changes every epoch (g / W): still a pure function of (seed, s, j). */
batch_loader *loader_create(const char *path, int T, int B, int row_begin, int row_end,
                            long model_vocab, int shuffle, uint64_t seed,
                            char *err, size_t errlen);
long loader_windows(const batch_loader *l);            /* W */
long loader_window(const batch_loader *l, long step, int j); /* window of global row j */
/* Fills inputs[rows, T] and targets[rows, T] (rows = row_end - row_begin) for step s and
 * starts prefetching step s+1. Any step may be asked for (resume); sequential steps hit
 * the prefetch. Returns 0, or -1 with err set. */
int loader_get(batch_loader *l, long step, int32_t *inputs, int32_t *targets,
               char *err, size_t errlen);
/* Reads part part (0-based) of parts even parts of the file's tokens, so that a token
 * >= the vocab limit anywhere in the file stops the run at its start, whatever steps it
 * runs (parts: the ranks, each checking its part), and watches that share of the file's
 * bytes for writes (tokens_watch). Returns 0, or -1 with err naming the file and
 * position. */
int loader_check(batch_loader *l, int part, int parts, char *err, size_t errlen);
/* The bytes loader_check reads for the largest of parts parts (its tokens, and its share
 * of the files' bytes), and 64 KiB more for each read (its round trip): what a peer on a
 * slower disk may still be reading when this rank is done. 0 for a NULL l. */
double loader_check_bytes(const batch_loader *l, int parts);
/* fp[3] = the file's token count, its vocab_size and a hash of 64 spans of up to 256
 * tokens spread evenly over it: what ranks compare to tell that they read the same data
 * (node-local copies under one name may differ), without reading it all. Call before
 * the first loader_get. Returns 0, or -1 with err. */
int loader_fingerprint(batch_loader *l, uint64_t fp[3], char *err, size_t errlen);
void loader_destroy(batch_loader *l);

#endif
