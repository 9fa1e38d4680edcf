/* random.h: every random stream of the library, one generator (wyrand: one
 * multiply, passes BigCrush) and one source of seeds (getrandom). Two kinds
 * of stream: the calling thread's (TLS, inline: the free fast path draws
 * from it) and a qm_rng_t owned by a structure and drawn under its lock.
 * Every stream is seeded from fresh kernel bytes, never from another
 * stream, and seeded afresh in a fork child: the forking thread's at once
 * (qm__random_fork_child), a qm_rng_t at its next draw (its epoch is stale).
 * Keys fixed at init from the secret (class keys, guard words) are not
 * streams: live chunks carry them, so a child keeps its parent's.
 */
#ifndef QM_RANDOM_H
#define QM_RANDOM_H

#include <stdint.h>

#include "qm.h"
#include "thread.h"

/* One wyrand step of the state at s. */
QM_INLINE uint64_t qm_wyrand(uint64_t *s) {
  uint64_t x = *s += 0xa0761d6478bd642full;
  unsigned __int128 t = (unsigned __int128)x * (x ^ 0xe7037ed1a0b428dbull);
  return (uint64_t)(t >> 64) ^ (uint64_t)t;
}

/* The calling thread's stream: which slot a freed chunk takes in its bin,
 * which one a take hands out, the order carved chunks are handed out in,
 * the sampling countdown. Seeded by qm_rand_thread_seed before the thread's
 * cache is made or its first sampling draw. */
/* qm__rng, in thread.h */
QM_INLINE uint64_t qm_rand(void) { return qm_wyrand(&qm__rng); }
/* A draw below n (n > 0), by multiply-high: no division. */
QM_INLINE uint32_t qm_rand_below(uint32_t n) {
  return (uint32_t)(((uint64_t)(uint32_t)qm_rand() * n) >> 32);
}
/* Seeds the calling thread's stream from fresh bytes (a syscall). */
void qm_rand_thread_seed(void);
/* For slow paths a thread may reach before its cache is made. */
QM_INLINE void qm_rand_thread_ready(void) {
  if (QM_UNLIKELY(!qm__rng))
    qm_rand_thread_seed();
}

/* A stream drawn under its owner's lock. Zero-initialised is valid: it
 * seeds itself at its first draw, and again at the first after a fork. */
typedef struct qm_rng {
  uint64_t state, epoch;
} qm_rng_t;
uint64_t qm_rng_next(qm_rng_t *r);
/* Uniform in [0, n), n > 0. */
uint32_t qm_rng_below(qm_rng_t *r, uint32_t n);

/* 64 fresh bits from the kernel; where getrandom fails (before 3.17, or no
 * entropy yet at boot) the AT_RANDOM bytes mixed with the pid, the clock,
 * addresses and a counter. Never blocks, keeps errno. */
uint64_t qm_random_u64(void);

/* In a fork child, from the atfork handler, before anything else draws. */
void qm__random_fork_child(void);

/* The per-process secret, odd once set (early in init): keys the small
 * chunks' checksums and seeds the large chunks' reuse choice. */
extern QM_HIDDEN uint64_t qm__secret;

#endif
