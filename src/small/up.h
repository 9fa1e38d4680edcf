/* up.h: what the small side asks of the layers above it (the malloc
 * family, the thread life cycle) and its local state machine of the
 * cross-thread one, through sealed pointers wired in sealed.c: called on
 * slow paths only and never by name, so that no file of the small side
 * depends on one above it.
 */
#ifndef QM_UP_H
#define QM_UP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "qm.h"

typedef struct qm_small_up {
  /* checked mode's malloc, past its fast path (alloc.c) */
  void *(*malloc_slow)(size_t n);
  /* a free re-entered from a signal handler whose pointer is outside the
   * primary, applied when the interrupted call is done, under the mark
   * of the pointer (alloc.c: qm__free_outside) */
  void (*free_other)(void *p);
  /* a free that is not this thread's own chunk freed whole (another
   * thread's, an over-aligned one's, or an error to report): handed by
   * the local state machine (smallstate.c) to the cross-thread one
   * (inbox.c: qm__small_free_general) */
  void (*free_general)(void *p, uintptr_t off);
  /* the calling thread's cache and owner id, made on its first need; id
   * `want` if an exited thread left it (0: any); false where it gets none
   * (life.c) */
  bool (*cache_create)(unsigned want);
} qm_small_up_t;
extern QM_HIDDEN qm_small_up_t qm__small_up;

#endif
