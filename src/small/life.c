/* life.c: the thread life cycle of the small side: a thread's cache made on
 * its first need (slot arrays and delay rings from meta memory, an owner id,
 * a group of the central lists), its registration (stats, fork), its death
 * at thread exit (its id retired, its registration and, within a bound, the
 * chunks in its bins kept: the bins for the thread that inherits its id, the
 * registration for any), and what fork leaves of them.
 * Above both the cache (cache.c) and the chunks' state (smallstate.c).
 */
#include "life.h"

#include <pthread.h>
#include <string.h>

#include "cache.h"
#include "lock.h"
#include "meta.h"
#include "options.h"
#include "smallstate.h"

/* A thread's registration: where its bins are, and its slot storage. */
typedef struct qm_tcache {
  qm_bin_t *bin; /* the owning thread's qm__bin */
  uintptr_t *slots;
  qm_aged_t *rings; /* 2 * free_delay entries per class, when free_delay > 0 */
  unsigned id;      /* owner id of the chunks it hands out; kept across reuse */
  struct qm_tcache *next, *prev;
  /* A spare's: what its bins held when its thread exited (their chunks in
   * slots, as the thread left them), and their bytes. */
  uint32_t held[QM_NCLASS];
  size_t held_bytes;
  unsigned group; /* its thread's group of the central lists */
  /* some thread that had it handed out a chunk (qm__took): its id is on
   * chunks that may still be live */
  bool owned;
} qm_tcache_t;

static __thread qm_tcache_t *self __attribute__((tls_model("initial-exec")));
static size_t group_live[QM_GROUPS]; /* live caches per group, under registry_lock */
static unsigned group_next;          /* where the search for the fewest starts */

static qm_lock_t registry_lock = QM_LOCK_INIT;
static qm_tcache_t *registry; /* live caches */
static qm_tcache_t *spares;   /* registrations of exited threads, for reuse */
static size_t nthreads;
static unsigned next_id = 1; /* owner ids given out so far, under registry_lock */
/* The bytes the spares' bins hold, under registry_lock. An exiting thread
 * keeps its bins' chunks with its registration while this stays within
 * SPARE_HELD_MAX. A thread that inherits its id (its first act freed a
 * chunk the exited thread allocated: a successor in a hand-off) takes the
 * bins as they are: to the heap it is the same thread going on, and its
 * mallocs draw from the bins at random as that thread's would have. Where
 * a flush at exit checked every chunk into the central lists and the
 * successor's first refills took them out again, the central lists were
 * 12 M of hand-off's 74 M allocator instructions (cachegrind). Any other
 * thread that takes the registration gives the bins to the central lists
 * first: a thread never draws from the bins of a thread it does not
 * succeed, so a chunk an exiting thread freed comes back to the next
 * thread's first mallocs about 1 time in 200 (layout-handoff), as from the
 * central lists, not 1 in 3 as from its bins. Past the bound a thread
 * gives its bins back at exit, so threads that exit for good strand at
 * most this much; malloc_trim takes it back. */
static size_t spare_bytes;
#define SPARE_HELD_MAX ((size_t)4 << 20)
static pthread_key_t exit_key;
static bool key_ok;

#ifdef QM_TEST_HOOKS
void (*qm__life_making_hook)(void);
#define MAKING_HOOK()                                                                              \
  do {                                                                                             \
    if (qm__life_making_hook)                                                                      \
      qm__life_making_hook();                                                                      \
  } while (0)
#else
#define MAKING_HOOK() ((void)0)
#endif

/* How far down the spare registrations cache_create looks for the id it
 * would rather have. */
#define ADOPT_SCAN 64

/* Gives this thread's bins their slots, with owner id `want` if an exited
 * thread left it (0: any); false if there is no memory for them, in which
 * case the thread allocates from the central lists. */
