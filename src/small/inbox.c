/* inbox.c: frees of chunks another thread owns, and the ids that make a
 * thread an owner. Who may change an entry: its owner, with plain stores; a
 * thread that frees a chunk another thread owns sends it to that owner (a
 * batch pushed on the owner's inbox, applied on the owner's next refill),
 * and only the owner makes the transition, so of two frees of one chunk,
 * on any threads, exactly one succeeds. An id whose thread is gone has its
 * inbox closed: senders then apply their frees themselves, under the id's
 * lock, until a new thread adopts the id. Also here: free past the fast
 * path but for checked mode's own (mostly the choice to send), the ring of
 * frees re-entered from signal handlers, and the drain of both on a refill.
 */
#include "smallstate.h"

#include <errno.h>
#include <string.h>

#include "cache.h"
#include "lock.h"
#include "meta.h"
#include "options.h"
#include "report.h"
#include "smallstate_int.h"
#include "up.h"
#include "zero.h"

/* ---- frees sent to the owner ----
 * The sender checked the chunk (state, pointer, canary) and made its entry
 * SENT; the owner, applying the batch, checks the entry is still the SENT
 * of the generation the sender saw and makes it FREE. */

#define MSG_CAP 61 /* a batch is 512 bytes */
typedef struct msgb {
  struct msgb *next;
  struct msgb *chain; /* while spare: the next chain on the shared stack */
  uint32_t count, owner;
  uintptr_t m[MSG_CAP]; /* user pointer | generation << 48 */
} msgb_t;

/* An id's inbox (a stack of batches; CLOSED while no thread has the id)
 * and the lock under which senders apply frees to a closed one. */
#define CLOSED ((msgb_t *)1)
typedef struct owner_slot {
  _Atomic(msgb_t *) inbox;
  qm_lock_t lock;
} __attribute__((aligned(64))) owner_slot_t;
/* The steering state (every id's inbox and lock, the shared stack of
 * spare batches and its lock) lives in a metadata mapping between guard
 * pages, mapped at init; the pointer to it is sealed (qm__smeta, sealed.c). In
 * .bss it sat where a stray write past the library's data could redirect
 * frees. */
struct qm_state_meta {
  owner_slot_t owners[QM_MAX_OWNERS];
  qm_lock_t msg_lock;
  struct msgb *msg_spare;
};
int qm__state_init(void) {
  struct qm_state_meta *m = qm__meta_alloc(sizeof *m);
  if (!m)
    return -1;
  qm_lock_reinit(&m->msg_lock); /* zeroed: a default mutex; made adaptive */
  qm__smeta = m;
  return 0;
}

#define owners (qm__smeta->owners)
#define msg_lock (qm__smeta->msg_lock)
#define msg_spare (qm__smeta->msg_spare)

/* Emptied batches. A thread with an id keeps the ones it empties in a
 * chain of its own and trades whole chains of up to SPARE_CHAIN with the
 * shared stack (msg_spare: chain heads linked by `chain`, each head's count
 * the chain's length), so msg_lock is taken once per SPARE_CHAIN batches:
 * taken per batch, a consumer's msg_new and its producer's msg_drop
 * contended on it for 25-40% of producer-consumer's time. A thread with no
 * id has no exit hook to return a chain at: it trades single batches. */
#define SPARE_CHAIN 16u
static __thread msgb_t *spare_local __attribute__((tls_model("initial-exec")));
static __thread unsigned spare_local_n __attribute__((tls_model("initial-exec")));

static __thread msgb_t *outbox __attribute__((tls_model("initial-exec")));
/* the inbox of this thread's id while it has one, else NULL (drain_due's
 * one load) */
__thread qm_inbox_t *qm__my_inbox __attribute__((tls_model("initial-exec")));
/* Frees re-entered from signal handlers (user pointer | generation << 48,
 * the chunk made SENT), applied as a marked call leaves or by take_due: a
 * ring the handler only appends to (slot, then tail) and the drain only
 * takes from (head), so neither loses the other's entries; a handler that
 * finds it full leaves its chunk SENT, never handed out again (counted). */
#define NESTED_CAP 16u
static __thread uintptr_t nested[NESTED_CAP] __attribute__((tls_model("initial-exec")));
__thread unsigned qm__nested_head __attribute__((tls_model("initial-exec")));
__thread unsigned qm__nested_tail __attribute__((tls_model("initial-exec")));
static _Atomic size_t nested_lost;

