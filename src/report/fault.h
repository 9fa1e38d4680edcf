/* fault.h: the SIGSEGV handler that explains faults in qmalloc's guards.
 */
#ifndef QM_FAULT_H
#define QM_FAULT_H

#include <stdbool.h>
#include <stdint.h>

#include "fmt.h"
#include "report.h"

/* Installs it (option fault_report), once, at init. */
void qm__fault_report_init(void);

#endif
