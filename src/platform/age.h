/* age.h: the aging queue, a FIFO ring that holds what was freed until it has
 * waited long enough: the guarded slots' quarantine, the zero-size slots,
 * checked mode's delayed small frees, the large chunks' quarantine and
 * their dead records. Invariants: head < cap, n <= cap; the k-th oldest
 * entry is at position (head + k) mod cap; entries leave oldest first, or
 * (uint32_t entries) from within, marked QM_AGE_EMPTY where they were,
 * still counted in n until the head passes them or the queue is compacted.
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

/* ---- leaving from within ----
 * A user whose entries may leave before their turn (a large chunk reused
 * from a bin or unmapped by a budget; a dead record forgotten) keeps
 * uint32_t entries and writes QM_AGE_EMPTY over one that left: O(1), the
 * order of the rest kept. Empty entries still count in n: the oldest ones
 * go with qm_age_skip, the rest when the user compacts a full queue
 * (qm_age_compact). A mark, where the user keeps one (the large
 * quarantine's aged prefix), is an offset from the oldest entry, <= n:
 * both keep it on the same entry, or on the first one after it that did
 * not leave. */
#define QM_AGE_EMPTY UINT32_MAX

/* Pops the empty entries at the head: the oldest entry is one that did not
 * leave, or the queue is empty. */
QM_INLINE void qm_age_skip(qm_age_t *q, const uint32_t *e, uint32_t cap, uint32_t *mark) {
  while (q->n && e[q->head] == QM_AGE_EMPTY) {
    qm_age_pop(q, cap);
    if (mark && *mark)
      (*mark)--;
  }
}

/* Drops the empty entries: the others move toward the oldest, in order,
 * and moved(entry, position) is told each new position (the user keeps
 * them to empty an entry in O(1)). With newcap > cap the queue grows to
 * newcap positions (newcap >= 2 * cap: no entry wraps while it moves); the
 * positions from cap on are the user's storage, made ready. O(n): a user
 * that compacts only a full queue, and grows it when fewer than half its
 * entries are empty, pays O(1) a push. */
static inline void qm_age_compact(qm_age_t *q, uint32_t *e, uint32_t cap, uint32_t newcap,
                                  uint32_t *mark, void (*moved)(uint32_t entry, uint32_t at)) {
  QM_DCHECK(newcap == cap || newcap >= 2 * cap);
  uint32_t kept = 0, m = mark ? *mark : 0, newmark = 0;
  for (uint32_t k = 0; k < q->n; k++) {
    if (k == m)
      newmark = kept;
    uint32_t from = qm_age_at(q, k, cap), x = e[from];
    if (x == QM_AGE_EMPTY)
      continue;
    /* the write trails the read: in place, or past cap into the new part */
    uint32_t to = q->head + kept++;
    if (to >= newcap)
      to -= newcap;
    if (to != from) {
      e[to] = x;
      moved(x, to);
    }
  }
  if (m >= q->n)
    newmark = kept;
  q->n = kept;
  if (mark)
    *mark = newmark;
}

#endif