/* Pushes chain head..(n batches) onto the shared stack. */
static void spare_give(msgb_t *head, unsigned n) {
  head->count = n;
  qm_lock(&msg_lock);
  head->chain = msg_spare;
  msg_spare = head;
  qm_unlock(&msg_lock);
}

static msgb_t *msg_new(void) {
  msgb_t *b = spare_local;
  if (b) {
    spare_local = b->next;
    spare_local_n--;
    return b;
  }
  bool mine = my_id() != 0;
  qm_lock(&msg_lock);
  b = msg_spare;
  if (b) {
    msg_spare = b->chain;
    if (!mine && b->count > 1) { /* one batch; the rest of its chain stays */
      msgb_t *rest = b->next;
      rest->count = b->count - 1;
      rest->chain = msg_spare;
      msg_spare = rest;
    }
  }
  qm_unlock(&msg_lock);
  if (!b)
    return qm__meta_alloc(sizeof *b);
  if (mine) {
    spare_local = b->next;
    spare_local_n = b->count - 1;
  }
  return b;
}
static void msg_drop(msgb_t *b) {
  if (!my_id()) {
    b->next = NULL;
    spare_give(b, 1);
    return;
  }
  b->next = spare_local;
  spare_local = b;
  if (++spare_local_n == SPARE_CHAIN) {
    spare_give(spare_local, spare_local_n);
    spare_local = NULL;
    spare_local_n = 0;
  }
}

/* Message m, for a chunk of owner `owner`: the entry must still be the
 * ALLOC of the generation the sender saw. Returns the chunk's bin slot, or
 * reports. Called by the owner, or under the owner's lock while no thread
 * has the id. */
static uintptr_t settle(uintptr_t m, unsigned owner, unsigned *cls) {
  uintptr_t p = qm_slot_chunk(m), off = p - qm__pbase, roff, index;
  uintptr_t ch = chunk_of(p, off, cls, &roff, &index);
  uint64_t *e = qm_entry_at(*cls, index), w = qm_entry_load(e);
  if (qm_e_state(w) != QM_CHUNK_SENT || qm_e_owner(w) != owner || qm_e_gen(w) != qm_slot_gen(m) ||
      p != ch + qm_e_offset(w))
    qm__small_late_double_free(p, w);
  uint64_t fw = qm_e_freed(w);
  qm_entry_store(e, fw);
  /* the sender checked the canary; the owner clears it: a sender's store
   * there would race the owner's checks of its live neighbours, which
   * read an entry and then its canary (checked mode). There, checked
   * again first, as the rest of the chunk is checked zero: a write to it
   * while in flight is found too */
  uintptr_t at = p + qm_e_size(w);
  if (qm__cache_checked && qm__opt.zero_on_free &&
      QM_UNLIKELY(qm_load8(at) != qm_canary(ch, qm_e_gen(w), *cls)))
    qm__small_canary_error(p, at, qm_canary(ch, qm_e_gen(w), *cls), 0);
  qm_canary_clear(at);
  return qm_slot_make(ch, qm_e_gen(fw));
}

/* Starts fetching the entry of message m's chunk (for write: settle
 * changes it). m came through an inbox from a sender that checked it; a
 * prefetch of any address is harmless all the same. */
#define SETTLE_AHEAD 8u
QM_INLINE void prefetch_entry(uintptr_t m) {
  uintptr_t p = qm_slot_chunk(m), off = p - qm__pbase;
  unsigned c = (unsigned)(off >> qm__rshift);
  if (off < qm__pspan && c != QM_ZCLASS)
    __builtin_prefetch(qm_entry_at(c, qm_chunk_index(off & qm__rmask, c)), 1);
}

/* Frees of a closed id's chunks, by their sender: each message's entry
 * made FREE (under the id's lock, as its owner would), the message
 * replaced by the chunk's slot; then given to the central lists (the id
 * has no cache) outside that lock, a run of one class at a time: the class
 * lock (and the metadata lock it may take) is never taken under an id's. */