bool qm__life_cache_create(unsigned want) {
  qm_lock(&registry_lock);
  qm_tcache_t **link = &spares;
  bool unowned = want == QM_WANT_UNOWNED;
  for (unsigned k = 0; want && *link && k < ADOPT_SCAN; k++, link = &(*link)->next)
    if (unowned ? !(*link)->owned : (*link)->id == want)
      break;
  if (!*link || (unowned ? (*link)->owned : (*link)->id != want))
    link = unowned ? NULL : &spares;
  qm_tcache_t *tc = link ? *link : NULL;
  bool inherit = false;
  if (tc) {
    *link = tc->next;
    spare_bytes -= tc->held_bytes;
    tc->held_bytes = 0;
    inherit = !unowned && want && tc->id == want;
  }
  qm_unlock(&registry_lock);
  /* not inherited: to the central lists of the exited thread's group
   * first, while nothing else points at the slot arrays (the cache is
   * MAKING: a signal handler's malloc takes the central lists) */
  if (tc && !inherit)
    qm__cache_give_saved(tc->slots, tc->held, tc->group);
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
    memset(tc, 0, sizeof *tc);
    tc->id = id;
    tc->rings = (qm_aged_t *)(tc + 1);
    tc->slots = (uintptr_t *)((char *)tc->rings + ring_bytes);
  }
  qm__cache_attach(tc->slots, tc->rings);
  MAKING_HOOK(); /* where a signal handler's malloc may land */
  tc->bin = qm__bin;
  self = tc;
  qm__state_adopt(tc->id);
  qm_rand_thread_seed();
  if (inherit)
    qm__cache_restore_bins(tc->held);
  qm__cache_go_live(); /* before setspecific, which may itself call malloc */
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
  /* a successor goes on in its predecessor's group, whose chunks its bins
   * hold: every table line stays one group's (carve, steal_lines) */
  if (inherit)
    best = tc->group;
  tc->group = best;
  qm__cache_set_group(best);
  group_live[best]++;
  group_next = best + 1;
  tc->prev = NULL;
  tc->next = registry;
  if (registry)
    registry->prev = tc;
  registry = tc;
  nthreads++;
  qm_unlock(&registry_lock);
  /* pthread_setspecific allocates only for keys past the first 32. Set in
   * the last round of the thread's key destructors (glibc's fourth), it is
   * never called: the registration, its id and what its bins and outbox
   * hold stay for good (open: no later hook runs at a thread's end) */
  if (key_ok)
    pthread_setspecific(exit_key, tc);
  return true;
}

void qm__life_flush_self(void) {
  uintptr_t was = qm_busy_enter();
  qm__small_pend_flush();
  qm__state_flush_outbox();
  qm__cache_flush_bins();
  qm_busy_leave(was);
}

static void on_thread_exit(void *arg) {
  qm_tcache_t *tc = arg;
  if (!qm__cache_live() || tc != self)
    return;
  uintptr_t was = qm_busy_enter();
  qm__state_drain();
  qm__small_pend_flush();
  qm__state_flush_outbox();
  if (qm__opt.free_delay)
    qm__cache_ring_flush();
  /* dead first: a signal handler's malloc from here on takes the central
   * lists, and the bins' counts only fall (its pops) */
  qm__cache_detach();
  /* kept within the bound, else given back outside the lock (fork takes
   * the class locks before registry_lock); checked mode keeps nothing: no
   * thread inherits an id there (its frees check at once), so no bin is
   * ever taken over */
  size_t bytes = qm__cache_save_bins(tc->held);
  tc->owned = tc->owned || qm__took;
  qm_lock(&registry_lock);
  bool keep = !qm__cache_checked && spare_bytes + bytes <= SPARE_HELD_MAX;
  if (keep)
    spare_bytes += bytes;
  qm_unlock(&registry_lock);
  if (keep)
    tc->held_bytes = bytes;
  else
    qm__cache_give_saved(tc->slots, tc->held, tc->group);
  qm__state_retire(tc->id);
  unsigned group = qm__cache_group();
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
  /* what handlers deferred since the drain above: applied as any free of
   * a thread with no id (the closed path), not lost with the thread */
  qm__busy_leave_applying(was);
}

