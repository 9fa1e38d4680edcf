/* cache.c: creation, refill, drain and death of thread caches. A thread's
 * bins are in its TLS; its slot arrays and its entry in the registry (stats,
 * fork) come from meta memory and are recycled when it exits, after its
 * chunks went back to the central lists. After that the thread is DEAD: it
 * allocates straight from the central lists, so allocations in later TLS
 * destructors still work.
 */
#include "cache.h"

#include <pthread.h>
#include <string.h>

#include "lock.h"
#include "meta.h"
#include "options.h"
#include "smallstate.h"

enum { TC_EMPTY, TC_LIVE, TC_DEAD };

/* Delayed free (free_delay = D > 0, checked mode): a chunk freed by a thread
 * waits in a per-class aging queue (age.h) of that thread, stamped with the
 * thread's count of mallocs of its class, and enters the bin (where malloc
 * can have it) only once that count has grown by more than D. A ring holds up to 2D
 * chunks and at most QM_DELAY_BYTES: a thread that frees more than that within
 * D mallocs pushes its oldest out early (counted); all its rings together
 * hold at most free_delay_kb (qm__delay_bytes). What is left of a ring
 * when its thread exits, and what is freed where no ring can age it (a
 * thread without a cache, a closed id's frees), waits out the rest of its D
 * mallocs in the central limbo (qm__central_hold): adopted into the ring of
 * the next thread that refills the class, or aged by the mallocs of
 * threads without a cache. */
static __thread qm_aged_t *rings __attribute__((tls_model("initial-exec")));
__thread size_t qm__delay_bytes __attribute__((tls_model("initial-exec")));
static _Atomic size_t delay_early; /* left a full ring early */
static _Atomic size_t delay_over;  /* left early for free_delay_kb */

/* A thread's registration: where its bins are, and its slot storage. */
typedef struct qm_tcache {
  qm_bin_t *bin; /* the owning thread's qm__bin */
  uintptr_t *slots;
  qm_aged_t *rings; /* 2 * free_delay entries per class, when free_delay > 0 */
  unsigned id;      /* owner id of the chunks it hands out; kept across reuse */
  struct qm_tcache *next, *prev;
} qm_tcache_t;

__thread qm_checked_t qm__cc[QM_NCLASS] __attribute__((tls_model("initial-exec")));
static __thread qm_tcache_t *self __attribute__((tls_model("initial-exec")));
/* This thread's group of the central lists: 0 until it has a cache, then
 * the group with the fewest live caches, kept after the thread's cache is
 * gone (its later frees go to the central lists) */
static __thread unsigned group __attribute__((tls_model("initial-exec")));
static size_t group_live[QM_GROUPS]; /* live caches per group, under registry_lock */
static unsigned group_next;          /* where the search for the fewest starts */
static __thread int state __attribute__((tls_model("initial-exec")));

static qm_lock_t registry_lock = QM_LOCK_INIT;
static qm_tcache_t *registry; /* live caches */
static qm_tcache_t *spares;   /* registrations of exited threads, for reuse */
static size_t nthreads;
static unsigned next_id = 1; /* owner ids given out so far, under registry_lock */
static pthread_key_t exit_key;
static bool key_ok;

static uint32_t ring_cap_calc(unsigned c) {
  size_t cap = 2 * (size_t)qm__opt.free_delay, fit = QM_DELAY_BYTES / qm__class[c].size;
  return (uint32_t)(cap < fit ? cap : fit ? fit : 1);
}

/* How far down the spare registrations cache_create looks for the id it
 * would rather have. */
#define ADOPT_SCAN 64

/* Gives this thread's bins their slots, with owner id `want` if an exited
 * thread left it (0: any); false if there is no memory for them, in which
 * case the thread allocates from the central lists. */
