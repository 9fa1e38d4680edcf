/* smallstate.h: the state of every small chunk, out of band. Each class
 * region has a table with one 64-bit entry per chunk slot (entry i is the
 * chunk at region + i * size), in a reservation of its own between guard
 * pages, committed as the region is carved: state, requested size, alignment
 * offset and asked-for alignment, owning thread and a generation (entry.h:
 * the format). Nothing inside a chunk is
 * allocator state, so nothing a program writes into its heap is trusted.
 * Invariants: only the owning thread writes an entry of a chunk it owns,
 * with plain stores, but for one compare-and-swap ALLOC -> SENT by a thread
 * that frees it and sends it to the owner (see inbox.c);
 * owner 0 (a thread with no cache) means any thread may change the entry,
 * by compare-and-swap; an ALLOC entry's size + offset + 8 <= class size.
 */
#ifndef QM_SMALLSTATE_H
#define QM_SMALLSTATE_H

#include <stdint.h>
#include <string.h>

#include "canary.h"
#include "entry.h"
#include "lock.h"
#include "primary.h"
#include "qm.h"
#include "report.h"
#include "thread.h"

/* The calling thread's identity as an entry's owner and state bits
 * (ALLOC | id << 32), or QM_E_NOBODY while it has no cache: the free fast
 * path takes an entry whose state, offset and owner equal it with one
 * compare. */
/* qm__me, in thread.h */
/* The pointer this thread is freeing right now, QM_BUSY while its malloc
 * changes its cache (0 when neither): a free that finds it set was
 * re-entered from a signal handler, and takes the nested path, which takes
 * no lock and leaves the cache alone. */
/* qm__freeing, in thread.h */
QM_INLINE void qm_freeing_set(uintptr_t p) {
  qm__freeing = p;
  __atomic_signal_fence(__ATOMIC_SEQ_CST);
}
/* Puts back the mark a fast path found (0, or the mark of the call a
 * signal handler that called it interrupted). */
QM_INLINE void qm_freeing_restore(uintptr_t was) {
  __atomic_signal_fence(__ATOMIC_SEQ_CST);
  qm__freeing = was;
}
QM_INLINE void qm_freeing_clear(void) { qm_freeing_restore(0); }
/* QM_BUSY, QM_REALLOCING (p | QM_REALLOCING: realloc is at work on p; a
 * free of p from a signal handler meanwhile reports) and qm_mark_released
 * in thread.h, for the sides that release a chunk under their lock */
/* Marks the cache busy on a slow path unless a free already did; the
 * value to pass to qm_busy_leave. */
QM_INLINE uintptr_t qm_busy_enter(void) {
  uintptr_t was = qm__freeing;
  if (!was)
    qm_freeing_set(QM_BUSY);
  return was;
}
QM_INLINE void qm_busy_leave(uintptr_t was) {
  if (!was)
    qm_freeing_clear();
}

/* Frees waiting for their canary check: the free fast path makes the
 * entry FREE, starts fetching the canary's line and parks the chunk in a
 * ring of two halves; each time it fills one half, qm__small_pend_batch
 * checks the other (parked QM_PEND_HALF to 2 * QM_PEND_HALF - 1 frees ago)
 * and puts its chunks in the bins in one pass. So free never waits on the
 * chunk's memory, its own path holds one check less and one bin insert
 * less, and a chunk is never handed out again unchecked. Emptied, the same
 * way, on every refill, cache flush, thread exit, fork and process exit.
 * Not used in checked mode, where a free checks at once. An entry carries
 * the slot (chunk | generation after the free << 48), from which the
 * expected canary follows, and the canary's address and the class. The
 * ring holds no empty entries: qm__pend_i counts the frees parked since it
 * was last emptied (64 bits: it never wraps), so the entries not yet
 * checked are its last pend_i % QM_PEND_HALF + QM_PEND_HALF (all of them
 * below QM_PEND_N), and the batch of the half not just filled has nothing
 * to do until QM_PEND_N frees were parked. */
