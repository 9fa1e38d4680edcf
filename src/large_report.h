/* large_report.h: what reports say about addresses in large chunks
 * (large_report.c).
 */
#ifndef QM_LARGE_REPORT_H
#define QM_LARGE_REPORT_H

#include <stdbool.h>
#include <stdint.h>

#include "fmt.h"
#include "report.h"

/* Describes addr if it is in a large chunk's mapping: *user gets the
 * chunk's user pointer (when user is not NULL), *what the kind of
 * access error ("use-after-free", "heap overflow", ...), details the rest.
 * Lock-free and allocation-free: called from the SIGSEGV handler. */
bool qm__large_describe(uintptr_t addr, qm_access_t *what, uintptr_t *user, qm_buf_t *details);
/* The lines that follow a report about the large chunk whose mapping holds
 * addr: the thread and stack that freed it and how long ago, the thread
 * and stack that allocated it. Lock-free and allocation-free, like
 * qm__large_describe. Nothing when addr is in no large chunk. */
void qm__large_report_stacks(const void *addr);

#endif
