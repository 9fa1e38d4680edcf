/* cache.c: creation, refill, drain and death of thread caches. A cache is
 * carved from meta memory with its slot arrays behind it, registered in a
 * list (stats, fork), and emptied into the central lists when its thread
 * exits. After that the thread is DEAD: it allocates straight from the
 * central lists, so allocations in later TLS destructors still work.
 */
#include "cache.h"

#include <pthread.h>

#include "lock.h"
#include "meta.h"
#include "options.h"

static qm_tcache_t empty_cache = {.state = QM_TC_EMPTY};
static qm_tcache_t dead_cache = {.state = QM_TC_DEAD};
__thread qm_tcache_t *qm__tc __attribute__((tls_model("initial-exec"))) = &empty_cache;

static qm_lock_t registry_lock = QM_LOCK_INIT;
static qm_tcache_t *registry; /* live caches */
static qm_tcache_t *spares;   /* caches of exited threads, for reuse */
static size_t nthreads;
static pthread_key_t exit_key;
static bool key_ok;

static void on_thread_exit(void *arg);

/* Builds (or recycles) a cache for this thread; NULL if there is no memory
 * for it, in which case the thread simply allocates from the central lists. */
static qm_tcache_t *cache_create(void) {
  qm_lock(&registry_lock);
  qm_tcache_t *tc = spares;
  if (tc)
    spares = tc->next;
  qm_unlock(&registry_lock);
  if (!tc) {
    size_t slots = 0;
    for (unsigned c = 0; c < QM_NCLASS; c++)
      slots += qm__class[c].cache_max;
    tc = qm__meta_alloc(sizeof *tc + slots * sizeof(uintptr_t));
    if (!tc)
      return NULL;
    uintptr_t *s = (uintptr_t *)(tc + 1);
    for (unsigned c = 0; c < QM_NCLASS; c++) {
      tc->bin[c].max = qm__class[c].cache_max;
      tc->bin[c].slot = s;
      s += tc->bin[c].max;
    }
  }
  tc->state = QM_TC_LIVE;
  qm__tc = tc; /* before setspecific, which may itself call malloc */
  qm_lock(&registry_lock);
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
  return tc;
}

/* The thread's cache, created on first need; NULL when the thread runs
 * without one (option thread_cache=0, no memory, or thread exiting). */
static qm_tcache_t *self_cache(void) {
  qm_tcache_t *tc = qm__tc;
  if (tc->state == QM_TC_LIVE)
    return tc;
  if (tc->state == QM_TC_DEAD || !qm__opt.thread_cache)
    return NULL;
  return cache_create();
}

uintptr_t qm__cache_take_slow(unsigned c) {
  qm_tcache_t *tc = self_cache();
  if (!tc) {
    uintptr_t one;
    return qm__central_take(c, &one, 1) ? one : 0;
  }
  qm_bin_t *b = &tc->bin[c];
  if (!b->count)
    b->count = qm__central_take(c, b->slot, (b->max + 1) / 2);
  return b->count ? b->slot[--b->count] : 0;
}

void qm__cache_give_slow(uintptr_t chunk, unsigned c) {
  qm_tcache_t *tc = self_cache();
  if (!tc) {
    qm__central_give(c, &chunk, 1);
    return;
  }
  qm_bin_t *b = &tc->bin[c];
  if (b->count == b->max) {
    unsigned half = b->max / 2;
    qm__central_give(c, b->slot + b->count - half, half);
    b->count -= half;
  }
  b->slot[b->count++] = chunk;
}

static void flush(qm_tcache_t *tc) {
  for (unsigned c = 0; c < QM_NCLASS; c++) {
    qm_bin_t *b = &tc->bin[c];
    if (b->count)
      qm__central_give(c, b->slot, b->count);
    b->count = 0;
  }
}

void qm__cache_flush_self(void) {
  if (qm__tc->state == QM_TC_LIVE)
    flush(qm__tc);
}

static void retire(qm_tcache_t *tc) {
  flush(tc);
  qm_lock(&registry_lock);
  if (tc->prev)
    tc->prev->next = tc->next;
  else
    registry = tc->next;
  if (tc->next)
    tc->next->prev = tc->prev;
  nthreads--;
  tc->state = QM_TC_EMPTY;
  tc->next = spares;
  spares = tc;
  qm_unlock(&registry_lock);
}

static void on_thread_exit(void *arg) {
  qm_tcache_t *tc = arg;
  qm__tc = &dead_cache;
  if (tc && tc->state == QM_TC_LIVE)
    retire(tc);
}

size_t qm__cache_held_bytes(void) {
  size_t bytes = 0;
  qm_lock(&registry_lock);
  for (qm_tcache_t *tc = registry; tc; tc = tc->next)
    for (unsigned c = 0; c < QM_NCLASS; c++)
      bytes += (size_t)__atomic_load_n(&tc->bin[c].count, __ATOMIC_RELAXED) * qm__class[c].size;
  qm_unlock(&registry_lock);
  return bytes;
}

size_t qm__cache_threads(void) { return nthreads; }

void qm__cache_init(void) { key_ok = pthread_key_create(&exit_key, on_thread_exit) == 0; }

void qm__cache_fork_prepare(void) { qm_lock(&registry_lock); }
void qm__cache_fork_parent(void) { qm_unlock(&registry_lock); }

/* Only the forking thread lives on in the child. The other threads' caches
 * may have been in mid-update when fork() copied them: their chunks are
 * abandoned rather than trusted. The caller's own cache stays registered. */
void qm__cache_fork_child(void) {
  qm_lock_reinit(&registry_lock);
  qm_tcache_t *self = qm__tc->state == QM_TC_LIVE ? qm__tc : NULL;
  registry = self;
  nthreads = self ? 1 : 0;
  if (self)
    self->next = self->prev = NULL;
}
