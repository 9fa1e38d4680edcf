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

/* A fresh mapping of span bytes whose only RW part is [rw_off, rw_off +
 * rw_len); everything else is guard (PROT_NONE, or guard markers for the
 * guard strategy, which keeps the whole mapping one VMA). */
int qm__range_map(int strategy, size_t span, size_t align, size_t rw_off, size_t rw_len,
                  uintptr_t *base);
/* RW -> inaccessible. *dropped says whether the pages went with it. */
int qm__range_retire(int strategy, void *p, size_t len, bool *dropped);
/* inaccessible -> RW. */
int qm__range_revive(int strategy, void *p, size_t len);
/* Drops the pages of a retired range; it stays inaccessible. */
int qm__range_drop(int strategy, void *p, size_t len);
/* How many VMAs a mapping holds: live (some RW pages) or retired. */
unsigned qm__range_vmas(int strategy, bool live);

#endif
