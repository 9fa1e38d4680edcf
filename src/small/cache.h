/* cache.h: per-thread caches of small chunks (cache.c; made, registered
 * and retired by the thread life cycle, life.c). A thread's bins live in its
 * own TLS (initial-exec: one fs-relative access, no pointer to chase) and
 * start with no room at all, so its first malloc and first free take the
 * slow path, which gives the bins their slot arrays. Only the owning thread
 * touches its bins' counts: no lock, no atomic.
 */
#ifndef QM_CACHE_H
#define QM_CACHE_H

#include <stdint.h>

#include "age.h"
#include "options.h"
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
/* The widest vectors the CPU (and the kernel) run: 2 for AVX-512F, 1 for
 * AVX2, 0 for neither. Checked mode's zero check (and, with AVX-512, its
 * zeroing) takes 64 or 32 bytes a step with them. Set by init, before any
 * allocation. */
extern QM_HIDDEN uint8_t qm__vec;
/* Delayed frees that went back into use before their D mallocs (stats,
 * tests): a ring or the limbo was full (early), or all rings or the limbo
 * held free_delay_kb (over). */
size_t qm__cache_delay_early(void);
size_t qm__cache_delay_over_count(void);

/* The slow paths: take one chunk of class c (refilling the cache), or give
 * one back (draining it). take returns 0 when the class is exhausted. In
 * checked mode the caller has zeroed (zero_on_free) and checked the chunk
 * given. */
uintptr_t qm__cache_take_slow(unsigned c);
void qm__cache_give_slow(uintptr_t chunk, unsigned c);
/* Checked mode's state of one class of the calling thread (cache.c owns
 * it), all of it behind one thread-pointer offset: the bin (its count over
 * the bin's slot array, the slot the next take hands out) and the
 * delayed-free ring (free_delay = D > 0): a chunk freed waits in an aging
 * queue of its class (age.h), stamped with the thread's count of mallocs of
 * the class, and enters the bin (where malloc can have it) only once that
 * count has grown by more than D. A ring holds up to 2D chunks and at most
 * 16 MiB: a thread that frees more within D mallocs pushes its oldest out
 * early (counted). What a ring holds when its thread exits waits out the
 * rest of its time in the central limbo (qm__central_hold). */
typedef struct qm_checked {
  uintptr_t *slot; /* the bin's slot array; NULL while the thread has no live cache */
  qm_aged_t *ring; /* the class's delayed frees (free_delay > 0): cap entries */
  uint32_t count;  /* chunks in the bin */
  uint32_t next;   /* the slot the next take hands out, drawn (and its
                    * chunk prefetched) at the take before */
  uint32_t clock;  /* the thread's mallocs of the class: the ring's stamps */
  qm_age_t q;      /* the ring's oldest entry and entries */
  uint32_t cap;    /* the ring's capacity, set with the cache (a division
                    * per ring step was 2% of hardening=max's small churn) */
} qm_checked_t;
extern __thread qm_checked_t qm__cc[QM_NCLASS] __attribute__((tls_model("initial-exec")));
/* Bytes of the chunks in all of this thread's rings. A ring's 2D entries
 * bound one class; this bounds them together, at free_delay_kb: a thread
 * that frees a large class faster than it mallocs it held 16 MiB of each
 * such class (mstress under hardening=max: 122 MB peak RSS, jemalloc 14). */
extern __thread size_t qm__delay_bytes __attribute__((tls_model("initial-exec")));
/* Over free_delay_kb: the ring that holds the most gives its oldest
 * chunks to the bin early (counted) until back under it, and is kept in
 * qm__delay_big for the frees past it that follow. */
void qm__cache_delay_over(void);
extern QM_HIDDEN __thread unsigned qm__delay_big __attribute__((tls_model("initial-exec")));
/* The same bytes by class, padded to whole vectors of 8 (the padding
 * stays 0): the scan finds the ring that holds the most in a few vector
 * steps. From each ring's count and class size, as it was, the scan was
 * 10 instructions a class, and ran at one free in four of small churn
 * under hardening=max (150 instructions an op). */
#define QM_DELAY_CB_N ((QM_NCLASS + 7) / 8 * 8)
extern QM_HIDDEN __thread uint32_t qm__delay_cb[QM_DELAY_CB_N]
    __attribute__((tls_model("initial-exec")));
QM_INLINE void qm_delay_sub(unsigned c) {
  size_t size = qm__class[c].size;
  qm__delay_bytes -= size;
  qm__delay_cb[c] -= (uint32_t)size;
}

/* Checked mode's rare cases, out of line: the bin full (half of it to the
 * central list, then chunk in), empty (refilled from the central list,
 * then drawn from; 0 when the class is exhausted), the ring full (its
 * oldest into the bin early, counted). */
void qm__cache_put_full(unsigned c, uintptr_t chunk);
uintptr_t qm__cache_refill_checked(unsigned c);
void qm__cache_ring_full(unsigned c);

