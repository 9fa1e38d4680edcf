/* age.h: the aging queue, a FIFO ring that holds what was freed until it has
 * waited long enough: the guarded slots' quarantine, the zero-size slots,
 * checked mode's delayed small frees, the large chunks' dead records.
 * Invariants: head < cap, n <= cap; the k-th oldest entry is at position
 * (head + k) mod cap; entries leave oldest first, never from within.
 */
#ifndef QM_AGE_H
#define QM_AGE_H

#include <stdbool.h>
#include <stdint.h>

#include "qm.h"

/* The queue keeps positions only: each user keeps the entries in an array
 * of cap entries of its own, of the type it needs (a 4-byte slot number
 * where a stamp would quadruple the table, a stamped chunk where the age is
 * counted on a clock), and passes cap with every call, from wherever its
 * invariants want it (sealed, for the guarded slots: a writable cap would
 * let corruption index past the table; a constant; the thread's own). */
typedef struct qm_age {
  uint32_t head; /* position of the oldest entry */
  uint32_t n;    /* entries */
} qm_age_t;

/* Position of the k-th oldest entry (k <= n: k == n is where the next push
 * goes). */
QM_INLINE uint32_t qm_age_at(const qm_age_t *q, uint32_t k, uint32_t cap) {
  uint32_t at = q->head + k;
  return at >= cap ? at - cap : at; /* no division: this is on checked mode's malloc path */
}

QM_INLINE bool qm_age_full(const qm_age_t *q, uint32_t cap) { return q->n == cap; }

/* Position for a new entry, now the newest. The caller made room first: a
 * full queue's oldest leaves early (qm_age_pop), and what that means (the
 * chunk served before its time, the slot loose) is the user's to say. */
QM_INLINE uint32_t qm_age_push(qm_age_t *q, uint32_t cap) {
  QM_DCHECK(q->n < cap);
  uint32_t at = qm_age_at(q, q->n, cap);
  q->n++;
  return at;
}

/* Position of the oldest entry (n > 0), which leaves the queue: read it
 * before the next push, which may reuse the position. */
QM_INLINE uint32_t qm_age_pop(qm_age_t *q, uint32_t cap) {
  QM_DCHECK(q->n > 0 && q->head < cap);
  uint32_t at = q->head;
  q->head = at + 1 == cap ? 0 : at + 1;
  q->n--;
  return at;
}

/* An entry stamped with a clock the user advances (checked mode: the
 * thread's mallocs of a class). */
typedef struct qm_aged {
  uintptr_t item;
  uint32_t at; /* the clock when it entered */
} qm_aged_t;

/* Whether the oldest entry of e is older than d by clock now: pop while
 * this holds. The difference is taken modulo 2^32, so a clock that wraps
 * ages its entries right as long as none waits 2^32 ticks (a queue of a
 * few thousand entries, d far below that). */
QM_INLINE bool qm_age_due(const qm_age_t *q, const qm_aged_t *e, uint32_t now, uint32_t d) {
  return q->n && now - e[q->head].at > d;
}

#endif