static void settle_closed(unsigned owner, msgb_t *b) {
  for (uint32_t i = 0; i < b->count; i++) {
    unsigned c;
    b->m[i] = settle(b->m[i], owner, &c);
  }
}
static void give_settled(msgb_t *b) {
  for (uint32_t i = 0, j; i < b->count; i = j) {
    unsigned c = (unsigned)((qm_slot_chunk(b->m[i]) - qm__pbase) >> qm__rshift);
    for (j = i + 1; j < b->count && (qm_slot_chunk(b->m[j]) - qm__pbase) >> qm__rshift == c; j++)
      ;
    if (qm__cache_checked && qm__opt.zero_on_free) /* zeroed by their senders */
      for (uint32_t k = i; k < j; k++)
        qm__small_check_sent(qm_slot_chunk(b->m[k]), c);
    if (qm__opt.free_delay) /* no ring ages them: the limbo does */
      for (uint32_t k = i; k < j; k++)
        qm__central_hold(c, qm__cache_group(), b->m[k], 0);
    else
      qm__central_give(c, qm__cache_group(), &b->m[i], j - i);
  }
  b->count = 0;
}
/* false if the id was adopted meanwhile: b is then sent to its inbox */
static bool apply_closed(unsigned owner, msgb_t *b) {
  owner_slot_t *o = &owners[owner];
  qm_lock(&o->lock);
  bool closed = atomic_load_explicit(&o->inbox, memory_order_relaxed) == CLOSED;
  if (closed)
    settle_closed(owner, b);
  qm_unlock(&o->lock);
  if (closed)
    give_settled(b);
  return closed;
}

static void send(msgb_t *b) {
  owner_slot_t *o = &owners[b->owner];
  msgb_t *head = atomic_load_explicit(&o->inbox, memory_order_relaxed);
  for (;;) {
    if (head == CLOSED) {
      if (apply_closed(b->owner, b)) {
        msg_drop(b);
        return;
      }
      head = atomic_load_explicit(&o->inbox, memory_order_relaxed);
      continue;
    }
    b->next = head;
    /* release: the owner's settle reads the entries after our reads */
    if (atomic_compare_exchange_weak_explicit(&o->inbox, &head, b, memory_order_release,
                                              memory_order_relaxed))
      return;
  }
}

static void rpend_flush(void);

void qm__state_flush_outbox(void) {
  rpend_flush();
  msgb_t *b = outbox;
  if (b && b->count) {
    outbox = NULL;
    send(b);
  }
}

/* A free of p (validated, entry w) that another thread owns: batched per
 * owner. A thread with no cache has no refill to flush its outbox at:
 * it sends at once. */
/* The bytes of chunks a batch holds before it is sent whatever its count:
 * a thread that frees a batch of large small chunks and then blocks (a
 * worker waiting for its next job) held up to 61 of them from their owner,
 * 2.8 MiB of 48 KiB chunks in a review's test. */
#define OUTBOX_BYTES ((size_t)64 << 10)
static __thread size_t outbox_bytes __attribute__((tls_model("initial-exec")));

static void send_free(uintptr_t p, uint64_t w) {
  unsigned owner = qm_e_owner(w);
  unsigned c = (unsigned)((p - qm__pbase) >> qm__rshift);
  if (qm__cache_checked && qm__opt.zero_on_free)
    qm__small_zero_sent(p - qm_e_offset(w), c, p + qm_e_size(w));
  msgb_t *b = outbox;
  if (b && (b->owner != owner || b->count == MSG_CAP)) {
    outbox = NULL;
    send(b);
    b = NULL;
  }
  if (!b) {
    if (!(b = msg_new()))
      qm__report_send_failed((void *)p);
    b->count = 0;
    b->owner = owner;
    outbox = b;
    outbox_bytes = 0;
  }
  b->m[b->count++] = qm_slot_make(p, qm_e_gen(w));
  if (!my_id() || (outbox_bytes += qm__class[c].size) >= OUTBOX_BYTES) {
    outbox = NULL;
    send(b);
  }
}

/* ---- frees of other threads' chunks, parked for their canary check ----
 * A free of a chunk another thread owns makes its entry SENT at once (so a
 * second free of it, on any thread, reports at once), starts fetching the
 * canary's line and parks the chunk here; the free RPEND_N frees later
 * checks the canary and only then sends the chunk to its owner, so the
 * chunk cannot be handed out again unchecked. The canary's line was last
 * written by the owner's malloc, on another core: waiting for it was over
 * half of a producer-consumer consumer's time. Only threads with an id
 * (whose exit hook flushes the ring); checked mode checks at once. */
