/* cache.c: refill and drain of a thread's cache: its bins (in its TLS, over
 * slot arrays the thread life cycle gives it, life.c) and checked mode's
 * delayed-free rings, between the thread and the central lists. Only the
 * owning thread touches them. A thread without a cache (EMPTY: made on its
 * first need, through qm__small_up; MAKING: being made, when a signal
 * handler's call lands in the making; DEAD: its thread is exiting) works on
 * the central lists directly, so allocations in late TLS destructors work.
 */
#include "cache.h"

#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "options.h"
#include "up.h"

enum { TC_EMPTY, TC_MAKING, TC_LIVE, TC_DEAD };

/* Delayed free (free_delay = D > 0, checked mode): a chunk freed by a thread
 * waits in a per-class aging queue (age.h) of that thread, stamped with the
 * thread's count of mallocs of its class, and enters the bin (where malloc
 * can have it) only once that count has grown by more than D. A ring holds up to 2D
 * chunks and at most QM_DELAY_BYTES: a thread that frees more than that within
 * D mallocs pushes its oldest out early (counted); all its rings together
 * hold at most free_delay_kb (qm__delay_bytes; 1 MiB by default: with 2,
 * mstress under hardening=max peaked at 2.0-2.3x jemalloc's RSS, 1.8x with
 * 1, against 1.5x without the delay). What is left of a ring
 * when its thread exits, and what is freed where no ring can age it (a
 * thread without a cache, a closed id's frees), waits out the rest of its D
 * mallocs in the central limbo (qm__central_hold): adopted into the ring of
 * the next thread that refills the class, or aged by the mallocs of
 * threads without a cache. */
static __thread qm_aged_t *rings __attribute__((tls_model("initial-exec")));
__thread size_t qm__delay_bytes __attribute__((tls_model("initial-exec")));
__thread uint32_t qm__delay_cb[QM_DELAY_CB_N] __attribute__((tls_model("initial-exec")));
static _Atomic size_t delay_early; /* left a full ring early */
static _Atomic size_t delay_over;  /* left early for free_delay_kb */
__thread uint32_t qm__delay_over_n __attribute__((tls_model("initial-exec")));
__thread unsigned qm__delay_big __attribute__((tls_model("initial-exec")));
__thread uint32_t qm__delay_over_due __attribute__((tls_model("initial-exec"))) = 1;

__thread qm_checked_t qm__cc[QM_NCLASS] __attribute__((tls_model("initial-exec")));
/* This thread's group of the central lists: 0 until it has a cache, then
 * the group with the fewest live caches, kept after the thread's cache is
 * gone (its later frees go to the central lists) */
static __thread unsigned group __attribute__((tls_model("initial-exec")));
static __thread int state __attribute__((tls_model("initial-exec")));

static uint32_t ring_cap_calc(unsigned c) {
  size_t cap = 2 * (size_t)qm__opt.free_delay, fit = QM_DELAY_BYTES / qm__class[c].size;
  return (uint32_t)(cap < fit ? cap : fit ? fit : 1);
}

/* The count this thread's bin of class c is kept under. */
static uint32_t *count_of(unsigned c) {
  return qm__cache_checked ? &qm__cc[c].count : &qm__bin[c].count;
}

/* Puts chunk into this thread's bin of class c, first handing half the bin
 * to the central list if it is full: at a random place, or in checked mode
 * on top (there the take draws its slot at random instead). */
static void bin_put(unsigned c, uintptr_t chunk) {
  uintptr_t *slot = qm__bin_slot[c];
  uint32_t *n = count_of(c), max = qm__class[c].cache_max;
  if (*n == max) {
    unsigned half = max / 2;
    qm__central_give(c, group, slot + *n - half, half);
    *n -= half;
  }
  if (qm__cache_checked)
    slot[(*n)++] = chunk;
  else
    *n = qm_bin_insert(slot, *n, chunk);
}

/* Checked mode's take (qm_checked_draw) on the slow path. */
static uintptr_t take_checked(unsigned c) { return qm_checked_draw(&qm__cc[c], c); }

/* The ring's oldest chunk into the bin. */
static void ring_pop(unsigned c) {
  qm_checked_t *k = &qm__cc[c];
  bin_put(c, k->ring[qm_age_pop(&k->q, k->cap)].item);
  qm_delay_sub(c);
}