static bool cache_create(unsigned want) {
  qm_lock(&registry_lock);
  qm_tcache_t **link = &spares;
  for (unsigned k = 0; want && *link && k < ADOPT_SCAN; k++, link = &(*link)->next)
    if ((*link)->id == want)
      break;
  if (!*link || (*link)->id != want)
    link = &spares;
  qm_tcache_t *tc = *link;
  if (tc)
    *link = tc->next;
  qm_unlock(&registry_lock);
  if (!tc) {
    qm_lock(&registry_lock);
    unsigned id = next_id < QM_MAX_OWNERS ? next_id++ : 0;
    qm_unlock(&registry_lock);
    if (!id)
      return false; /* every owner id is some live thread's: run on the central lists */
    size_t slots = 0;
    for (unsigned c = 0; c < QM_NCLASS; c++)
      slots += qm__class[c].cache_max;
    /* the rings' pages are touched only as they fill */
    size_t ring_bytes = (size_t)QM_NCLASS * 2 * qm__opt.free_delay * sizeof(qm_aged_t);
    tc = qm__meta_alloc(sizeof *tc + ring_bytes + slots * sizeof(uintptr_t));
    if (!tc)
      return false;
    tc->id = id;
    tc->rings = (qm_aged_t *)(tc + 1);
    tc->slots = (uintptr_t *)((char *)tc->rings + ring_bytes);
  }
  rings = tc->rings;
  uintptr_t *s = tc->slots;
  for (unsigned c = 0; c < QM_NCLASS; c++) {
    qm__bin[c].count = 0;
    qm__cc[c] = (qm_checked_t){.slot = qm__cache_checked ? s : NULL,
                               .ring = rings + (size_t)c * 2 * qm__opt.free_delay,
                               .cap = qm__opt.free_delay ? ring_cap_calc(c) : 0};
    qm__bin[c].slot = s;
    qm__bin[c].max = qm__cache_checked ? 0 : qm__class[c].cache_max;
    s += qm__class[c].cache_max;
  }
  tc->bin = qm__bin;
  self = tc;
  qm__state_adopt(tc->id);
  qm_rand_thread_seed();
  state = TC_LIVE; /* before setspecific, which may itself call malloc */
  /* the fewest live caches; among equals, the one holding the most free
   * bytes (a thread that takes over from one that exited takes over its
   * memory: in the hand-off bench, successors going round the groups left
   * each predecessor's chunks idle, up to QM_STEAL_MIN per class, and the
   * peak RSS 30% above jemalloc's), then the next one round. The bytes are
   * read before registry_lock: fork takes the central locks before it. */
  size_t bytes[QM_GROUPS];
  qm__central_group_bytes(bytes);
  qm_lock(&registry_lock);
  unsigned best = group_next % QM_GROUPS;
  for (unsigned k = 1; k < QM_GROUPS; k++) {
    unsigned g = (group_next + k) % QM_GROUPS;
    if (group_live[g] < group_live[best] ||
        (group_live[g] == group_live[best] && bytes[g] > bytes[best]))
      best = g;
  }
  group = best;
  group_live[best]++;
  group_next = best + 1;
  tc->prev = NULL;
  tc->next = registry;
  if (registry)
    registry->prev = tc;
  registry = tc;
  nthreads++;
  qm_unlock(&registry_lock);
  /* pthread_setspecific allocates only for keys past the first 32 */
  if (key_ok)
    pthread_setspecific(exit_key, tc);
  return true;
}

/* Whether the thread has a cache, created on first need; false when it
 * runs without one (option thread_cache=0, no memory, or thread exiting). */
static bool have_cache(void) {
  if (state == TC_LIVE)
    return true;
  if (state == TC_DEAD || !qm__opt.thread_cache)
    return false;
  return cache_create(0);
}

bool qm__cache_ensure(unsigned want) {
  if (state == TC_LIVE)
    return true;
  if (state == TC_DEAD || !qm__opt.thread_cache)
    return false;
  return cache_create(want);
}

/* The count this thread's bin of class c is kept under. */
static uint32_t *count_of(unsigned c) {
  return qm__cache_checked ? &qm__cc[c].count : &qm__bin[c].count;
}

/* Puts chunk into this thread's bin of class c, first handing half the bin
 * to the central list if it is full: at a random place, or in checked mode
 * on top (there the take draws its slot at random instead). */
