/* lock.h: the one lock type. A pthread mutex: it never allocates and works
 * before libc's start-up finished. Adaptive: a waiter spins briefly before it
 * parks in the kernel, since every critical section here is short and a
 * futex round trip costs microseconds on a VM. Each lock's place in the fork
 * order is written in init.c.
 */
#ifndef QM_LOCK_H
#define QM_LOCK_H

#include <pthread.h>

typedef pthread_mutex_t qm_lock_t;
#define QM_LOCK_INIT PTHREAD_ADAPTIVE_MUTEX_INITIALIZER_NP

static inline void qm_lock(qm_lock_t *l) { pthread_mutex_lock(l); }
static inline void qm_unlock(qm_lock_t *l) { pthread_mutex_unlock(l); }
/* In a fork child: the lock may have been held by a thread that no longer
 * exists; start it afresh. */
static inline void qm_lock_reinit(qm_lock_t *l) {
  pthread_mutexattr_t a;
  pthread_mutexattr_init(&a);
  pthread_mutexattr_settype(&a, PTHREAD_MUTEX_ADAPTIVE_NP);
  pthread_mutex_init(l, &a);
  pthread_mutexattr_destroy(&a);
}

#endif
