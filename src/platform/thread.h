/* thread.h: the calling thread's hot state in one initial-exec TLS block,
 * so that each fast path reaches all of it through one thread-pointer
 * offset (one GOT load in a shared library) instead of one per variable.
 * Each field keeps its owning module (named beside it) and its old name,
 * as a macro, like errno; only the thread itself touches its block (a
 * signal handler on it included), but for racy reads of bin counts by stats.
 */
#ifndef QM_THREAD_H
#define QM_THREAD_H

#include <stdint.h>

#include "qm.h"

/* The small chunks' size classes (primary.h owns them): here because the
 * block holds a bin for each, and one for the zero-size region. */
#define QM_NCLASS 52

/* A bin: its count and capacity here, its slot array (chunk addresses,
 * slot[count-1] the next handed out) in qm__bin_slot, both indexed by
 * class. Apart, each is one scaled TLS access on malloc's path, where a
 * 16-byte element's address took four instructions to form. */
typedef struct qm_bin {
  uint32_t count, max;
} qm_bin_t;

/* Frees parked for their canary check (smallstate.h says how): entry i
 * of the ring is pend_slot[i] (chunk | generation << 48), pend_at[i]
 * (where its canary is | its class << 48: the batch reads the class
 * instead of working it out) and pend_by[i]. Three arrays of words, not
 * one of pairs: free stores each through one scaled TLS address, where a
 * 16-byte element's address took four instructions to form. */
#define QM_PEND_HALF 16u
#define QM_PEND_N (2 * QM_PEND_HALF)
#define QM_PEND_AT(at) ((at)&QM_ADDR_MASK)
#define QM_PEND_CLASS(at) ((unsigned)((at) >> QM_ADDR_BITS))

typedef struct qm_thread {
  uintptr_t freeing;                  /* smallstate.h: qm__freeing */
  uint64_t me;                        /* smallstate.h: qm__me */
  uint64_t rng;                       /* random.h: qm__rng */
  uint32_t sample_left;               /* guarded.h: qm__sample_left */
  uint64_t pend_i;                    /* smallstate.h: qm__pend_i (never wraps) */
  uintptr_t pend_slot[QM_PEND_N];     /* smallstate.h: qm__pend_slot */
  uintptr_t pend_at[QM_PEND_N];       /* smallstate.h: qm__pend_at */
  qm_bin_t bin[QM_NCLASS + 1];        /* cache.h: qm__bin */
  uintptr_t *bin_slot[QM_NCLASS + 1]; /* cache.h: qm__bin_slot */
  uintptr_t pend_by[QM_PEND_N];       /* smallstate.h: qm__pend_by */
} qm_thread_t;

extern __thread qm_thread_t qm__t __attribute__((tls_model("initial-exec")));

/* The busy mark's values other than a pointer (smallstate.h says what the
 * mark is for): busy with no one pointer, and p | QM_REALLOCING while
 * realloc works on p. */
#define QM_BUSY ((uintptr_t)1)
#define QM_REALLOCING ((uintptr_t)2)
/* The chunk at user pointer p stops being the program's: its free or move
 * made it the heap's, under its side's lock, before another thread can
 * have the address. A mark naming p turns plain busy, so that a signal
 * handler's free of whatever takes the address next is not reported as a
 * second free of p; one of p itself still is, when its side finds p freed
 * as the deferred free is applied. */
QM_INLINE void qm_mark_released(uintptr_t p) {
  if ((qm__t.freeing & ~QM_REALLOCING) == p) {
    qm__t.freeing = QM_BUSY;
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
  }
}

#define qm__freeing (qm__t.freeing)
#define qm__me (qm__t.me)
#define qm__rng (qm__t.rng)
#define qm__sample_left (qm__t.sample_left)
#define qm__pend_i (qm__t.pend_i)
#define qm__pend_slot (qm__t.pend_slot)
#define qm__pend_at (qm__t.pend_at)
#define qm__pend_by (qm__t.pend_by)
#define qm__bin (qm__t.bin)
#define qm__bin_slot (qm__t.bin_slot)

#endif
