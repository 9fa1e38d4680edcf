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

typedef struct qm_bin {
  uint32_t count, max;
  uintptr_t *slot; /* chunk addresses, slot[count-1] is the next handed out */
} qm_bin_t;

/* Frees parked for their canary check (smallstate.h says how). */
#define QM_PEND_HALF 16u
#define QM_PEND_N (2 * QM_PEND_HALF)
typedef struct qm_pend {
  uintptr_t slot; /* chunk | generation << 48 */
  uintptr_t at;   /* where its canary is | its class << 48: the batch
                   * reads the class instead of working it out */
} qm_pend_t;
#define QM_PEND_AT(e) ((e)->at & QM_ADDR_MASK)
#define QM_PEND_CLASS(e) ((unsigned)((e)->at >> QM_ADDR_BITS))

typedef struct qm_thread {
  uintptr_t freeing;            /* smallstate.h: qm__freeing */
  uint64_t me;                  /* smallstate.h: qm__me */
  uint64_t rng;                 /* random.h: qm__rng */
  uint32_t sample_left;         /* guarded.h: qm__sample_left */
  uint64_t pend_i;              /* smallstate.h: qm__pend_i (never wraps) */
  qm_pend_t pend[QM_PEND_N];    /* smallstate.h: qm__pend */
  qm_bin_t bin[QM_NCLASS + 1];  /* cache.h: qm__bin */
  uintptr_t pend_by[QM_PEND_N]; /* smallstate.h: qm__pend_by */
} qm_thread_t;

extern __thread qm_thread_t qm__t __attribute__((tls_model("initial-exec")));

#define qm__freeing (qm__t.freeing)
#define qm__me (qm__t.me)
#define qm__rng (qm__t.rng)
#define qm__sample_left (qm__t.sample_left)
#define qm__pend_i (qm__t.pend_i)
#define qm__pend (qm__t.pend)
#define qm__pend_by (qm__t.pend_by)
#define qm__bin (qm__t.bin)

#endif
