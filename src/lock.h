/* lock.h: the one lock type. A pthread mutex: it never allocates, works
 * before libc's start-up finished, and parks waiters in the kernel instead of
 * spinning on a two-core VM. Each lock's place in the fork order is written
 * in init.c.
 */
#ifndef QM_LOCK_H
#define QM_LOCK_H

#include <pthread.h>

typedef pthread_mutex_t qm_lock_t;
#define QM_LOCK_INIT PTHREAD_MUTEX_INITIALIZER

static inline void qm_lock(qm_lock_t *l) { pthread_mutex_lock(l); }
static inline void qm_unlock(qm_lock_t *l) { pthread_mutex_unlock(l); }
/* In a fork child: the lock may have been held by a thread that no longer
 * exists; start it afresh. */
static inline void qm_lock_reinit(qm_lock_t *l) { pthread_mutex_init(l, NULL); }

#endif
