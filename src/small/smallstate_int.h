/* smallstate_int.h: what the small chunk's state machine shares among its
 * files (smallstate.c: this thread's side; inbox.c: frees of other threads'
 * chunks and the ids; small_report.c: describing and reports) and no one
 * else includes. The TLS here is the calling thread's alone.
 */
#ifndef QM_SMALLSTATE_INT_H
#define QM_SMALLSTATE_INT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "primary.h"
#include "qm.h"
#include "report.h"
#include "smallstate.h"

/* This thread's id, 0 when it has none. */
QM_INLINE unsigned my_id(void) {
  return qm__me == QM_E_NOBODY ? 0 : (unsigned)(qm__me >> QM_E_OWNER_SHIFT) & 0xffff;
}

/* The chunk holding small pointer a (off = a - qm__pbase < qm__pspan). */
QM_INLINE uintptr_t chunk_of(uintptr_t a, uintptr_t off, unsigned *cls, uintptr_t *roff,
                             uintptr_t *index) {
  unsigned c = (unsigned)(off >> qm__rshift);
  uintptr_t r = off & qm__rmask;
  *cls = c;
  *roff = r;
  *index = c == QM_ZCLASS ? 0 : qm_chunk_index(r, c);
  return a - r + *index * qm__class[c].size;
}

/* inbox.c's: the inbox of this thread's id while it has one, else NULL
 * (drain_due's one load), and the two ends of the ring of frees re-entered
 * from signal handlers (the handler appends at the tail, the drain takes
 * from the head). */
typedef _Atomic(struct msgb *) qm_inbox_t;
extern QM_HIDDEN __thread qm_inbox_t *qm__my_inbox __attribute__((tls_model("initial-exec")));
extern QM_HIDDEN __thread unsigned qm__nested_head __attribute__((tls_model("initial-exec")));
extern QM_HIDDEN __thread unsigned qm__nested_tail __attribute__((tls_model("initial-exec")));

/* Whether qm__state_drain has anything to do: frees other threads sent
 * this one, or frees re-entered from a signal handler. */
QM_INLINE bool drain_due(void) {
  return (qm__my_inbox && atomic_load_explicit(qm__my_inbox, memory_order_relaxed)) ||
         qm__nested_head != qm__nested_tail;
}

/* What drain_due finds, taken on the free paths too (every QM_PEND_HALF
 * frees of the thread's own chunks, every RPEND_N of others'; free_leave
 * after the general and checked frees): frees other threads sent this one (a
 * thread that took over an exited thread's id and only frees has no refill
 * to take them at, and what others freed of its predecessor's chunks stayed
 * in use until it malloc'd or exited), and frees a signal handler deferred
 * in a fast path, which leaves its mark without looking (a large chunk so
 * freed stayed in use as long). Under the caller's freeing mark, no lock
 * held, nothing parked in between (the parked frees are not flushed). */
void qm__state_drain_due(void) QM_COLD;
QM_INLINE void take_due(void) {
  if (QM_UNLIKELY(drain_due()))
    qm__state_drain_due();
}
/* Leaves a free's mark past the fast path, then takes what is due, marked
 * again: one look, after the clear, so that a handler's free landing just
 * before it is taken too (the general path's last call on a thread with no
 * cache had nothing after it to take it: no exit hook, no fast path). */
void qm__free_leave_late(void) QM_COLD;
QM_INLINE void free_leave(void) {
#ifdef QM_TEST_HOOKS
  if (qm__busy_leaving_hook)
    qm__busy_leaving_hook();
#endif
  qm_freeing_clear();
  if (QM_UNLIKELY(drain_due()))
    qm__free_leave_late();
}

/* Free of small pointer p (off = p - qm__pbase) past the fast path but for
 * checked mode's own (qm__small_free_slow's other way): the zero-size
 * region, errors, frees of chunks this thread owns or nobody does, and
 * frees of other threads' chunks, parked and then sent (inbox.c). Clears
 * qm__freeing. */
void qm__small_free_general(void *p, uintptr_t off);

/* Reports (small_report.c, but for the canary's, smallstate.c) */
/* p, passed to op, failed qm__small_check (chunk ch of class c, at roff in
 * its region, slot index). */
_Noreturn void qm__small_error(qm_op_t op, void *p, uintptr_t ch, unsigned c, uintptr_t roff,
                               uintptr_t index) QM_COLD;
/* A free sent to the owner found its chunk's entry (w) changed since. */
_Noreturn void qm__small_late_double_free(uintptr_t p, uint64_t w) QM_COLD;
/* A chunk zeroed at free with a byte set at or after offset at. */
_Noreturn void qm__small_zero_error(uintptr_t ch, unsigned c, size_t at) QM_COLD;
/* Live neighbour n (entry w) of freed chunk ch has a canary off by bad. */
_Noreturn void qm__small_neighbour_error(uintptr_t n, uint64_t w, uint64_t bad, int side,
                                         uintptr_t ch) QM_COLD;
/* The canary at `at` of user pointer p is not expect; by: the return
 * address of the free that parked the chunk, or 0. */
_Noreturn void qm__small_canary_error(uintptr_t p, uintptr_t at, uint64_t expect,
                                      uintptr_t by) QM_COLD;

/* The small chunks' steering state, in guarded metadata (inbox.c);
 * the pointer sealed (sealed.c). */
struct qm_state_meta;
extern QM_HIDDEN struct qm_state_meta *qm__smeta;

#endif
