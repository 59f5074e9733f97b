/* Console output: information from rank 0 only, errors as one line on stderr. */
#ifndef GPTC_LOG_H
#define GPTC_LOG_H

void log_set_rank(int rank);
int log_rank(void);
/* printf to stdout on rank 0 */
void log_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* "gptc: error: ..." on stderr, from whichever rank calls it */
void log_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
