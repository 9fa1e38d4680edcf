/* large_free.c: a live chunk given back: the lookup that reports any
 * pointer that is not a live chunk's, and the chunk's way into the
 * quarantine (its pages closed, kept, dropped or moved to the belt's
 * mirror) or straight out (unmapped, or buried on the belt).
 */
#include "secondary.h"

#include "describe.h"
#include "os.h"
#include "secondary_int.h"

/* Looks up a pointer about to be freed or resized; reports anything that is
 * not a live chunk's user pointer. Returns with S.lock held. */
uint32_t qm__sec_find_live_locked(void *p, qm_op_t op) {
  qm_lock(&S.lock);
  uint32_t i = qm__tab_find((uintptr_t)p);
  if (i == NIL) {
    qm_unlock(&S.lock);
    qm__report_bad_pointer(op, p);
  }
  if (B(i)->chunk.state != B_LIVE) {
    size_t size = B(i)->chunk.size;
    qm_unlock(&S.lock);
    qm__report_freed(op, p, QM_CK_LARGE, size);
  }
  return i;
}

/* Whether a chunk just freed goes straight to munmap rather than into the
 * quarantine (under S.lock): strategy unmap, no quarantine, a never-reused
 * chunk with the quarantine off, or the mapping budget reached. The last
 * gives up the window (counted; the caller warns), in the default profile
 * only: under hardening=max the chunk goes in over the budget, and the
 * aged chunks go first. */
bool qm__sec_unmap_on_free(const block_t *b) {
  bool none = LF.strategy == QM_STRATEGY_NONE;
  if (LF.strategy == QM_STRATEGY_UNMAP || !qm__opt.quarantine_max_chunks ||
      (none && b->chunk.flags & F_NOREUSE))
    return true;
  if (qm__rec_maps() - b->rec.vmas + qm__range_vmas(LF.strategy, none) <= LF.map_budget)
    return false;
  if (none || (b->chunk.flags & F_BELT))
    return true; /* no window to give up: a belt chunk is buried, its range kept */
  if (qm__opt.hardening == QM_HARDENING_MAX)
    return false;
  qm__q_window_broken();
  return true;
}

/* The range of BUSY belt chunk b, RW on its first len bytes, made
 * inaccessible for good: mapped afresh (its pages gone), or at the mapping
 * cap mprotect(NONE) of the RW part (one mapping already: no split), which
 * is then mapped afresh once dead. Returns whether it was mapped afresh. */
static bool close_range(const block_t *b, size_t len) {
  if (!qm__belt_clean(b->map.base, b->map.span))
    return true;
  int err = qm_os_protect((void *)b->map.usable, len, QM_PROT_RW, QM_PROT_NONE);
  if (err) /* a freed chunk left open: never */
    qm__report_os_failure("mprotect", (void *)b->map.usable, len, err);
  return false;
}

/* A BUSY chunk that left the user, its range retired (dropped: its pages
 * gone), goes into the quarantine (under S.lock); returns whether the
 * caller must qm__sec_enforce_all(). Inaccessible there but under strategy none;
 * the windows of the quarantine and of the belt count from now. */
static bool enter_locked(uint32_t i, bool dropped) {
  block_t *b = B(i);
  if (dropped)
    b->map.dirty = 0;
  if (LF.strategy != QM_STRATEGY_NONE)
    b->map.rw = 0;
  b->chunk.seq = qm__rec_frees();
  b->chunk.state = B_QUAR;
  return qm__q_over_maps(qm__q_enter(i));
}

/* belt_way=move: the pages of a BUSY belt chunk that left the user move to
 * its place in the belt's mirror, RW as they are (mremap with
 * MREMAP_DONTUNMAP), and its own range, left empty, is mapped afresh
 * PROT_NONE (it merges back into the belt): a dangling pointer faults at
 * once, as under protect, and the record keeps its address for reports. At
 * reuse the pages move on with their write bits: no mprotect and no fault
 * on any kernel (move_reuse, large_alloc.c). Mapping the range afresh rather than
 * mprotect(NONE) of the emptied range: as cheap (6.18, 128 KiB: 0.55-0.65
 * ms a free either way on this VM, which shadows page tables), and the
 * range merges back into the belt at once on every kernel, where an
 * mprotect'd one keeps VM_ACCOUNT on some and stays a mapping of its own.
 * Pages past the RW part (a misfit's or a shrink's tail, PROT_NONE) are
 * opened again first, so that the kernel merges them back into the RW
 * mapping they were split from and all move in one piece: the chunk keeps
 * its resident pages as under protect (dropping them took large churn
 * from 0.4 to 4.5 faults/op at W=8, the pool's chunks shrinking to their
 * last request). Without the mprotect fast path those pages take a write
 * fault when next written. Returns false where the pages cannot move: the
 * caller buries the chunk. */