/* the ring, qm__pend_slot, qm__pend_at and qm__pend_by (the return
 * address of each parked free), and its count qm__pend_i, are in thread.h */
/* Checks and bins the half of the ring the fast path did not just fill;
 * called when the count of parked frees k reaches a multiple of
 * QM_PEND_HALF. */
void qm__small_pend_batch(uint64_t k);
/* A parked chunk (ring entry i) whose canary changed: reports, naming the
 * free that parked it. */
_Noreturn void qm__small_pend_error(unsigned i) QM_COLD;
/* Checks every parked chunk of this thread and puts it in the bin. */
void qm__small_pend_flush(void);

/* Free of small pointer p (off = p - qm__pbase < qm__pspan) past the fast
 * path: over-aligned chunks, frees of chunks another thread owns, checked
 * mode, and every error. Called with qm__freeing set to p; clears it. */
void qm__small_free_slow(void *p, uintptr_t off);
/* A free re-entered from a signal handler while this thread frees
 * qm__freeing (or mallocs; any chunk): the same pointer aborts; a small
 * chunk is checked and made SENT now, by compare-and-swap, so a later free
 * of it reports at once, and made FREE (or sent to its owner) at the
 * thread's next refill or exit, as a free from another thread; any other
 * is applied then. */
void qm__free_nested(void *p);
/* Puts a chunk just marked FREE (slot: chunk | generation << 48) into the
 * calling thread's cache; in checked mode it is zeroed and its neighbours
 * checked first. */
void qm__small_release(uintptr_t slot, unsigned c);
/* Checked mode with zero_on_free: a chunk another thread frees is zeroed
 * by that thread, all but its canary (at `canary`, which the owner's
 * checks of its live neighbours may be reading), as it is made SENT; the
 * owner, settling it, checks it is still zero (canary cleared by then).
 * So a read after free finds zeros at once, and a write while the chunk
 * waits in an outbox or inbox is reported, as a write after free. */
void qm__small_zero_sent(uintptr_t ch, unsigned c, uintptr_t canary);
void qm__small_check_sent(uintptr_t ch, unsigned c);
/* The same before the canary at `canary` is cleared (a free re-entered
 * from a signal handler, sent on): every byte but the canary's zero. */
void qm__small_check_sent_but(uintptr_t ch, unsigned c, uintptr_t canary);
/* qm__small_release of a settled chunk (a free sent by another thread):
 * in checked mode with zero_on_free, checked zero instead of zeroed. */
void qm__small_release_sent(uintptr_t slot, unsigned c);
/* Validates small pointer p for op (realloc, usable size, sized free):
 * a live chunk, p its user pointer, its canary intact. Returns the chunk
 * and its entry, or reports. */
uintptr_t qm__small_check(qm_op_t op, void *p, uintptr_t off, unsigned *cls, uint64_t **entry,
                          uint64_t *word);
/* Hands out the chunk of bin slot s of class c on malloc's slow path:
 * checks its entry is not ALLOC (and, in checked mode, that it is still
 * zero), writes entry and canary. */
void *qm__small_hand_out(uintptr_t s, unsigned c, size_t n, size_t align);
/* Checked mode's malloc of n bytes (0 < n < qm__small_limit, no
 * guard_all), after init, marked busy (qm_busy_enter): NULL and ENOMEM
 * when no class can serve it. */
void *qm__small_malloc_checked(size_t n);
/* Checked mode's malloc on malloc's own path, for class c = qm_class_of(n)
 * (QM_ZCLASS for 0), marked busy (QM_BUSY): the common case, a thread with
 * a cache taking from its own bin with nothing sent to it, with no init,
 * busy or class-loop work per call; anything else goes to qm__malloc_slow.
 * Leaves the mark cleared. */
void *qm__small_malloc_checked_fast(size_t n, unsigned c, uintptr_t was);
/* A bin slot whose chunk is not in its class region. */
_Noreturn void qm__small_bad_pop(uintptr_t ch, unsigned c) QM_COLD;
/* In-place realloc of p to n bytes, when this thread may change its entry
 * (it owns it, or nobody does); false otherwise. */
