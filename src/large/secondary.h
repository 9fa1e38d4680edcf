/* secondary.h: large chunks. Each chunk has its own mapping between guard
 * pages; its metadata lives out of band in a record table, never in a page
 * that may be PROT_NONE. Freed chunks age in a quarantine, inaccessible,
 * before they are reused for a request they fit.
 */
#ifndef QM_SECONDARY_H
#define QM_SECONDARY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fmt.h"
#include "qmalloc.h"
#include "report.h"

/* NULL with errno ENOMEM on failure. align: a power of two (page or more is
 * honoured exactly; less is rounded up to a page). zero: calloc semantics. */
void *qm__large_alloc(size_t size, size_t align, bool zero);
/* Reports and aborts on a pointer that is not a live large chunk. */
void qm__large_free(void *p);
/* Bytes the program may write (whole pages); reports as op otherwise. */
size_t qm__large_usable(void *p, qm_op_t op);
/* size >= the large threshold. NULL with errno ENOMEM, p untouched. */
void *qm__large_realloc(void *p, size_t size);
/* The requested size of a live chunk; reports as op otherwise. */
size_t qm__large_size(void *p, qm_op_t op);
/* The same, and the alignment it was requested with (QM_MIN_ALIGN for
 * malloc's and realloc's chunks). */
size_t qm__large_held(void *p, qm_op_t op, size_t *align);
void qm__large_stats(qm_stats_t *s);
/* The most mappings the secondary held at once (its estimate). */
size_t qm__large_mappings_peak(void);

/* malloc_object_size for an address outside the primary: bytes from a to
 * the end of the live chunk holding it, 0 in a freed chunk or a guard page,
 * SIZE_MAX outside every large chunk's mapping. */
size_t qm__large_object_size(uintptr_t a);

/* Drops the pages of every quarantined chunk; returns the bytes dropped. */
size_t qm__large_trim(void);
#ifdef QM_TEST_HOOKS
/* Test hook: unmaps every quarantined chunk (tests start from an empty
 * quarantine). */
void qm__large_flush(void);
#endif

void qm__large_fork_prepare(void);
void qm__large_fork_parent(void);
void qm__large_fork_child(void);

#endif
