/* quarantine_state.h: the quarantine's state, Q, shared by its files and
 * no other (quarantine.c: the FIFO and the bins, which own it;
 * quarantine_reuse.c: the reuse choice and gathering; quarantine_limits.c:
 * the limits and the chunks that go). All of it under S.lock.
 */
#ifndef QM_QUARANTINE_STATE_H
#define QM_QUARANTINE_STATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "age.h"
#include "large.h"
#include "random.h"

typedef struct qm_q_state {
  /* the FIFO, oldest first: positions of LF.qring holding record indices
   * (a chunk's own in its q.pos), QM_AGE_EMPTY where a chunk left from
   * within; cap positions in use, a power of two up to LF.blk_max (0 until
   * the first chunk enters); age, the aged prefix: the entries, empty ones
   * included, before the first chunk not aged (fifo.n: all are) */
  qm_age_t fifo;
  uint32_t cap, age;
  uint32_t pushes; /* chunks entered, counted up to PREFILL_AT */
  /* aged chunks: hot[] by resident pages (dirty), cold[] (none resident) by
   * capacity; nhot[] counts the hot bins, demand[] the requests per class */
  uint32_t hot[NBINS], cold[NBINS], nhot[NBINS], demand[NBINS];
  uint32_t demand_clock;
  qm_rng_t rng;                     /* the reuse choice */
  size_t qcount, qpages, qresident; /* chunks, usable pages, resident pages */
  size_t ltail; /* resident pages live chunks hold past their RW part (the budget counts them) */
  size_t live;  /* bytes live large chunks were asked for (the budget follows them) */
  /* quarantined chunks unmapped before their window passed, and chunks
   * the belt should carry mapped on their own (secondary.c): only out of
   * address space, memory or mappings, only in the default profile */
  uint64_t window_breaks;
} qm_q_state_t;
extern QM_HIDDEN qm_q_state_t qm__q;
#define Q qm__q

/* The k-th oldest entry of the FIFO (k < fifo.n): a record index, or
 * QM_AGE_EMPTY. */
static inline uint32_t qm_q_fifo_at(uint32_t k) { return LF.qring[qm_age_at(&Q.fifo, k, Q.cap)]; }

/* An aged chunk into its bin (by resident pages, or capacity if none),
 * and out of it; either does nothing where it is already so. */
void qm__q_bin_insert(uint32_t i);
void qm__q_bin_remove(uint32_t i);

#endif