#define RPEND_N 16u
typedef struct rpend {
  uintptr_t m;     /* user pointer | generation << 48 (0: empty) */
  uintptr_t at;    /* where its canary is */
  uint64_t expect; /* the canary */
  uint64_t owner;
} rpend_t;
static __thread rpend_t rpend[RPEND_N] __attribute__((tls_model("initial-exec")));
static __thread unsigned rpend_i __attribute__((tls_model("initial-exec")));

static void rpend_settle(const rpend_t *q) {
  if (QM_UNLIKELY(qm_load8(q->at) != q->expect))
    qm__small_canary_error(qm_slot_chunk(q->m), q->at, q->expect, 0);
  send_free(qm_slot_chunk(q->m), (uint64_t)q->owner << QM_E_OWNER_SHIFT | qm_slot_gen(q->m)
                                                                              << QM_E_GEN_SHIFT);
}

static void rpend_flush(void) {
  for (unsigned i = 0; i < RPEND_N; i++) {
    rpend_t q = rpend[i];
    if (!q.m)
      continue;
    rpend[i].m = 0;
    rpend_settle(&q);
  }
}

/* ---- what other threads sent this one, back in its bins ---- */

/* Settles the frees other threads sent this one (id me) into its bins. */
QM_INLINE void drain_inbox(unsigned me) {
  if (me && atomic_load_explicit(&owners[me].inbox, memory_order_relaxed)) {
    msgb_t *b = atomic_exchange_explicit(&owners[me].inbox, NULL, memory_order_acquire);
    while (b && b != CLOSED) {
      msgb_t *next = b->next;
      /* the entries were last written by the senders, on other cores:
       * fetched SETTLE_AHEAD messages ahead, so their misses overlap */
      for (uint32_t i = 0; i < b->count && i < SETTLE_AHEAD; i++)
        prefetch_entry(b->m[i]);
      for (uint32_t i = 0; i < b->count; i++) {
        unsigned c;
        if (i + SETTLE_AHEAD < b->count)
          prefetch_entry(b->m[i + SETTLE_AHEAD]);
        uintptr_t s = settle(b->m[i], me, &c);
        qm__small_release_sent(s, c);
      }
      msg_drop(b);
      b = next;
    }
  }
}

/* The inbox, then the frees handlers deferred (one landing meanwhile too);
 * not the parked frees: take_due calls this inside the parked batch. */
void qm__state_drain_due(void) {
  unsigned me = my_id();
  drain_inbox(me);
  while (qm__nested_head != qm__nested_tail) {
    uintptr_t m = nested[qm__nested_head % NESTED_CAP];
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    qm__nested_head++;
    uintptr_t p = qm_slot_chunk(m), off = p - qm__pbase, roff, index;
    unsigned c;
    if (off >= qm__pspan || (off >> qm__rshift) == QM_ZCLASS) {
      /* not a small chunk: applied as the free it is, marked with its
       * address (a handler's free of it reports); the mark is left without
       * applying (this loop does; a drain would flush the parked frees) */
      uintptr_t was = qm__freeing;
      qm_freeing_set(p);
      if (off < qm__pspan)
        qm__zero_free((void *)p, QM_OP_FREE);
      else
        qm__small_up.free_other((void *)p);
      qm_freeing_restore(was);
      continue;
    }
    chunk_of(p, off, &c, &roff, &index);
    uint64_t w = qm_entry_load(qm_entry_at(c, index));
    unsigned owner = qm_e_owner(w);
    if (owner && owner != me) { /* another thread's: it settles the SENT entry */
      if (qm_e_state(w) != QM_CHUNK_SENT || qm_e_gen(w) != qm_slot_gen(m))
        qm__small_late_double_free(p, w);
      /* still zero since the handler's free, but for the canary (which
       * its owner checks); send_free zeroes it again, for nothing */
      if (qm__cache_checked && qm__opt.zero_on_free)
        qm__small_check_sent_but(p - qm_e_offset(w), c, p + qm_e_size(w));
      send_free(p, w);
    } else {
      uintptr_t s = settle(m, owner, &c);
      qm__small_release_sent(s, c); /* zeroed by the handler's free */
    }
  }
}

void qm__state_drain(void) {
  qm__small_pend_flush();
  qm__state_drain_due();
}

