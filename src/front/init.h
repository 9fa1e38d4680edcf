/* init.h: lazy, allocation-free process initialisation. qm__small_limit
 * (primary.h) is 0 until init is done, so every request takes a slow path
 * that calls qm__init() first; after that it is the large threshold in
 * bytes.
 */
#ifndef QM_INIT_H
#define QM_INIT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

void qm__init_slow(void);
extern __attribute__((visibility("hidden"))) int qm__init_done;

static inline void qm__init(void) {
  if (__builtin_expect(!__atomic_load_n(&qm__init_done, __ATOMIC_ACQUIRE), 0))
    qm__init_slow();
}

#ifdef QM_TEST_HOOKS
/* Test hook: called in fork's prepare handler once it holds every lock,
 * as a signal handler that landed there would run. */
extern void (*qm__fork_hook)(void);
#endif

/* While the options are read: requests go to the bootstrap arena. */
extern __attribute__((visibility("hidden"))) int qm__booting;
static inline bool qm__init_bootstrapping(void) {
  return __builtin_expect(__atomic_load_n(&qm__booting, __ATOMIC_RELAXED), 0);
}

#endif
