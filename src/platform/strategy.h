/* strategy.h: what each quarantine strategy does to a range of pages, in one
 * place, used by the secondary for real chunks and by the probe tool and the
 * benchmarks to measure each strategy. A range is "retired" (inaccessible)
 * or "live" (RW); every function returns 0 or ENOMEM.
 */
#ifndef QM_STRATEGY_H
#define QM_STRATEGY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "qmalloc.h"

/* A chunk's mapping: guard pages around usable_len bytes that start at an
 * address aligned to align (a power of two, at least a page). */
typedef struct qm_range {
  uintptr_t base, usable; /* the mapping; its first usable byte */
  size_t span;            /* the mapping's length */
} qm_range_t;

/* Maps a fresh chunk whose only RW part is its first rw_len usable bytes;
 * the rest is guard (PROT_NONE, or guard markers for the guard strategy,
 * which keeps the mapping one VMA). thp > 0: ask for transparent huge pages;
 * thp < 0: refuse them (THP "always" gives them to any aligned 2 MiB). */
int qm__range_map(int strategy, size_t usable_len, size_t align, size_t rw_len, int thp,
                  qm_range_t *out);
/* RW -> inaccessible. *dropped says whether the pages went with it. */
int qm__range_retire(int strategy, void *p, size_t len, bool *dropped);
/* inaccessible -> RW. */
int qm__range_revive(int strategy, void *p, size_t len);
/* Drops the pages of a retired range; it stays inaccessible. */
int qm__range_drop(int strategy, void *p, size_t len);
/* How many VMAs a chunk's mapping holds at most: live or retired. */
unsigned qm__range_vmas(int strategy, bool live);

#endif