#ifdef QM_TEST_HOOKS
size_t qm__state_inbox_waiting(unsigned id) {
  size_t n = 0;
  for (msgb_t *b = atomic_load(&owners[id].inbox); b && b != CLOSED; b = b->next)
    n += b->count;
  return n;
}
#endif

uintptr_t qm__small_take_slow(unsigned c) {
  /* frees other threads sent this one come back to its bins first */
  qm__state_drain();
  return qm__cache_take_slow(c);
}

/* ---- frees re-entered from a signal handler ---- */

void qm__free_nested(void *p) {
  uintptr_t a = (uintptr_t)p, off = a - qm__pbase;
  if (!p)
    return;
  /* a realloc's mark first: p | QM_REALLOCING is also the address p + 2,
   * an interior pointer, which must report as one */
  uintptr_t f = qm__freeing;
  if (f & QM_REALLOCING) {
    if (a == (f & ~QM_REALLOCING))
      qm__report_refree(p, 0, QM_REFREE_HANDLER_REALLOC);
  } else if (a == f) {
    qm__report_refree(p, 0, QM_REFREE_HANDLER);
  }
  /* a small chunk is checked now, lock-free; anything else (zero-size,
   * large, guarded) takes locks the interrupted free may hold: checked
   * when applied */
  uintptr_t m = a;
  if (off < qm__pspan && (off >> qm__rshift) != QM_ZCLASS) {
    unsigned c;
    uint64_t *e, w;
    uintptr_t ch = qm__small_check(QM_OP_FREE, p, off, &c, &e, &w);
    /* SENT at once: a later free of p finds it and reports; a plain store
     * by the interrupted code over it is found at the refill, which expects
     * this very SENT entry of this generation */
    while (!__atomic_compare_exchange_n(e, &w, qm_e_sent(w), false, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED))
      ch = qm__small_check(QM_OP_FREE, p, off, &c, &e, &w); /* another free won: reports */
    /* zeroed now, as any other thread's free (send_free), and checked zero
     * when applied: zeroed only then, a write meanwhile was wiped */
    if (qm__cache_checked && qm__opt.zero_on_free)
      qm__small_zero_sent(ch, c, a + qm_e_size(w));
    m = qm_slot_make(a, qm_e_gen(w));
  }
  unsigned t = qm__nested_tail;
  if (t - qm__nested_head < NESTED_CAP) {
    nested[t % NESTED_CAP] = m;
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    qm__nested_tail = t + 1;
  } else {
    atomic_fetch_add_explicit(&nested_lost, 1, memory_order_relaxed);
  }
}

/* ---- an id's life: adopted, retired, orphaned, across fork ---- */

void qm__state_adopt(unsigned id) {
  owner_slot_t *o = &owners[id];
  qm_lock(&o->lock);
  /* frees sent while nobody had the id were applied by their senders */
  atomic_store_explicit(&o->inbox, NULL, memory_order_relaxed);
  qm_unlock(&o->lock);
  qm__me = (uint64_t)QM_CHUNK_ALLOC << QM_E_STATE_SHIFT | (uint64_t)id << QM_E_OWNER_SHIFT;
  qm__my_inbox = &o->inbox;
}

/* Closes id's inbox and applies what was in it, as a sender would (under
 * the id's lock; in a fork child, whose only thread this is, without). */
static void close_inbox(unsigned id, bool locked) {
  owner_slot_t *o = &owners[id];
  msgb_t *b = atomic_exchange_explicit(&o->inbox, CLOSED, memory_order_acquire);
  while (b && b != CLOSED) {
    msgb_t *next = b->next;
    if (locked)
      apply_closed(id, b);
    else {
      settle_closed(id, b);
      give_settled(b);
    }
    msg_drop(b);
    b = next;
  }
}

void qm__state_retire(unsigned id) {
  qm__me = QM_E_NOBODY; /* later frees here go through the closed path */
  qm__my_inbox = NULL;
  close_inbox(id, true);
  if (spare_local) /* the thread's emptied batches, for the others */
    spare_give(spare_local, spare_local_n);
  spare_local = NULL;
  spare_local_n = 0;
}

void qm__state_orphan(unsigned id) {
  qm_lock_reinit(&owners[id].lock);
  close_inbox(id, false);
}

void qm__state_fork_settle(void) {
  uintptr_t was = qm_busy_enter();
  qm__state_flush_outbox();
  drain_inbox(my_id());
  qm_busy_leave(was);
}

