/* The timing report and trace of DESIGN section 4, assembled on rank 0 from every rank's
 * records (engine/timing.h) at the end of the run. */
#ifndef GPTC_REPORT_H
#define GPTC_REPORT_H

#include <stddef.h>

typedef struct comm_group comm_group;

/* Collective over world (NULL for one rank). Writes profile.report (JSON) and
 * profile.trace (Chrome trace events) where the paths are non-empty, and prints the
 * human table on rank 0. Returns 0, or -1 with a one-line error on rank 0. */
int report_write(comm_group *world, const char *report_path, const char *trace_path,
                 char *err, size_t errlen);

#endif
