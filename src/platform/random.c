/* random.c: the seeds of every random stream (random.h), and the fork
 * epoch that makes a child seed each qm_rng_t afresh. The epoch is plain
 * writable data on purpose: a write to it only makes streams reseed.
 */
#include "random.h"

#include <errno.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

/* Bumped in a fork child; a qm_rng_t whose epoch differs seeds itself. It
 * starts at 1 so that a zero-initialised qm_rng_t is stale. */
static _Atomic uint64_t epoch = 1;
static _Atomic uint64_t fallbacks;

/* splitmix64's finaliser: spreads the fallback's weak inputs over 64 bits */
static uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t qm_random_u64(void) {
  uint64_t s = 0;
  int saved = errno;
  if (getrandom(&s, sizeof s, GRND_NONBLOCK) != sizeof s) {
    /* the 16 AT_RANDOM bytes sit on the stack after the platform string,
     * at no particular alignment: copied, not loaded as uint64_t. They are
     * the same in a fork child: the pid, the clock and the counter are not */
    const void *at = (const void *)getauxval(AT_RANDOM);
    uint64_t r[2] = {0, 0};
    if (at)
      memcpy(r, at, sizeof r);
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t n = atomic_fetch_add_explicit(&fallbacks, 1, memory_order_relaxed);
    s = mix(r[0] ^ mix(r[1] ^ mix((uint64_t)getpid() ^
                                  mix((uint64_t)ts.tv_nsec ^ (uint64_t)ts.tv_sec << 32 ^
                                      mix((uintptr_t)&s ^ n)))));
  }
  errno = saved;
  return s;
}

void qm_rand_thread_seed(void) { qm__rng = qm_random_u64(); }

uint64_t qm_rng_next(qm_rng_t *r) {
  uint64_t e = atomic_load_explicit(&epoch, memory_order_relaxed);
  if (QM_UNLIKELY(r->epoch != e)) {
    r->state = qm_random_u64();
    r->epoch = e;
  }
  return qm_wyrand(&r->state);
}

uint32_t qm_rng_below(qm_rng_t *r, uint32_t n) {
  return (uint32_t)(((qm_rng_next(r) >> 32) * n) >> 32);
}

void qm__random_fork_child(void) {
  atomic_fetch_add_explicit(&epoch, 1, memory_order_relaxed);
  qm_rand_thread_seed();
}