/* (no steering state: small chunks are not in use) */
qm_lock_t *qm__state_owner_lock(unsigned id) { return &owners[id].lock; }

static unsigned fork_ids; /* the owner locks fork holds: 1..fork_ids-1 */
void qm__state_fork_prepare(unsigned ids) {
  if (!qm__smeta)
    return;
  qm_fork_lock(&msg_lock);
  fork_ids = ids < QM_MAX_OWNERS ? ids : QM_MAX_OWNERS;
  for (unsigned id = 1; id < fork_ids; id++)
    qm_fork_lock(&owners[id].lock);
}
void qm__state_fork_parent(void) {
  if (!qm__smeta)
    return;
  for (unsigned id = fork_ids; id-- > 1;)
    qm_unlock(&owners[id].lock);
  qm_unlock(&msg_lock);
}
/* Every id's lock afresh, not only this thread's and the registered
 * ones': a closed id's lock held across fork stayed held in the child,
 * whose first free sent to that id then waited for it forever. */
void qm__state_fork_child(void) {
  if (!qm__smeta)
    return;
  qm_lock_reinit(&msg_lock);
  for (unsigned id = 1; id < fork_ids; id++)
    qm_lock_reinit(&owners[id].lock);
}

/* ---- free past the fast path, but checked mode's own ---- */

/* A chunk this thread just made FREE (entry w before, fw after; a its
 * user pointer): its checked canary cleared, into the cache. It may be
 * another thread's from here on (as from send_free): no longer named by
 * the mark; a handler's second free finds its entry FREE. */
static void release_freed(uintptr_t a, uintptr_t ch, unsigned c, uint64_t w, uint64_t fw) {
  qm_canary_clear(a + qm_e_size(w));
  qm_mark_released(a);
  qm__small_release(qm_slot_make(ch, qm_e_gen(fw)), c);
}

static __thread bool no_free_id __attribute__((tls_model("initial-exec")));

/* Everything but checked mode's own frees, for qm__small_free_slow (kept
 * apart: its registers would be saved on that path too). */
