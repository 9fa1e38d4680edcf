/* large_report.h: what the reports learn about addresses in large chunks
 * (large_report.c): the place, and the stacks kept with the chunk. Data
 * only: report.c formats them, and this file calls nothing of it.
 */
#ifndef QM_LARGE_REPORT_H
#define QM_LARGE_REPORT_H

#include <stdbool.h>
#include <stdint.h>

#include "fmt.h"
#include "place.h"

/* The large side of qm__describe(): addr in a large chunk's mapping.
 * Lock-free and allocation-free: called from the SIGSEGV handler. */
bool qm__large_describe(uintptr_t addr, qm_place_t *pl);

/* The stacks kept with the large chunk whose mapping holds an address:
 * who allocated it and, once freed, who freed it and how long ago. The
 * frames point into the record's stack entry (never moved), read racily
 * (counts clamped), as the report that prints them runs. */
typedef struct qm_kept {
  bool freed;
  uint32_t alloc_tid, free_tid;
  uint64_t frees_ago, ms_ago; /* large frees, and ms, since its free */
  const uintptr_t *alloc_pc, *free_pc;
  unsigned nalloc, nfree;
} qm_kept_t;
/* Fills k; false where no record holds addr or none keeps stacks.
 * Lock-free and allocation-free. */
bool qm__large_kept(uintptr_t addr, qm_kept_t *k);

#endif
