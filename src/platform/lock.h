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

#ifdef QM_TEST_HOOKS
/* Test builds note each lock taken by a thread not marked busy (thread.h's
 * freeing word clear): a signal handler's free landing there is applied at
 * once and may need that very lock. The tests hold the API's calls to none
 * (smallstate.c keeps the count and the first place). */
void qm__lock_note(const char *file, int line);
static inline void qm_lock_at(qm_lock_t *l, const char *file, int line) {
  qm__lock_note(file, line);
  pthread_mutex_lock(l);
}
#define qm_lock(l) qm_lock_at(l, __FILE__, __LINE__)
#else
static inline void qm_lock(qm_lock_t *l) { pthread_mutex_lock(l); }
#endif
static inline void qm_unlock(qm_lock_t *l) { pthread_mutex_unlock(l); }
/* Fork's prepare handler takes every lock through qm_fork_lock. In a
 * process with one thread it first makes a dry run (qm__fork_dry set): each
 * lock is tried and let go, and one found held (qm__fork_held set) can only
 * be held by a call of this very thread that a signal handler interrupted
 * to fork. Taking it would wait forever; the handlers then take nothing and
 * leave the state as it is, for the interrupted call to finish in parent
 * and child alike (init.c). Both are written only by the forking thread
 * while no other can take a lock. */
extern __attribute__((visibility("hidden"))) _Bool qm__fork_dry, qm__fork_held;
static inline void qm_fork_lock(qm_lock_t *l) {
  if (!qm__fork_dry)
    pthread_mutex_lock(l);
  else if (pthread_mutex_trylock(l))
    qm__fork_held = 1;
  else
    pthread_mutex_unlock(l);
}
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
