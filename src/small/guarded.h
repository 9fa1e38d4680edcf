/* guarded.h: guarded slots for small requests, sampled (sample_rate: about 1
 * in N small mallocs) or all of them (guard_all=1). A slot is whole pages
 * between guard pages, the chunk placed flush against the trailing guard;
 * freed slots age inaccessible in a quarantine of their own before reuse.
 */
#ifndef QM_GUARDED_H
#define QM_GUARDED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fmt.h"
#include "qm.h"
#include "qmalloc.h"
#include "report.h"
#include "seal.h"

/* The per-thread countdown to the next sampled malloc: the one thing the
 * malloc fast path pays for sampling (a decrement and a branch). Starts at 1
 * in every thread, so a thread's first small malloc arms it. */
/* qm__sample_left, in thread.h */

/* The slots' reservation (sealed, seal.h); both 0 until the first guarded
 * allocation, and then never changed: a pointer in it was handed out after
 * they were set. */
QM_INLINE bool qm_guarded_owns(const void *p) {
  const qm_guarded_fixed_t *f = qm__gfix;
  size_t span = __atomic_load_n(&f->span, __ATOMIC_ACQUIRE);
  /* base is read even while span is 0 (the answer is then false): an
   * atomic read, as setup's write is, so that is no data race */
  return (uintptr_t)p - __atomic_load_n(&f->base, __ATOMIC_RELAXED) < span;
}

/* The next value of the countdown, after it reached zero (0 is never
 * returned; a huge one where sampling is off). */
uint32_t qm__sample_next(void);
/* Whether the countdown asked for this allocation: false on a thread's first
 * small malloc (which only arms it) and when sampling is off. */
bool qm__sample_due(void);

/* A guarded slot for n bytes aligned to align (0: the alignment a type of n
 * bytes can need, at most 16). NULL when none can be had (no address space,
 * the mapping budget spent, n too large): the caller serves the request an
 * ordinary way. */
void *qm__guarded_alloc(size_t n, size_t align);
/* Frees a pointer qm_guarded_owns(); reports a bad one as op. */
void qm__guarded_free(void *p, qm_op_t op);
/* The requested size of a live guarded chunk, and in *align the alignment
 * it was asked for (16 for malloc's); reports as op otherwise. */
size_t qm__guarded_size(void *p, qm_op_t op, size_t *align);
/* Bytes from a to the end of the live chunk holding it; 0 elsewhere. */
size_t qm__guarded_object_size(uintptr_t a);
/* The sampled slots' side of qm__describe(); lock-free, allocation-free. */
bool qm__guarded_describe(uintptr_t a, qm_place_t *pl);
void qm__guarded_stats(qm_stats_t *s);
/* Of a mapping budget of `total` VMAs, how many the guarded slots keep for
 * themselves (the secondary takes its budget from the rest). */
size_t qm__guarded_maps_reserved(size_t total);

void qm__guarded_fork_prepare(void);
void qm__guarded_fork_parent(void);
void qm__guarded_fork_child(void);

#endif
