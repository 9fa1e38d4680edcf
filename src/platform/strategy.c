/* strategy.c: the retire / revive / drop primitives of each strategy.
 * protect keeps pages (cheap reuse where mprotect(RW) restores write access
 * without faults, Linux 6.0+ commit 64fe24a3e05e); discard (mprotect NONE,
 * then MADV_DONTNEED) and guard drop them (no memory held, a zero-fill
 * fault per page touched on reuse); none leaves the chunk RW. unmap retires
 * only the tail of a chunk shrunk in place: the secondary unmaps the rest.
 */
#include "strategy.h"

#include <errno.h>

#include "os.h"
#include "qm.h"

int qm__range_map(int strategy, size_t usable_len, size_t align, size_t rw_len, int thp,
                  qm_range_t *out) {
  size_t pg = qm__page;
  if (align < pg)
    align = pg;
  /* over-map by the alignment and keep the slack as guard: no trimming */
  size_t span = usable_len + 2 * pg + (align - pg);
  if (span < usable_len)
    return ENOMEM;
  void *p;
  bool guard = strategy == QM_STRATEGY_GUARD;
  int err = qm_os_map(span, 0, guard ? QM_PROT_RW : QM_PROT_NONE, &p);
  if (err)
    return err;
  uintptr_t base = (uintptr_t)p, usable = qm_align_up(base + pg, align);
  /* before the mprotect below splits it: one flag for the whole mapping */
  if (thp > 0)
    qm_os_hugepage(p, span);
  else if (thp < 0)
    qm_os_nohugepage(p, span);
  if (guard) {
    /* markers on both sides of the RW part; no VMA split (Linux 6.13) */
    err = qm_os_guard_install(p, usable - base);
    if (!err)
      err = qm_os_guard_install((void *)(usable + rw_len), base + span - usable - rw_len);
  } else {
    err = qm_os_protect((void *)usable, rw_len, QM_PROT_NONE, QM_PROT_RW);
  }
  if (err) {
    qm_os_unmap(p, span);
    return err == EINVAL ? ENOMEM : err;
  }
  *out = (qm_range_t){.base = base, .usable = usable, .span = span};
  return 0;
}

int qm__range_retire(int strategy, void *p, size_t len, bool *dropped) {
  *dropped = false;
  switch (strategy) {
  case QM_STRATEGY_NONE:
    return 0; /* quarantine off: nothing is made inaccessible */
  case QM_STRATEGY_DISCARD: {
    /* protect first, then drop: no window where a dangling write refaults a
     * page, and unlike a MAP_FIXED replacement neither call can fail
     * halfway with the range partly unmapped (and then taken by someone) */
    int err = qm_os_protect(p, len, QM_PROT_RW, QM_PROT_NONE);
    if (!err)
      err = qm_os_dontneed(p, len, QM_PROT_NONE);
    *dropped = !err && len;
    return err;
  }
  case QM_STRATEGY_GUARD:
    *dropped = len != 0;
    return qm_os_guard_install(p, len) ? ENOMEM : 0;
  default: /* protect; unmap, for the tail of a chunk shrunk in place */
    return qm_os_protect(p, len, QM_PROT_RW, QM_PROT_NONE);
  }
}

/* Every strategy but guard keeps inaccessible pages PROT_NONE: the tail
 * of a chunk's capacity past its RW part, under none and unmap too. */
int qm__range_revive(int strategy, void *p, size_t len) {
  if (strategy == QM_STRATEGY_GUARD)
    return qm_os_guard_remove(p, len) ? ENOMEM : 0;
  return qm_os_protect(p, len, QM_PROT_NONE, QM_PROT_RW);
}

int qm__range_drop(int strategy, void *p, size_t len) {
  switch (strategy) {
  case QM_STRATEGY_PROTECT:
    return qm_os_dontneed(p, len, QM_PROT_NONE);
  case QM_STRATEGY_NONE: /* nothing was made inaccessible */
    return qm_os_dontneed(p, len, QM_PROT_RW);
  default:
    return 0; /* discard and guard dropped the pages when they retired */
  }
}

unsigned qm__range_vmas(int strategy, bool live) {
  (void)live;
  /* guard markers split nothing. Otherwise guard | RW | rest-and-guard while
   * live, and still three once retired: the range keeps VM_ACCOUNT (set
   * when it was made writable) and so never merges with its never-writable
   * guards. Adjacent chunks' guards may merge: an upper bound. */
  return strategy == QM_STRATEGY_GUARD ? 1 : 3;
}
