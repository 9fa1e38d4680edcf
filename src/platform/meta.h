/* meta.h: memory for qmalloc's own bookkeeping (thread caches, transfer
 * batches), carved from dedicated mappings that never hold user data and are
 * never returned; callers keep typed free lists of what they release.
 */
#ifndef QM_META_H
#define QM_META_H

#include <stddef.h>
#include <stdint.h>

#include "lock.h"

/* Zeroed, 64-byte aligned; NULL when the kernel has no memory for it. */
void *qm__meta_alloc(size_t size);
extern __attribute__((visibility("hidden"))) qm_lock_t qm__meta_lock;
#ifdef QM_TEST_HOOKS
/* Test hook: the mappings made so far, as [lo, hi) pairs (the maps check). */
size_t qm__meta_ranges(uintptr_t (*out)[2], size_t cap);
#endif

#endif