static bool pool_block(uint32_t i) {
  block_t *b = B(i);
  size_t pages = b->map.rw;
  if (!pages || ((b->chunk.flags & F_SPLIT) && !qm_os_move_spans_vmas()))
    return false;
  if (b->map.dirty > b->map.rw &&
      !qm_os_protect((void *)(b->map.usable + (b->map.rw << qm__page_shift)),
                     (b->map.dirty - b->map.rw) << qm__page_shift, QM_PROT_NONE, QM_PROT_RW))
    pages = b->map.dirty;
  size_t len = pages << qm__page_shift;
  int err = qm_os_move((void *)b->map.usable, len, (void *)qm__belt_shadow(b->map.usable), true);
  if (err == EINVAL) { /* before Linux 5.7: no belt from now on */
    qm_lock(&S.lock);
    L.no_dontunmap = true;
    qm_unlock(&S.lock);
    return false;
  }
  if (err) {
    /* the kernel may have unmapped the chunk's place in the mirror before
     * failing: the range is left as it is and never given back to the
     * belt, so that nothing of qmalloc's goes there again (see
     * move_reuse in large_alloc.c); its pages are dropped */
    close_range(b, len);
    qm_lock(&S.lock);
    qm__sec_entomb_locked(i);
    qm_unlock(&S.lock);
    return true;
  }
  uint8_t pool = close_range(b, len) ? P_POOLED | P_CLEAN : P_POOLED;
  qm_lock(&S.lock);
  b->chunk.pool = pool;
  b->map.dirty = pages;
  L.belt_pooled++;
  bool over = enter_locked(i, false);
  qm_unlock(&S.lock);
  if (over)
    qm__sec_enforce_all(0);
  return true;
}

/* Moves a BUSY chunk that left the user into the quarantine (or unmaps it
 * where the quarantine cannot hold it). */
void qm__sec_retire_block(uint32_t i, bool unmap_now) {
  block_t *b = B(i);
  if (!unmap_now && (b->chunk.flags & F_BELT) && LF.belt_way == QM_BELT_MOVE) {
    if (!pool_block(i))
      qm__sec_bury(i);
    return;
  }
  if (!unmap_now) {
    int strat = LF.strategy;
    if (b->chunk.flags & F_NOREUSE && strat == QM_STRATEGY_PROTECT)
      strat = QM_STRATEGY_DISCARD; /* never reused: holding its pages is waste */
    bool dropped;
    if (qm__range_retire(strat, (void *)b->map.usable, b->map.rw << qm__page_shift, &dropped)) {
      qm__sec_discard_block(i);
      return;
    }
    qm_lock(&S.lock);
    bool over = enter_locked(i, dropped);
    qm_unlock(&S.lock);
    if (over)
      qm__sec_enforce_all(0);
    return;
  }
  qm__sec_discard_block(i);
}

void qm__large_free(void *p) {
  if (!atomic_load_explicit(&S.ready, memory_order_acquire))
    qm__report_bad_pointer(QM_OP_FREE, p);
  trace_t t;
  trace_capture(&t);
  uint32_t i = qm__sec_find_live_locked(p, QM_OP_FREE);
  block_t *b = B(i);
  b->chunk.state = B_BUSY;
  qm_mark_released((uintptr_t)p);
  b->chunk.flags |= F_FREED;
  tail_sub(b);
  b->chunk.odo = qm__belt_odometer();
  b->chunk.seq = qm__note_free(i, &t);
  L.live--;
  live_bytes(0, b->chunk.size);
  bool none = LF.strategy == QM_STRATEGY_NONE, unmap_now = qm__sec_unmap_on_free(b);
  if (none && !unmap_now) { /* nothing to retire: straight in, one lock */
    bool over = enter_locked(i, false);
    qm_unlock(&S.lock);
    if (over)
      qm__sec_enforce_all(0);
    return;
  }
  qm_unlock(&S.lock);
  qm__sec_note_density(b); /* BUSY: its pages are still where the user had them */
  qm__sec_retire_block(i, unmap_now);
  if (unmap_now)
    qm__q_breach_warn();
}

size_t qm__large_usable(void *p, qm_op_t op) {
  if (!atomic_load_explicit(&S.ready, memory_order_acquire))
    qm__report_bad_pointer(op, p);
  uint32_t i = qm__sec_find_live_locked(p, op);
  size_t n = (B(i)->map.rw - B(i)->map.lead) << qm__page_shift;
  qm_unlock(&S.lock);
  return n;
}

size_t qm__large_size(void *p, qm_op_t op) {
  size_t align;
  return qm__large_held(p, op, &align);
}

size_t qm__large_held(void *p, qm_op_t op, size_t *align) {
  if (!atomic_load_explicit(&S.ready, memory_order_acquire))
    qm__report_bad_pointer(op, p);
  uint32_t i = qm__sec_find_live_locked(p, op);
  size_t n = B(i)->chunk.size;
  *align = B(i)->chunk.ashift ? (size_t)1 << B(i)->chunk.ashift : QM_MIN_ALIGN;
  qm_unlock(&S.lock);
  return n;
}
