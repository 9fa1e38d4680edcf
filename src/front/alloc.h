/* alloc.h: what alloc.c offers the rest of the library beyond the public
 * qm_ names: the one checked sized free behind free_sized,
 * free_aligned_sized and C++'s sized and aligned operator delete, and the
 * slow path of malloc.
 */
#ifndef QM_ALLOC_H
#define QM_ALLOC_H

#include <stdbool.h>
#include <stddef.h>

/* What qm__free_checked checks: the size passed (QM_FREE_SIZED), the
 * alignment passed (QM_FREE_ALIGNED), and QM_FREE_CXX accepts what C++'s
 * operator new makes of a request (0 -> 1, rounding up to the alignment). */
enum { QM_FREE_SIZED = 1, QM_FREE_ALIGNED = 2, QM_FREE_CXX = 4 };
/* Frees p after checking that size and align name it as how says; call
 * names the entry point in the report. Every size_t is a size that can be
 * passed: SIZE_MAX too is checked, and names no chunk. */
void qm__free_checked(const char *call, void *p, size_t align, size_t size, unsigned how);
/* malloc past its fast path (init, the bootstrap arena, sampled, large and
 * guarded requests, every case checked mode's own path leaves), called
 * with the cache not marked busy. */
void *qm__malloc_slow(size_t n);
/* The free of a chunk outside the primary (large, sampled, start-up),
 * under the caller's mark: what a signal handler defers meanwhile is left
 * for the caller to apply. */
void qm__free_outside(void *p);

#endif