void qm__small_free_general(void *p, uintptr_t off) {
  if ((off >> qm__rshift) == QM_ZCLASS) {
    qm__zero_free(p, QM_OP_FREE);
    free_leave();
    return;
  }
  uintptr_t a = (uintptr_t)p, roff, index;
  unsigned c;
  uint64_t *e, w;
  uintptr_t ch = chunk_of(a, off, &c, &roff, &index);
  if (QM_UNLIKELY(c == QM_ZCLASS || roff >= qm_committed(c) ||
                  qm_slot_dead(ch - qm_region(c), qm__class[c].size)))
    qm__small_error(QM_OP_FREE, p, ch, c, roff, index);
  e = qm_entry_at(c, index);
  w = qm_entry_load(e);
  unsigned owner = qm_e_owner(w), me = my_id();
  /* a thread that frees what others allocate and has not malloc'd yet:
   * its cache and id now, so it batches its frees (else each took
   * msg_lock and went alone), the id of this chunk's owner if that thread
   * has exited (a successor then frees its predecessor's chunks as its
   * own). In checked mode too, but an id no chunk carries: no thread
   * inherits one there (no bins are kept for it), and one that took an
   * exited thread's would be sent what others free of its chunks, held for
   * as long as it blocks (4 MiB in a review's test). Without an id there,
   * xmalloc-test's freeing threads sent every free alone, msg_lock and a
   * swap on the owner's inbox each: a third of its time under
   * hardening=max. Where no such id is left, they still do (not asked
   * again: each asking takes the registry's lock). Only for a live owner's
   * chunk: a successor freeing what an exited thread left (larson) applies
   * those under the closed id's lock anyway, and took a fresh id, and a
   * fresh registration, at each thread's start (peak RSS 1.33 -> 2.38x
   * jemalloc's under max). */
  if (owner && owner != me && !me && !no_free_id &&
      (!qm__cache_checked ||
       atomic_load_explicit(&owners[owner].inbox, memory_order_relaxed) != CLOSED)) {
    if (qm__cache_ensure(qm__cache_checked ? QM_WANT_UNOWNED : owner))
      me = my_id();
    else
      no_free_id = qm__cache_checked;
  }
  if (owner && owner != me && me && !qm__cache_checked) {
    /* another thread's chunk: SENT at once, its canary checked RPEND_N
     * frees from now (see rpend). The owner may be changing the entry with
     * plain stores: if it freed the chunk meanwhile, this swap fails and
     * reports, or its store overwrites SENT and the owner reports when the
     * chunk reaches it. */
    for (;;) {
      if (QM_UNLIKELY(qm_e_state(w) != QM_CHUNK_ALLOC || a != ch + qm_e_offset(w)))
        qm__small_error(QM_OP_FREE, p, ch, c, roff, index);
      if (__atomic_compare_exchange_n(e, &w, qm_e_sent(w), false, __ATOMIC_RELAXED,
                                      __ATOMIC_RELAXED))
        break;
    }
    owner = qm_e_owner(w);
    if (QM_LIKELY(owner != my_id())) {
      uintptr_t at = a + qm_e_size(w);
      __builtin_prefetch((void *)at);
      rpend_t *q = &rpend[rpend_i++ % RPEND_N], old = *q;
      *q = (rpend_t){qm_slot_make(a, qm_e_gen(w)), at, qm_canary(ch, qm_e_gen(w), c), owner};
      if (old.m)
        rpend_settle(&old);
      if (QM_UNLIKELY(!(rpend_i % RPEND_N)))
        take_due();
      qm_freeing_clear();
      return;
    }
    /* it became this thread's meanwhile (an id retired and adopted): SENT
     * by this thread, checked and freed now */
    if (QM_UNLIKELY(qm_load8(a + qm_e_size(w)) != qm_canary(ch, qm_e_gen(w), c)))
      qm__small_canary_error(a, a + qm_e_size(w), qm_canary(ch, qm_e_gen(w), c), 0);
    uint64_t fw = qm_e_freed(w);
    qm_entry_store(e, fw);
    release_freed(a, ch, c, w, fw);
    free_leave();
    return;
  }
  ch = qm__small_check(QM_OP_FREE, p, off, &c, &e, &w);
  owner = qm_e_owner(w);
  /* each way below clears the checked canary once the entry has changed
   * and before the chunk can be anyone's again; one sent to its owner is
   * cleared by the owner (settle) */
  if (owner && owner == me) {
    uint64_t fw = qm_e_freed(w);
    qm_entry_store(e, fw);
    release_freed(a, ch, c, w, fw);
  } else if (!owner) {
    uint64_t fw;
    while (!__atomic_compare_exchange_n(e, &w, fw = qm_e_freed(w), false, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED))
      ch = qm__small_check(QM_OP_FREE, p, off, &c, &e, &w); /* another free won: reports */
    release_freed(a, ch, c, w, fw);
  } else {
    /* checked mode, or a thread with no id: checked at once */
    while (!__atomic_compare_exchange_n(e, &w, qm_e_sent(w), false, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED))
      qm__small_check(QM_OP_FREE, p, off, &c, &e, &w);
    if (qm_e_owner(w) == me && me) { /* it became this thread's meanwhile */
      uint64_t fw = qm_e_freed(w);
      qm_entry_store(e, fw);
      release_freed(a, ch, c, w, fw);
    } else {
      qm_mark_released(a);
      send_free(a, w);
    }
  }
  free_leave();
}

/* ---- at exit, the main thread's (it has no exit hook) ---- */

/* When the program ends, the main thread's parked remote frees (an
 * overflow past a chunk it freed among its last RPEND_N such frees is still
 * reported) and what other threads sent it (a free sent to it that finds
 * its chunk freed meanwhile by the main thread itself, the two frees
 * racing, is reported before the process is gone, not never). */
__attribute__((destructor)) static void main_at_exit(void) {
  uintptr_t was = qm_busy_enter();
  rpend_flush();
  qm__state_drain();
  qm_busy_leave(was);
}

/* ---- the slow paths that apply what was sent first ---- */

void *qm__small_malloc_checked(size_t n) {
  if (QM_UNLIKELY(drain_due()))
    qm__state_drain();
  void *p = NULL;
  /* as small_alloc_plain: a larger class when this one's region is full */
  for (unsigned c = qm_class_of(n); c < QM_NCLASS; c++) {
    uintptr_t s = qm_cache_take_checked(c);
    if (QM_LIKELY(s)) {
      p = qm__small_hand_out(s, c, n, QM_MIN_ALIGN);
      break;
    }
  }
  if (!p)
    errno = ENOMEM;
  return p;
}
