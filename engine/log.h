/* Console output: information from rank 0 only, errors as one line on stderr. */
#ifndef GPTC_LOG_H
#define GPTC_LOG_H

#include <stdarg.h>
#include <stddef.h>

void log_set_rank(int rank);
int log_rank(void);
/* printf to stdout on rank 0 */
void log_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* "gptc: warning: ..." on stderr, rank 0's, one line (fmt without its newline): beside the
 * errors, where a stdout that is gone or to a full disk does not take it along */
void log_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* the same from whichever rank calls it: a condition of that rank alone */
void log_warn_here(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* prefix, then fmt's text on one line (its control characters escaped, a trailing newline
 * dropped), on stderr in one write: the one-line messages of gptc's programs */
void log_vline(const char *prefix, const char *fmt, va_list ap);
/* "gptc: error: ..." on stderr, from whichever rank calls it */
void log_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* calloc(n, size) of the host's small bookkeeping, where out of memory can only end the
 * run: then one line naming the rank and `what`, and exit */
void *log_calloc(size_t n, size_t size, const char *what);
/* realloc(p, bytes), the same way */
void *log_realloc(void *p, size_t bytes, const char *what);

#endif
