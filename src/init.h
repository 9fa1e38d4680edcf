/* init.h: lazy, allocation-free process initialisation. qm__small_limit is
 * 0 until init is done, so every request takes a slow path that calls
 * qm__init() first; after that it is the large threshold in bytes.
 */
#ifndef QM_INIT_H
#define QM_INIT_H

#include <stddef.h>

extern size_t qm__small_limit;
void qm__init_slow(void);
extern int qm__init_done;

static inline void qm__init(void) {
  if (__builtin_expect(!__atomic_load_n(&qm__init_done, __ATOMIC_ACQUIRE), 0))
    qm__init_slow();
}

#endif
