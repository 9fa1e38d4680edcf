/* primary_state.h: the primary's central state, shared by its files and no
 * other: the per-class central lists (central_t: the free sets' bitmaps,
 * the carved end, the limbo), which primary.c sets up and commits, and
 * primary_central.c takes from, gives to and delays frees in. Each class's
 * entry is under its own lock.
 */
#ifndef QM_PRIMARY_STATE_H
#define QM_PRIMARY_STATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "age.h"
#include "lock.h"
#include "options.h"
#include "os.h"
#include "primary.h"

/* The free sets' bitmaps: three levels, each level's words of the
 * QM_GROUPS groups in turns of BLOCK words (a 4 KiB page), so that a
 * group's bits take pages of their own (all side by side, 4 groups took 4
 * times the memory) and each level is committed as one range. Bit i of level 0 is chunk slot i; bit
 * j of level 1 says level-0 word j is not zero; bit k of level 2 says level-1 word k is not zero. A
 * take finds the lowest free chunks through levels 2 and 1 in a few loads however sparse the set
 * is (a refill starts at a random one of the lowest: WINDOW). Free chunk addresses in batches of 64
 * (8 bytes a chunk) had cost python3 2.5 MB at its exit, when all its 64-byte objects were freed at
 * once (peak RSS 34.9 MiB against jemalloc's 29.4); a bit a chunk costs 1/64 of that. */
#define LEVELS 3
#define BLOCK 512

typedef struct central {
  qm_lock_t lock;
  /* one free set per group of threads: a thread's cache gives to and takes
   * from its own group's first, so while few, the chunks one thread gave
   * back go back to it or to threads of its group, not to any thread.
   * Chunks that two threads hand back and forth end up side by side in the
   * same cache lines, each thread's stores pulling those lines from the
   * other's core: small churn with 2 threads ran at half the speed of 2
   * one-thread processes. */
  uint64_t *lev[LEVELS];      /* the bitmaps (NULL until init) */
  size_t lcom[LEVELS];        /* bytes of each level committed */
  size_t nfree_of[QM_GROUPS]; /* chunks in each group's set */
  size_t top[QM_GROUPS];      /* each group's lowest level-2 word that may be non-zero */
  size_t end[QM_GROUPS];      /* one past each group's highest that ever was */
  size_t carved;              /* bytes carved from the region start */
  size_t dead;                /* of them, in dead slots (over a guard page) */
  size_t given_since_purge;
  uint64_t last_purge_ns;
  size_t purged_bytes, purges;
  /* the address space of the region, its table and its bitmaps' levels,
   * claimed as qm__primary_commit reaches it */
  qm_os_grow_t rgrow, tgrow, lgrow[LEVELS];
  /* Delayed free (free_delay = D > 0): chunks freed where no thread's ring
   * can age them (its thread exited, the id was closed, the thread has no
   * cache) wait here, stamped on the class's clock: the mallocs of threads
   * without a cache, each counted under this lock as it takes its chunk.
   * A thread with a cache adopts them into its ring at a refill, with the
   * age they have (qm__central_adopt); a take without one releases those
   * older than D into the free set. Either way a chunk waits D mallocs.
   * limbo_cap(c) entries (NULL while D is 0). */
  qm_aged_t *limbo;
  qm_age_t lq;
  uint32_t clock;
  _Atomic uint32_t held; /* lq.n, stored under the lock, read without it */
} __attribute__((aligned(64))) central_t;

extern struct central *qm__central;
/* the central lists until init (primary.c) */
extern QM_HIDDEN central_t qm__central_none[QM_NCLASS];
#define central (qm__central ? qm__central : qm__central_none)

static inline size_t qm_chunk_size_of(unsigned c) {
  if (c < 16)
    return (c + 1) * 16;
  unsigned k = c - 16, l = 8 + k / 4;
  return ((size_t)1 << l) + ((size_t)(k % 4 + 1) << (l - 2));
}

/* Words of one group's bitmap at level l for `slots` chunk slots. */
static inline size_t qm_lev_words(unsigned l, size_t slots) {
  size_t w = slots;
  for (unsigned k = 0; k <= l; k++)
    w = (w + 63) / 64;
  return w;
}

/* As a thread's delayed-free ring: 2D entries, at most QM_DELAY_BYTES of
 * chunks. From the sealed options and class sizes, not stored: a writable
 * cap would let corruption index past the array. */
static inline uint32_t qm_limbo_cap(unsigned c) {
  size_t cap = 2 * (size_t)qm__opt.free_delay, fit = QM_DELAY_BYTES / qm_chunk_size_of(c);
  return (uint32_t)(cap < fit ? cap : fit ? fit : 1);
}

/* Chunks held in all groups' sets. Called with the class lock held. */
static inline size_t qm_central_nfree(const central_t *cl) {
  size_t n = 0;
  for (unsigned g = 0; g < QM_GROUPS; g++)
    n += cl->nfree_of[g];
  return n;
}

/* The groups whose sets are not empty, bit g for group g: only their
 * bitmaps are read (a read of another's would map its pages). */
static inline unsigned qm_groups_used(const central_t *cl) {
  unsigned m = 0;
  for (unsigned g = 0; g < QM_GROUPS; g++)
    m |= (cl->nfree_of[g] != 0) << g;
  return m;
}

/* Makes [0, upto) of region c RW, but for its guard pages; false if the
 * kernel refused (primary.c). Called with the class lock held. */
bool qm__primary_commit(unsigned c, size_t upto);

#endif