static void ring_push(unsigned c, uintptr_t chunk) {
  qm_checked_t *k = &qm__cc[c];
  if (qm_age_full(&k->q, k->cap))
    qm__cache_ring_full(c);
  qm_delay_add(c, qm__class[c].size); /* before the push, as qm_cache_give_checked */
  k->ring[qm_age_push(&k->q, k->cap)] = (qm_aged_t){chunk, k->clock};
}

/* A malloc of class c: chunks freed more than free_delay mallocs ago may
 * serve it now. */
static void ring_tick(unsigned c) {
  qm_checked_t *k = &qm__cc[c];
  uint32_t now = ++k->clock;
  while (qm_age_due(&k->q, k->ring, now, (uint32_t)qm__opt.free_delay))
    ring_pop(c);
}

/* At a refill: chunks of the class's limbo (an exited thread's, a closed
 * id's) join this thread's ring with the age they have, as many as it has
 * room for, and wait out the rest of their D mallocs on this thread's
 * clock. */
static void adopt(unsigned c) {
  qm_checked_t *k = &qm__cc[c];
  uintptr_t items[64];
  uint32_t ages[64];
  size_t budget = (size_t)qm__opt.free_delay_kb << 10, size = qm__class[c].size;
  size_t fit = qm__delay_bytes < budget ? (budget - qm__delay_bytes) / size : 0;
  unsigned room = k->cap - k->q.n;
  room = room < fit ? room : (unsigned)fit;
  unsigned n = qm__central_adopt(c, items, ages, room < 64 ? room : 64);
  for (unsigned i = 0; i < n; i++)
    k->ring[qm_age_push(&k->q, k->cap)] = (qm_aged_t){items[i], k->clock - ages[i]};
  qm__delay_bytes += n * size;
  qm__delay_cb[c] += (uint32_t)(n * size);
}

/* At exit: each ring's chunks wait out the rest of their D mallocs in the
 * limbo, not in the central lists, where the next thread's refill would
 * have them at once. */
void qm__cache_ring_flush(void) {
  for (unsigned c = 0; c < QM_NCLASS; c++) {
    qm_checked_t *k = &qm__cc[c];
    while (k->q.n) {
      qm_aged_t e = k->ring[qm_age_pop(&k->q, k->cap)];
      qm__central_hold(c, group, e.item, k->clock - e.at);
    }
  }
  qm__delay_bytes = 0;
  memset(qm__delay_cb, 0, sizeof qm__delay_cb);
  qm__cache_delay_over_publish();
}

/* The class whose ring holds the most bytes (the first of equals), and
 * those bytes in *most (0: every ring is empty). */
#if defined(__x86_64__)
__attribute__((target("avx2"))) static unsigned delay_most_avx2(size_t *most) {
  const __m256i *v = (const __m256i *)qm__delay_cb;
  __m256i m = _mm256_loadu_si256(v);
  for (unsigned i = 1; i < QM_DELAY_CB_N / 8; i++)
    m = _mm256_max_epu32(m, _mm256_loadu_si256(v + i));
  m = _mm256_max_epu32(m, _mm256_permute2x128_si256(m, m, 1));
  m = _mm256_max_epu32(m, _mm256_shuffle_epi32(m, 0x4e));
  m = _mm256_max_epu32(m, _mm256_shuffle_epi32(m, 0xb1));
  *most = (uint32_t)_mm256_cvtsi256_si32(m);
  for (unsigned i = 0;; i++) {
    __m256i eq = _mm256_cmpeq_epi32(_mm256_loadu_si256(v + i), m);
    unsigned mask = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(eq));
    if (mask)
      return i * 8 + (unsigned)__builtin_ctz(mask);
  }
}
#endif
static unsigned delay_most(size_t *most) {
#if defined(__x86_64__)
  if (QM_LIKELY(qm__vec))
    return delay_most_avx2(most);
#endif
  unsigned big = 0;
  uint32_t m = 0;
  for (unsigned c = 0; c < QM_NCLASS; c++)
    if (qm__delay_cb[c] > m) {
      m = qm__delay_cb[c];
      big = c;
    }
  *most = m;
  return big;
}