static void bin_put(unsigned c, uintptr_t chunk) {
  qm_bin_t *b = &qm__bin[c];
  uint32_t *n = count_of(c), max = qm__class[c].cache_max;
  if (*n == max) {
    unsigned half = max / 2;
    qm__central_give(c, group, b->slot + *n - half, half);
    *n -= half;
  }
  if (qm__cache_checked)
    b->slot[(*n)++] = chunk;
  else
    *n = qm_bin_insert(b->slot, *n, chunk);
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
  qm_delay_add(qm__class[c].size); /* before the push, as qm_cache_give_checked */
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
}

/* At exit: each ring's chunks wait out the rest of their D mallocs in the
 * limbo, not in the central lists, where the next thread's refill would
 * have them at once. */
static void ring_flush(void) {
  for (unsigned c = 0; c < QM_NCLASS; c++) {
    qm_checked_t *k = &qm__cc[c];
    while (k->q.n) {
      qm_aged_t e = k->ring[qm_age_pop(&k->q, k->cap)];
      qm__central_hold(c, group, e.item, k->clock - e.at);
    }
  }
  qm__delay_bytes = 0;
}

void qm__cache_delay_over(void) {
  size_t budget = (size_t)qm__opt.free_delay_kb << 10, target = budget - budget / 4, over = 0;
  /* down to 3/4 of the budget: the scan of the classes comes once per
   * quarter of it freed, not at every free past it */
  while (qm__delay_bytes > target) {
    unsigned big = 0;
    size_t most = 0;
    for (unsigned c = 0; c < QM_NCLASS; c++) {
      size_t b = (size_t)qm__cc[c].q.n * qm__class[c].size;
      if (b > most) {
        most = b;
        big = c;
      }
    }
    if (!most)
      break;
    for (; qm__cc[big].q.n && qm__delay_bytes > target; over++)
      ring_pop(big);
  }
  atomic_fetch_add_explicit(&delay_over, over, memory_order_relaxed);
}

size_t qm__cache_delay_early(void) {
  return atomic_load_explicit(&delay_early, memory_order_relaxed) + qm__central_limbo_early();
}
size_t qm__cache_delay_over_count(void) {
  return atomic_load_explicit(&delay_over, memory_order_relaxed) + qm__central_limbo_over();
}

