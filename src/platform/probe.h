/* probe.h: the kernel verdict the secondary runs on, measured once at first
 * need (not at load) by counting minor faults, cached for the process. */
#ifndef QM_PROBE_H
#define QM_PROBE_H

#include "qmalloc.h"

/* The allocator's verdict and strategy; probes on first call (thread-safe,
 * never allocates). */
const qm_probe_result_t *qm__probe(void);
void qm__probe_fork_prepare(void);
void qm__probe_fork_parent(void);
void qm__probe_fork_child(void);

#endif