QM_INLINE void qm_checked_put(qm_checked_t *k, unsigned c, uintptr_t chunk) {
  if (QM_UNLIKELY(k->count == qm__class[c].cache_max)) {
    qm__cache_put_full(c, chunk);
    return;
  }
  k->slot[k->count++] = chunk;
}

/* One chunk left early for free_delay_kb: counted in the thread and added
 * to the shared count when the count reaches qm__delay_over_due (1 at the
 * thread's first, so stats never say none left early when some did; then
 * 1024: an atomic add at every such free, in every thread, would contend
 * on one line) and at its exit; qm__cache_delay_over_count adds the
 * calling thread's rest. */
extern QM_HIDDEN __thread uint32_t qm__delay_over_n __attribute__((tls_model("initial-exec")));
extern QM_HIDDEN __thread uint32_t qm__delay_over_due __attribute__((tls_model("initial-exec")));
void qm__cache_delay_over_publish(void);

/* size bytes more in the thread's rings (before the push: what leaves
 * early for the budget is older, never the chunk being delayed). Over
 * free_delay_kb, the common way past it: the ring that held the most at
 * the last scan gives its oldest, if it holds any at least size bytes,
 * which brings the bytes back under; else the scan (qm__cache_delay_over) */
QM_INLINE void qm_delay_add(unsigned c, size_t size) {
  qm__delay_cb[c] += (uint32_t)size;
  if (QM_LIKELY((qm__delay_bytes += size) <= (size_t)qm__opt.free_delay_kb << 10))
    return;
  unsigned b = qm__delay_big;
  qm_checked_t *kb = &qm__cc[b];
  size_t bsize = qm__class[b].size;
  if (QM_LIKELY(kb->q.n && bsize >= size)) {
    qm_checked_put(kb, b, kb->ring[qm_age_pop(&kb->q, kb->cap)].item);
    qm_delay_sub(b);
    if (QM_UNLIKELY(++qm__delay_over_n >= qm__delay_over_due))
      qm__cache_delay_over_publish();
  } else {
    qm__cache_delay_over();
  }
}

/* Starts fetching the lines of [p, p + span) (up to 1024 bytes: past that
 * the hardware prefetcher keeps up with the scan that follows), for reading
 * or, with QM_PF_W, for writing: two lines a step (one past the span is
 * harmless). A jump into straight-line code instead took fewer
 * instructions (small churn under hardening=max: 22.0M against 24.1M) and
 * ran 10-20% slower (interleaved, ops a CPU second: 5.11M against 5.57M at
 * load 5, 3.74M against 4.59M at load 7): its indirect jump, whose target
 * changes with every chunk. */
#define QM_PF_R 0
#define QM_PF_W 1
#define QM_PREFETCH_SPAN(p, span, rw)                                                              \
  do {                                                                                             \
    size_t qm_pf_s = (span) < 1024 ? (span) : 1024;                                                \
    for (size_t qm_pf_at = 0; qm_pf_at < qm_pf_s; qm_pf_at += 128) {                               \
      __builtin_prefetch((const void *)((p) + qm_pf_at), rw);                                      \
      __builtin_prefetch((const void *)((p) + qm_pf_at + 64), rw);                                 \
    }                                                                                              \
  } while (0)

/* Checked mode's draw from a bin that is not empty: the slot drawn at the
 * last take of this class (or a fresh draw if the bin shrank past it), and
 * the draw for the next one, whose chunk starts coming into the cache now.
 * In checked mode every chunk handed out is read whole (its header, and
 * every byte for zero_on_free) after waiting out free_delay, so it is
 * cold: in small churn under hardening=max those reads were 40% of the
 * time. The next malloc of the class comes a few dozen ops later, time
 * enough for the lines to arrive, too soon for them to leave. Its table
 * entry too, which the hand-out reads and writes: last touched at the
 * chunk's free, hundreds of frees ago, its line was the one miss left on
 * checked mode's malloc path. */
QM_INLINE uintptr_t qm_checked_draw(qm_checked_t *k, unsigned c) {
  uint32_t n = k->count;
  uint32_t i = k->next < n ? k->next : qm_rand_below(n);
  uintptr_t ch = k->slot[i];
  k->slot[i] = k->slot[--n];
  k->count = n;
  if (n) {
    uint32_t j = qm_rand_below(n);
    k->next = j;
    uintptr_t next = k->slot[j] & QM_ADDR_MASK; /* its chunk */
    QM_PREFETCH_SPAN(next, qm__opt.zero_on_free ? qm__class[c].size : 64, QM_PF_R);
    __builtin_prefetch(qm__class[c].table + qm_chunk_index(next - qm_region(c), c), QM_PF_W);
  }
  return ch;
}