bool qm__small_resize(void *p, uintptr_t ch, unsigned c, uint64_t *e, uint64_t w, size_t n);

/* The small-chunk heap's side of qm__describe(): a chunk of a class region
 * (live, freed or never allocated: plain memory, whose faults are the
 * program's own doing), a guard, space by one, an unused part, or the
 * zero-size region. Lock-free. */
bool qm__small_describe(uintptr_t addr, qm_place_t *pl);
/* The same, and the guard page below the heap: the describer init
 * registers (describe.h). */
bool qm__small_describe_heap(uintptr_t addr, qm_place_t *pl);

/* Thread identity, for cache.c: a thread takes id (1..QM_MAX_OWNERS-1)
 * with its cache, applying what was sent to the id while nobody had it;
 * drains what other threads sent it (and its deferred re-entered frees) on
 * its refills; gives the id up at exit (what is sent later is applied by
 * the senders, under the id's lock). */
void qm__state_adopt(unsigned id);
void qm__state_drain(void);
/* Leaves the busy mark qm_busy_enter returned was, applying first the
 * frees signal handlers deferred while it was set, by a caller that holds
 * no lock: for calls that are not refills (stats, trim), on a thread that
 * may never refill. A handler's free landing after the last check and
 * before the mark is cleared is deferred too, so the check is made again
 * once it is clear. */
void qm__busy_leave_applying(uintptr_t was);
#ifdef QM_TEST_HOOKS
/* Test hook: the frees waiting in id's inbox (its thread idle meanwhile). */
size_t qm__state_inbox_waiting(unsigned id);
/* Test hook: called by qm__busy_leave_applying and by the frees past the
 * fast path (free_leave) after their check and before the mark is
 * cleared, as a signal handler that landed there would run. */
extern void (*qm__busy_leaving_hook)(void);
/* Test hook: from qm__lock_watch(true) on, the calling thread counts the
 * locks it takes unmarked (lock.h), its exit included; qm__lock_unmarked
 * gives the count and where the first was taken. */
void qm__lock_watch(bool on);
unsigned qm__lock_unmarked(const char **file, int *line);
#endif
/* malloc's refill of class c (qm__cache_take_slow) once what other threads
 * sent this one is back in its bins. */
uintptr_t qm__small_take_slow(unsigned c);
void qm__state_flush_outbox(void);
void qm__state_retire(unsigned id);
/* In a fork child: the ids of the parent's other threads have no thread;
 * what was sent to them is applied now. */
void qm__state_orphan(unsigned id);
/* In a fork child, once the other ids are closed and before the free
 * chunks take fresh generations: the frees this thread has not sent yet
 * (they go to the central lists) and the ones sent to it (to its bins) are
 * applied now. Settled later, each took its parent's next generation, the
 * same in every child. */
void qm__state_fork_settle(void);
/* In a fork child: free chunk s (chunk | generation << 48, or a chunk
 * alone) of class c takes a fresh random generation, so its canary once
 * handed out is not the one its parent's or a sibling's copy has; returns
 * chunk | new generation << 48. */
uintptr_t qm__small_regen(uintptr_t s, unsigned c);
/* In a fork child: this thread's parked frees take fresh generations. */
void qm__small_pend_regen(void);
/* Maps the steering state (inboxes, spare batches), in init before the
 * seal; -1 without memory, when small chunks are not used. */
int qm__state_init(void);
/* Fork's part: msg_lock, then the locks of owner ids 1..ids-1 (every id
 * given out so far: a sender may hold an exited thread's while it applies
 * frees to it, and the child sends to that id again). An id's lock is
 * taken under no other lock and takes none. */
void qm__state_fork_prepare(unsigned ids);
/* Owner id's lock (for the tests' hooks). */
qm_lock_t *qm__state_owner_lock(unsigned id);
void qm__state_fork_parent(void);
void qm__state_fork_child(void);

#endif
