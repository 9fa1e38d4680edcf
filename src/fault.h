/* fault.h: the SIGSEGV handler that explains faults in qmalloc's guards,
 * and the description of small-chunk addresses it prints.
 */
#ifndef QM_FAULT_H
#define QM_FAULT_H

#include <stdbool.h>
#include <stdint.h>

#include "fmt.h"
#include "report.h"

/* Installs it (option fault_report), once, at init. */
void qm__fault_report_init(void);

/* Describes addr if it is in a sampled small chunk's slot, a guard of the
 * small-chunk heap or an unused part of it (the small side of the SIGSEGV
 * report, and of qm_describe()). Lock-free and allocation-free. */
bool qm__small_describe(uintptr_t addr, qm_access_t *what, qm_buf_t *details);

#endif