/* Checked mode's take of a chunk of class c (0 when the class is
 * exhausted): the ring ticks, its chunks older than D mallocs go to the
 * bin, one is drawn. The caller drained what other threads sent
 * (qm__state_drain) first. */
QM_INLINE uintptr_t qm_cache_take_checked(unsigned c) {
  qm_checked_t *k = &qm__cc[c];
  if (QM_UNLIKELY(!k->slot))
    return qm__cache_take_slow(c);
  uint32_t d = (uint32_t)qm__opt.free_delay;
  if (d) {
    uint32_t now = ++k->clock;
    while (qm_age_due(&k->q, k->ring, now, d)) {
      qm_checked_put(k, c, k->ring[qm_age_pop(&k->q, k->cap)].item);
      qm_delay_sub(c);
    }
    /* the ring's line after the oldest entry's (4 entries a line), read
     * a few mallocs of the class from now: written at the frees D mallocs
     * ago, it has left the cache since (past the ring's end: a prefetch
     * of nothing) */
    __builtin_prefetch(&k->ring[k->q.head] + 4);
  }
  if (QM_UNLIKELY(!k->count))
    return qm__cache_refill_checked(c);
  return qm_checked_draw(k, c);
}

/* Checked mode's give of a chunk (of class c, size bytes: the caller has
 * the size at hand) the caller zeroed and checked: into the ring (or the
 * bin when free_delay is 0). */
QM_INLINE void qm_cache_give_checked(uintptr_t chunk, unsigned c, size_t size) {
  qm_checked_t *k = &qm__cc[c];
  if (QM_UNLIKELY(!k->slot)) {
    qm__cache_give_slow(chunk, c);
    return;
  }
  if (!qm__opt.free_delay) {
    qm_checked_put(k, c, chunk);
    return;
  }
  if (QM_UNLIKELY(qm_age_full(&k->q, k->cap)))
    qm__cache_ring_full(c);
  qm_delay_add(c, size); /* before the push */
  k->ring[qm_age_push(&k->q, k->cap)] = (qm_aged_t){chunk, k->clock};
}

/* Gives the calling thread its cache (and owner id) if it has none yet and
 * may have one, taking id `want` if an exited thread left it (0: any);
 * whether it has one now. A thread whose first act is to free what an
 * exited thread allocated (a successor in a hand-off) so inherits that
 * thread's id: the chunks are its own, freed on the fast path, instead of
 * each sent to whichever thread took the id. want QM_WANT_UNOWNED: an id
 * no chunk carries (an exited thread's that never took chunks for its
 * bins, or one never given out), or none. The cache is made above
 * (qm__small_up.cache_create, life.c). */
#define QM_WANT_UNOWNED (~0u)
bool qm__cache_ensure(unsigned want);
/* Whether the thread has handed out a chunk under its id: set at checked
 * mode's hand-outs (hand_out_checked, qm__small_hand_out), not at refills
 * (a checked thread's bins also fill from its frees of chunks no thread
 * owns). The default profile's fast path leaves it: only checked mode asks
 * (QM_WANT_UNOWNED). */
extern QM_HIDDEN __thread bool qm__took __attribute__((tls_model("initial-exec")));

/* For the thread life cycle (life.c): the thread's bins over slot storage
 * s (every class's cache_max slots in turn) and its delay rings r; the
 * cache live (after the thread's id is adopted); its group of the central
 * lists; whether it is live. */
void qm__cache_attach(uintptr_t *s, qm_aged_t *r);
void qm__cache_go_live(void);
void qm__cache_set_group(unsigned g);
bool qm__cache_live(void);
/* Its bins into the central lists; its rings into the limbo (free_delay);
 * the cache gone for good (thread exit: every later call takes the slow
 * path, on the central lists; the bins still count what they hold, for
 * the save that follows at exit). */
void qm__cache_flush_bins(void);
/* Bins kept with an exited thread's registration (life.c), for the thread
 * that succeeds it: after qm__cache_detach (so that a signal handler's
 * malloc meanwhile cannot refill them), their counts into held, returning
 * their bytes (the bins left empty, their chunks where they are in the slot
 * arrays); a new thread's bins over those arrays given the counts back
 * (after qm__cache_attach); or the chunks of slot storage s under counts
 * held given to group g's central lists instead (the exited thread's: a
 * table line's chunks stay in one group). The last two leave held all
 * zero. */
size_t qm__cache_save_bins(uint32_t held[QM_NCLASS]);
void qm__cache_restore_bins(uint32_t held[QM_NCLASS]);
void qm__cache_give_saved(uintptr_t *s, uint32_t held[QM_NCLASS], unsigned g);
void qm__cache_ring_flush(void);
void qm__cache_detach(void);
/* A fork child's: the bins in a fresh order, each chunk in them and in
 * the rings renamed by regen (a fresh generation). */
void qm__cache_reshuffle(qm_regen_fn regen);
/* The calling thread's group of the central lists. */
unsigned qm__cache_group(void);

#endif