uintptr_t qm__cache_take_slow(unsigned c) {
  /* frees other threads sent this one come back to its bins first */
  qm__state_drain();
  if (!have_cache()) {
    uintptr_t one;
    return qm__central_take(c, group, &one, 1, true) ? one : 0;
  }
  if (qm__opt.free_delay) {
    ring_tick(c);
    adopt(c);
  }
  qm_bin_t *b = &qm__bin[c];
  uint32_t *n = count_of(c), half = (qm__class[c].cache_max + 1) / 2;
  if (!*n)
    *n = qm__central_take(c, group, b->slot, half, false);
  else if (!qm__cache_checked && *n < half / 2)
    /* the drain left the bin low: the rest of the class's chunks wait in
     * the parked frees (qm__pend), and a bin topped up only by them ran dry
     * again within a few mallocs, each time rescanning the ring (python3
     * with PYTHONMALLOC=malloc, 200,000 rounds: 55,000 misses of its
     * 48-byte bin, 54,000 of them refilled by the drain alone). Filled to
     * half, as from empty. */
    *n += qm__central_take(c, group, b->slot + *n, half - *n, false);
  if (!*n)
    return 0;
  return qm__cache_checked ? take_checked(c) : b->slot[--*n];
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

void qm__cache_flush_self(void) {
  uintptr_t was = qm_busy_enter();
  qm__small_pend_flush();
  qm__state_flush_outbox();
  for (unsigned c = 0; state == TC_LIVE && c < QM_NCLASS; c++) {
    uint32_t *n = count_of(c);
    if (*n)
      qm__central_give(c, group, qm__bin[c].slot, *n);
    *n = 0;
  }
  qm_busy_leave(was);
}

static void on_thread_exit(void *arg) {
  qm_tcache_t *tc = arg;
  if (state != TC_LIVE || tc != self)
    return;
  uintptr_t was = qm_busy_enter();
  qm__state_drain();
  qm__cache_flush_self();
  if (qm__opt.free_delay)
    ring_flush();
  qm__state_retire(tc->id);
  for (unsigned c = 0; c < QM_NCLASS; c++) {
    qm__bin[c].max = 0;    /* every later call takes the slow path */
    qm__cc[c].slot = NULL; /* checked mode's too */
  }
  state = TC_DEAD;
  qm_lock(&registry_lock);
  if (tc->prev)
    tc->prev->next = tc->next;
  else
    registry = tc->next;
  if (tc->next)
    tc->next->prev = tc->prev;
  nthreads--;
  group_live[group]--;
  tc->next = spares;
  spares = tc;
  qm_unlock(&registry_lock);
  qm_busy_leave(was);
}

size_t qm__cache_held_bytes(void) {
  size_t bytes = 0;
  qm_lock(&registry_lock);
  for (qm_tcache_t *tc = registry; tc; tc = tc->next)
    for (unsigned c = 0; c < QM_NCLASS; c++)
      bytes += (size_t)__atomic_load_n(&tc->bin[c].count, __ATOMIC_RELAXED) * qm__class[c].size;
  /* checked mode's counts are in each thread's TLS: not counted here */
  qm_unlock(&registry_lock);
  return bytes;
}

size_t qm__cache_threads(void) { return nthreads; }

unsigned qm__cache_group(void) { return group; }

void qm__cache_init(void) { key_ok = pthread_key_create(&exit_key, on_thread_exit) == 0; }

void qm__cache_fork_prepare(void) { qm_fork_lock(&registry_lock); }
void qm__cache_fork_parent(void) { qm_unlock(&registry_lock); }
unsigned qm__cache_ids(void) { return next_id; }

/* In a fork child: the chunks of this thread's bins in a fresh order, and
 * every free chunk it holds (bins, parked frees, delayed-free rings) with a
 * fresh generation, hence a fresh canary: what the parent's first mallocs
 * would hand out, and with which canary, tells nothing of a child's, nor
 * one child's of another's (the central lists are redrawn by the primary). */
static void fork_reshuffle(void) {
  qm__small_pend_regen();
  if (state != TC_LIVE)
    return;
  for (unsigned c = 0; c < QM_NCLASS; c++) {
    uintptr_t *slot = qm__bin[c].slot;
    uint32_t n = *count_of(c);
    for (uint32_t i = n; i > 1; i--) {
      uint32_t j = qm_rand_below(i);
      uintptr_t t = slot[i - 1];
      slot[i - 1] = slot[j];
      slot[j] = t;
    }
    for (uint32_t i = 0; i < n; i++)
      slot[i] = qm__small_regen(slot[i], c);
    qm_checked_t *k = &qm__cc[c];
    k->next = n ? qm_rand_below(n) : 0;
    if (qm__opt.free_delay)
      for (uint32_t i = 0; i < k->q.n; i++) {
        qm_aged_t *e = &k->ring[qm_age_at(&k->q, i, k->cap)];
        e->item = qm__small_regen(e->item, c);
      }
  }
}

/* Only the forking thread lives on in the child. The other threads' caches
 * may have been in mid-update when fork() copied them: their chunks are
 * abandoned rather than trusted, and their ids closed (the frees of the
 * chunks they owned take the closed path). The caller's own cache stays
 * registered. */
void qm__cache_fork_child(void) {
  qm_lock_reinit(&registry_lock);
  for (qm_tcache_t *tc = registry; tc; tc = tc->next)
    if (tc != self || state != TC_LIVE)
      qm__state_orphan(tc->id);
  registry = state == TC_LIVE ? self : NULL;
  nthreads = registry ? 1 : 0;
  memset(group_live, 0, sizeof group_live);
  group_live[group] = nthreads;
  if (registry)
    registry->next = registry->prev = NULL;
  qm__state_fork_settle();
  fork_reshuffle();
}