/* One spare at a time off the list (a new thread cannot take it
 * meanwhile), its chunks given back outside the lock, then put back. */
void qm__life_release_spares(void) {
  for (;;) {
    qm_lock(&registry_lock);
    qm_tcache_t **link = &spares;
    while (*link && !(*link)->held_bytes)
      link = &(*link)->next;
    qm_tcache_t *tc = *link;
    if (tc) {
      *link = tc->next;
      spare_bytes -= tc->held_bytes;
      tc->held_bytes = 0;
    }
    qm_unlock(&registry_lock);
    if (!tc)
      return;
    uintptr_t was = qm_busy_enter();
    qm__cache_give_saved(tc->slots, tc->held, tc->group);
    qm_busy_leave(was);
    qm_lock(&registry_lock);
    tc->next = spares;
    spares = tc;
    qm_unlock(&registry_lock);
  }
}

size_t qm__life_held_bytes(void) {
  size_t bytes = 0;
  qm_lock(&registry_lock);
  bytes += spare_bytes;
  /* checked mode's bins (qm__cc) are in each thread's TLS: not counted
   * here, and its qm__bin are empty, not read either. A registration made
   * in the last round of a thread's key destructors outlives the thread
   * (glibc calls no destructor set in that round): its bin points into TLS
   * that may be unmapped with the thread's stack. A free-only thread in
   * checked mode made one there, and this read took SIGSEGV; the default
   * profile's still may (see qm__life_cache_create's setspecific) */
  if (!qm__cache_checked)
    for (qm_tcache_t *tc = registry; tc; tc = tc->next)
      for (unsigned c = 0; c < QM_NCLASS; c++)
        bytes += (size_t)__atomic_load_n(&tc->bin[c].count, __ATOMIC_RELAXED) * qm__class[c].size;
  qm_unlock(&registry_lock);
  return bytes;
}

size_t qm__life_threads(void) { return nthreads; }

#ifdef QM_TEST_HOOKS
size_t qm__life_spare_bytes(void) {
  qm_lock(&registry_lock);
  size_t bytes = spare_bytes;
  qm_unlock(&registry_lock);
  return bytes;
}
#endif

void qm__life_init(void) { key_ok = pthread_key_create(&exit_key, on_thread_exit) == 0; }

void qm__life_fork_prepare(void) { qm_fork_lock(&registry_lock); }
void qm__life_fork_parent(void) { qm_unlock(&registry_lock); }
unsigned qm__life_ids(void) { return next_id; }

/* Only the forking thread lives on in the child. The other threads' caches
 * may have been in mid-update when fork() copied them: their chunks are
 * abandoned rather than trusted, and their ids closed (the frees of the
 * chunks they owned take the closed path). The caller's own cache stays
 * registered. Then every free chunk it holds (bins, parked frees,
 * delayed-free rings) takes a fresh generation, hence a fresh canary, and
 * its bins a fresh order: what the parent's first mallocs would hand out,
 * and with which canary, tells nothing of a child's, nor one child's of
 * another's (the central lists are redrawn by the primary). */
void qm__life_fork_child(void) {
  bool live = qm__cache_live();
  qm_lock_reinit(&registry_lock);
  for (qm_tcache_t *tc = registry; tc; tc = tc->next)
    if (tc != self || !live)
      qm__state_orphan(tc->id);
  registry = live ? self : NULL;
  nthreads = registry ? 1 : 0;
  memset(group_live, 0, sizeof group_live);
  group_live[qm__cache_group()] = nthreads;
  if (registry)
    registry->next = registry->prev = NULL;
  /* the spares' chunks to the central lists (their locks are fresh), where
   * the primary's fork handler gives them fresh generations next */
  for (qm_tcache_t *tc = spares; tc; tc = tc->next) {
    qm__cache_give_saved(tc->slots, tc->held, tc->group);
    tc->held_bytes = 0;
  }
  spare_bytes = 0;
  qm__state_fork_settle();
  qm__small_pend_regen();
  qm__cache_reshuffle(qm__small_regen);
}
