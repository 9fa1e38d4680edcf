/* cache.h: per-thread caches of small chunks. A thread's qm__tc starts at a
 * static empty cache whose bins have no room, so its first malloc and first
 * free take the slow path, which creates the real cache. Only the owning
 * thread touches a cache's bins: no lock, no atomic.
 */
#ifndef QM_CACHE_H
#define QM_CACHE_H

#include <stdint.h>

#include "primary.h"
#include "qm.h"

typedef struct qm_bin {
  uint32_t count, max;
  uintptr_t *slot; /* chunk addresses, slot[count-1] is the next handed out */
} qm_bin_t;

typedef struct qm_tcache {
  qm_bin_t bin[QM_NCLASS];
  struct qm_tcache *next, *prev; /* the registry of live caches */
  int state;                     /* QM_TC_* */
} qm_tcache_t;

enum { QM_TC_EMPTY, QM_TC_LIVE, QM_TC_DEAD };

extern __thread qm_tcache_t *qm__tc __attribute__((tls_model("initial-exec")));

/* The slow paths: take one chunk of class c (refilling the cache), or give
 * one back (draining it). take returns 0 when the class is exhausted. */
uintptr_t qm__cache_take_slow(unsigned c);
void qm__cache_give_slow(uintptr_t chunk, unsigned c);
/* Empties the calling thread's cache into the central lists. */
void qm__cache_flush_self(void);
/* Sum of chunks held by all thread caches, in bytes (racy: for stats). */
size_t qm__cache_held_bytes(void);
size_t qm__cache_threads(void);

void qm__cache_init(void); /* the thread-exit key; after the primary */
void qm__cache_fork_prepare(void);
void qm__cache_fork_parent(void);
void qm__cache_fork_child(void);

#endif
