/* life.h: the thread life cycle of the small side (life.c): a thread's
 * cache made on first need, registered, retired at thread exit, and what a
 * fork child keeps of them.
 */
#ifndef QM_LIFE_H
#define QM_LIFE_H

#include <stdbool.h>
#include <stddef.h>

/* Makes the calling thread's cache and owner id (id `want` if an exited
 * thread left it, 0: any); false where it gets none. Reached through
 * qm__small_up (up.h). */
bool qm__life_cache_create(unsigned want);
/* Empties the calling thread's cache into the central lists. */
void qm__life_flush_self(void);
/* The chunks exited threads' registrations kept, given to the central
 * lists (malloc_trim). */
void qm__life_release_spares(void);
/* Sum of chunks held by all thread caches, in bytes (racy: for stats). */
size_t qm__life_held_bytes(void);
size_t qm__life_threads(void);
#ifdef QM_TEST_HOOKS
/* Test hook: the bytes the spares' bins hold. */
size_t qm__life_spare_bytes(void);
/* Test hook: called in the making of a thread's cache, as a signal
 * handler that interrupted it would run. */
extern void (*qm__life_making_hook)(void);
#endif

void qm__life_init(void); /* the thread-exit key; after the primary */
void qm__life_fork_prepare(void);
/* Owner ids given out so far, 1..qm__life_ids()-1 (read under fork's
 * hold of the registry lock). */
unsigned qm__life_ids(void);
void qm__life_fork_parent(void);
void qm__life_fork_child(void);

#endif