void qm__cache_delay_over(void) {
  size_t budget = (size_t)qm__opt.free_delay_kb << 10, over = 0;
  /* the ring holding the most bytes gives its oldest until the thread is
   * back under the budget, and is remembered: the frees past the budget
   * after this one take from it inline, one out for each one in, while it
   * holds any of at least their size (qm_cache_give_checked). Drained in
   * bulk down to three quarters of the budget, it overflowed its bin into
   * the central lists and back (small churn under hardening=max with the
   * budget at 1 MiB: 827 instructions an op, 658 at 2 MiB, which that
   * churn seldom reached). Taken from the freeing class instead, a class
   * that kept the thread at the budget (4 KiB buffers) cut every other
   * class's delay to its ring's length then: 48-byte chunks back after 65
   * mallocs, not 256 */
  while (qm__delay_bytes > budget) {
    size_t most;
    unsigned big = delay_most(&most);
    if (!most || !qm__cc[big].q.n) /* (the second: never; no endless loop if so) */
      break;
    qm__delay_big = big;
    for (; qm__cc[big].q.n && qm__delay_bytes > budget; over++)
      ring_pop(big);
  }
  atomic_fetch_add_explicit(&delay_over, over, memory_order_relaxed);
}

void qm__cache_delay_over_publish(void) {
  atomic_fetch_add_explicit(&delay_over, qm__delay_over_n, memory_order_relaxed);
  qm__delay_over_n = 0;
  qm__delay_over_due = 1024;
}

size_t qm__cache_delay_early(void) {
  return atomic_load_explicit(&delay_early, memory_order_relaxed) + qm__central_limbo_early();
}
size_t qm__cache_delay_over_count(void) {
  return atomic_load_explicit(&delay_over, memory_order_relaxed) + qm__delay_over_n +
         qm__central_limbo_over();
}

/* Whether the thread has a cache, made on first need; false when it runs
 * without one (option thread_cache=0, no memory, or thread exiting). */
bool qm__cache_ensure(unsigned want) {
  if (state == TC_LIVE)
    return true;
  if (state != TC_EMPTY || !qm__opt.thread_cache)
    return false;
  /* a handler's malloc or free while the cache is made takes the central
   * lists: made a second time, nested, the cache took a second
   * registration and the outer making pointed the bins over the first's
   * slot arrays with the counts of the second's */
  state = TC_MAKING;
  if (qm__small_up.cache_create(want))
    return true; /* live: qm__cache_go_live */
  state = TC_EMPTY;
  return false;
}

static bool have_cache(void) { return qm__cache_ensure(0); }

__thread bool qm__took __attribute__((tls_model("initial-exec")));

uintptr_t qm__cache_take_slow(unsigned c) {
  if (!have_cache()) {
    uintptr_t one;
    return qm__central_take(c, group, &one, 1, true) ? one : 0;
  }
  if (qm__opt.free_delay) {
    ring_tick(c);
    adopt(c);
  }
  uintptr_t *slot = qm__bin_slot[c];
  uint32_t *n = count_of(c), half = (qm__class[c].cache_max + 1) / 2;
  if (!*n)
    *n = qm__central_take(c, group, slot, half, false);
  else if (!qm__cache_checked && *n < half / 2)
    /* the drain left the bin low: the rest of the class's chunks wait in
     * the parked frees (qm__pend_slot), and a bin topped up only by them ran dry
     * again within a few mallocs, each time rescanning the ring (python3
     * with PYTHONMALLOC=malloc, 200,000 rounds: 55,000 misses of its
     * 48-byte bin, 54,000 of them refilled by the drain alone). Filled to
     * half, as from empty. */
    *n += qm__central_take(c, group, slot + *n, half - *n, false);
  if (!*n)
    return 0;
  return qm__cache_checked ? take_checked(c) : slot[--*n];
}

void qm__cache_put_full(unsigned c, uintptr_t chunk) { bin_put(c, chunk); }

uintptr_t qm__cache_refill_checked(unsigned c) {
  qm_checked_t *k = &qm__cc[c];
  if (qm__opt.free_delay)
    adopt(c);
  k->count = qm__central_take(c, group, k->slot, (qm__class[c].cache_max + 1) / 2, false);
  return k->count ? qm_checked_draw(k, c) : 0;
}

