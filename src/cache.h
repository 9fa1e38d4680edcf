/* cache.h: per-thread caches of small chunks. A thread's bins live in its
 * own TLS (initial-exec: one fs-relative access, no pointer to chase) and
 * start with no room at all, so its first malloc and first free take the
 * slow path, which gives the bins their slot arrays. Only the owning thread
 * touches its bins' counts: no lock, no atomic.
 */
#ifndef QM_CACHE_H
#define QM_CACHE_H

#include <stdint.h>

#include "primary.h"
#include "qm.h"
#include "random.h"
#include "thread.h"

/* QM_NCLASS + 1 bins (thread.h): the bin of QM_ZCLASS exists so that
 * malloc(0) can look at it, and stays empty forever. */

/* Puts chunk into slot[0..n] at a random place; returns n + 1. */
QM_INLINE uint32_t qm_bin_insert(uintptr_t *slot, uint32_t n, uintptr_t chunk) {
  uint32_t j = qm_rand_below(n + 1);
  slot[n] = slot[j];
  slot[j] = chunk;
  return n + 1;
}

/* Checked mode (hardening=max, zero_on_free): every bin keeps max = 0 and
 * count = 0, so both fast paths always fall to the slow ones, which keep the
 * thread's chunks in the same slot arrays under counts of their own and do
 * the checks the fast paths leave out. Set once, by init, before any
 * allocation. */
extern QM_HIDDEN bool qm__cache_checked;
/* Whether the CPU (and the kernel) run AVX2: checked mode then checks and
 * zeroes chunks 32 bytes a step. Set by init, before any allocation. */
extern QM_HIDDEN bool qm__avx2;
#ifdef QM_TEST_HOOKS
/* Test hook: chunks that left a delayed-free ring early (the ring was full). */
size_t qm__cache_delay_early(void);
#endif

/* The slow paths: take one chunk of class c (refilling the cache), or give
 * one back (draining it). take returns 0 when the class is exhausted. In
 * checked mode the caller has zeroed (zero_on_free) and checked the chunk
 * given. */
uintptr_t qm__cache_take_slow(unsigned c);
void qm__cache_give_slow(uintptr_t chunk, unsigned c);
/* Checked mode's own take and give, on the calling thread's live cache
 * (else as the slow ones): take ticks the class's delayed-free ring and
 * draws a chunk (0 when the class is exhausted); give puts a chunk the
 * caller zeroed and checked into the ring (or the bin). The caller drained
 * what other threads sent (qm__state_drain) before the take. */
uintptr_t qm__cache_take_checked(unsigned c);
void qm__cache_give_checked(uintptr_t chunk, unsigned c);
/* Gives the calling thread its cache (and owner id) if it has none yet and
 * may have one, taking id `want` if an exited thread left it (0: any);
 * whether it has one now. A thread whose first act is to free what an
 * exited thread allocated (a successor in a hand-off) so inherits that
 * thread's id: the chunks are its own, freed on the fast path, instead of
 * each sent to whichever thread took the id. */
bool qm__cache_ensure(unsigned want);
/* Empties the calling thread's cache into the central lists. */
void qm__cache_flush_self(void);
/* Sum of chunks held by all thread caches, in bytes (racy: for stats). */
size_t qm__cache_held_bytes(void);
size_t qm__cache_threads(void);

void qm__cache_init(void); /* the thread-exit key; after the primary */
void qm__cache_fork_prepare(void);
void qm__cache_fork_parent(void);
void qm__cache_fork_child(void);
/* The calling thread's group of the central lists. */
unsigned qm__cache_group(void);

#endif
