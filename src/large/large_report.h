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

/* The stacks kept with the large chunk whose mapping holds addr (see
 * qm_kept_t, place.h): fills k and returns it; NULL where no record holds
 * addr or none keeps stacks. Lock-free and allocation-free. */
const qm_kept_t *qm__large_kept(uintptr_t addr, qm_kept_t *k);

#endif