void qm__cache_ring_full(unsigned c) {
  ring_pop(c);
  atomic_fetch_add_explicit(&delay_early, 1, memory_order_relaxed);
}

void qm__cache_give_slow(uintptr_t chunk, unsigned c) {
  if (!have_cache()) {
    qm__central_hold(c, group, chunk, 0); /* given at once without a delay */
    return;
  }
  if (qm__opt.free_delay)
    ring_push(c, chunk);
  else
    bin_put(c, chunk);
}

void qm__cache_attach(uintptr_t *s, qm_aged_t *r) {
  rings = r;
  for (unsigned c = 0; c < QM_NCLASS; c++) {
    qm__bin[c].count = 0;
    qm__cc[c] = (qm_checked_t){.slot = qm__cache_checked ? s : NULL,
                               .ring = rings + (size_t)c * 2 * qm__opt.free_delay,
                               .cap = qm__opt.free_delay ? ring_cap_calc(c) : 0};
    qm__bin_slot[c] = s;
    qm__bin[c].max = qm__cache_checked ? 0 : qm__class[c].cache_max;
    s += qm__class[c].cache_max;
  }
}

void qm__cache_go_live(void) { state = TC_LIVE; }

void qm__cache_set_group(unsigned g) { group = g; }

bool qm__cache_live(void) { return state == TC_LIVE; }

void qm__cache_flush_bins(void) {
  for (unsigned c = 0; state == TC_LIVE && c < QM_NCLASS; c++) {
    uint32_t *n = count_of(c);
    if (*n)
      qm__central_give(c, group, qm__bin_slot[c], *n);
    *n = 0;
  }
}

size_t qm__cache_save_bins(uint32_t held[QM_NCLASS]) {
  size_t bytes = 0;
  for (unsigned c = 0; c < QM_NCLASS; c++) {
    /* taken and zeroed in one instruction: a signal handler's malloc pops
     * the bin either before (the count taken is one less) or after (it
     * finds none), never a chunk this count still counts */
    held[c] = __atomic_exchange_n(count_of(c), 0, __ATOMIC_RELAXED);
    bytes += (size_t)held[c] * qm__class[c].size;
  }
  return bytes;
}

void qm__cache_restore_bins(uint32_t held[QM_NCLASS]) {
  for (unsigned c = 0; c < QM_NCLASS; c++) {
    qm__bin[c].count = held[c]; /* the default profile's: checked mode keeps none */
    held[c] = 0;
  }
}

void qm__cache_give_saved(uintptr_t *s, uint32_t held[QM_NCLASS], unsigned g) {
  for (unsigned c = 0; c < QM_NCLASS; c++) {
    if (held[c])
      qm__central_give(c, g, s, held[c]);
    held[c] = 0;
    s += qm__class[c].cache_max;
  }
}

void qm__cache_detach(void) {
  for (unsigned c = 0; c < QM_NCLASS; c++) {
    qm__bin[c].max = 0;    /* every later call takes the slow path */
    qm__cc[c].slot = NULL; /* checked mode's too */
  }
  state = TC_DEAD;
}

unsigned qm__cache_group(void) { return group; }

void qm__cache_reshuffle(qm_regen_fn regen) {
  if (state != TC_LIVE)
    return;
  for (unsigned c = 0; c < QM_NCLASS; c++) {
    uintptr_t *slot = qm__bin_slot[c];
    uint32_t n = *count_of(c);
    for (uint32_t i = n; i > 1; i--) {
      uint32_t j = qm_rand_below(i);
      uintptr_t t = slot[i - 1];
      slot[i - 1] = slot[j];
      slot[j] = t;
    }
    for (uint32_t i = 0; i < n; i++)
      slot[i] = regen(slot[i], c);
    qm_checked_t *k = &qm__cc[c];
    k->next = n ? qm_rand_below(n) : 0;
    if (qm__opt.free_delay)
      for (uint32_t i = 0; i < k->q.n; i++) {
        qm_aged_t *e = &k->ring[qm_age_at(&k->q, i, k->cap)];
        e->item = regen(e->item, c);
      }
  }
}
