/* quarantine.h: what the rest of qmalloc asks of the large chunks'
 * quarantine (quarantine.c); the secondary's own calls are in large.h.
 */
#ifndef QM_QUARANTINE_H
#define QM_QUARANTINE_H

#include <stddef.h>

/* Drops the pages of every quarantined chunk; returns the bytes dropped. */
size_t qm__large_trim(void);
#ifdef QM_TEST_HOOKS
/* Test hook: unmaps every quarantined chunk (tests start from an empty
 * quarantine). */
void qm__large_flush(void);
#endif

#endif
