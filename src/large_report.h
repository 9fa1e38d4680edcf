/* large_report.h: what reports say about addresses in large chunks
 * (large_report.c).
 */
#ifndef QM_LARGE_REPORT_H
#define QM_LARGE_REPORT_H

#include <stdbool.h>
#include <stdint.h>

#include "fmt.h"
#include "report.h"

/* The large side of qm__describe(): addr in a large chunk's mapping.
 * Lock-free and allocation-free: called from the SIGSEGV handler. (The
 * stacks that follow a report, qm__large_report_stacks, are declared in
 * report.h: the thread and stack that freed the chunk and how long ago, the
 * thread and stack that allocated it.) */
bool qm__large_describe(uintptr_t addr, qm_place_t *pl);

#endif
