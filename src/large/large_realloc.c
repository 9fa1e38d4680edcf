/* large_realloc.c: a live chunk resized: in place within its capacity
 * (pages opened or closed), else by moving its pages to a larger range
 * (no copy), else by a copy; the old chunk then leaves as a free does.
 */
#include "secondary.h"

#include <string.h>

#include "os.h"
#include "secondary_int.h"

/* The pages a realloc opens, `n` from usable, in a chunk of cap pages
 * there: in one that gets THP, up to a huge-page boundary (within cap),
 * so that what is opened covers whole aligned huge pages. The kernel gives
 * a huge page at a fault only where the aligned 2 MiB lie in one mapping
 * that asks for them and hold no page yet, so opening a buffer's growth
 * page by page gave it 4 KiB pages for good (a buffer grown in 4 KiB
 * steps from 2 to 8 MiB took 1536 faults; now 3, and no PMD is split by a
 * guard). The slack is the chunk's own, as a THP chunk's extent is
 * (extent() in large_alloc.c). */
static size_t grow_extent(size_t n, size_t cap, uintptr_t usable) {
  size_t hp = LF.thp_size >> qm__page_shift;
  if (!hp || !want_thp(cap) || (usable & (LF.thp_size - 1)))
    return n;
  size_t whole = (n + hp - 1) / hp * hp;
  return whole < cap ? whole : cap;
}

/* Grows by moving the page tables, not the bytes: the pages go to a new,
 * larger reservation with mremap(MREMAP_DONTUNMAP), so nothing refaults, and
 * the old range stays mapped (empty) to be quarantined like any freed chunk,
 * so the stale pointer faults. Returns the new chunk, or NULL to copy. */
static void *move_grow(uint32_t old, size_t size, size_t need, const trace_t *t) {
  block_t *o = B(old);
  size_t cap = pclass_pages(pclass(need * 2));
  if (cap < need || L.no_dontunmap || !o->map.rw)
    return NULL;
  /* a chunk of several VMAs moves in one mremap() only on kernels that allow
   * it; elsewhere (5.10, 5.15) that mremap() fails, so it is copied */
  if ((o->chunk.flags & F_SPLIT) && !qm_os_move_spans_vmas())
    return NULL;
  /* the record first: once the pages have moved, the way back could fail */
  qm_lock(&S.lock);
  uint32_t i = qm__tab_reserve() ? qm__rec_alloc() : NIL;
  if (i != NIL)
    B(i)->chunk.state = B_BUSY;
  qm_unlock(&S.lock);
  if (i == NIL)
    return NULL;
  bool huge = want_thp(cap);
  bool noreuse = cap << qm__page_shift >= qm__opt.unmap_threshold_mb << 20;
  qm_range_t r;
  bool belt = false, off_belt = use_belt(cap, noreuse);
  if (off_belt) { /* the new range from the belt, with its own record */
    qm_lock(&S.lock);
    uint32_t k = qm__sec_carve_locked(cap, huge ? LF.thp_size : 0, &r);
    if (k != NIL) {
      qm__rec_free(i);
      i = k;
      belt = true;
    } else if (!may_leave_window()) {
      qm__rec_free(i);
      qm_unlock(&S.lock);
      return NULL;
    }
    qm_unlock(&S.lock);
  }
  int err = 0;
  if (!belt) {
    err = qm__range_map(LF.strategy, cap << qm__page_shift, huge ? LF.thp_size : 0, 0,
                        thp_advice(cap), &r);
  }
  bool mapped = !belt && !err;
  if (!err)
    need = grow_extent(need, cap, r.usable);
  size_t moved = o->map.rw << qm__page_shift;
  bool revived = false;
  if (!err && belt) { /* the part past the pages moved: the carved reservation */
    err = qm__sec_open_afresh(r.usable + moved, (need << qm__page_shift) - moved, 0);
    revived = !err;
    int adv = thp_advice(cap);
    if (!err && adv > 0)
      qm_os_hugepage((void *)r.base, r.span);
    else if (!err && adv < 0)
      qm_os_nohugepage((void *)r.base, r.span);
  } else if (!err) {
    err =
        qm__range_revive(LF.strategy, (void *)(r.usable + moved), (need << qm__page_shift) - moved);
    revived = !err;
  }
  if (!err)
    err = qm_os_move((void *)o->map.usable, moved, (void *)r.usable, true);
  if (err && mapped)
    qm_os_unmap((void *)r.base, r.span);
  if (err) {
    if (belt && !revived) {
      qm__sec_uncarve(i, &r);
      return NULL;
    }
    /* a failed move may have unmapped a belt range: it is left as it is
     * (see move_reuse in large_alloc.c) */
    qm_lock(&S.lock);
    if (err == EINVAL)
      L.no_dontunmap = true; /* before Linux 5.7: copy from now on */
    qm__rec_free(i);
    qm_unlock(&S.lock);
    return NULL;
  }
  if (off_belt && !belt)
    qm__sec_left_window();
  qm_lock(&S.lock);
  qm__tab_reserve();
  block_t *b = B(i);
  b->map = (blk_map_t){.base = r.base,
                       .usable = r.usable,
                       .span = r.span,
                       .cap = cap,
                       .rw = need,
                       .dirty = need,
                       .lead = o->map.lead /* the pages before the user pointer moved too */};
  b->chunk = (blk_chunk_t){.size = size,
                           .state = B_LIVE,
                           .flags = (noreuse ? F_NOREUSE : 0) | F_SPLIT | (belt ? F_BELT : 0),
                           .extra_vmas = more_vmas(o->chunk.extra_vmas, 1)};
  qm__set_vmas(b, true);
  qm__note_alloc(i, t);
  qm__rec_publish(i);
  uintptr_t u = user_of(b);
  L.fresh++;
  L.moved++;
  L.allocs++;
  L.live++;
  live_bytes(size, 0);
  /* the old chunk is freed; its range is mapped and empty now, save pages
   * past its RW part (a shrink's tail), which may still hold data: without
   * such a tail nothing is resident, so nothing counts against the
   * quarantine's budget or as a fault reuse would save */
  tail_sub(o);
  if (o->map.dirty <= o->map.rw)
    o->map.dirty = 0;
  /* the move left the emptied pages a VMA apart from the rest of the
   * range: reused in place, its RW part may be two mappings that do not
   * merge (seen on 6.18), which 5.10 and 5.15 cannot move in one mremap */
  o->chunk.flags |= F_FREED | F_SPLIT;
  qm_mark_released(user_of(o));
  o->chunk.odo = qm__belt_odometer();
  o->chunk.seq = qm__note_free(old, t);
  L.live--;
  live_bytes(0, o->chunk.size);
  bool unmap_now = qm__sec_unmap_on_free(o);
  qm_unlock(&S.lock);
  if (o->chunk.flags & F_BELT) /* its range is empty: dead at once, mapped afresh */
    qm__sec_bury(old);
  else
    qm__sec_retire_block(old, unmap_now);
  return (void *)u;
}

void *qm__large_realloc(void *p, size_t size) {
  if (size > QM_MAX_REQUEST)
    return fail_enomem();
  uint32_t i = qm__sec_find_live_locked(p, QM_OP_REALLOC);
  block_t *b = B(i);
  size_t need = b->map.lead + qm_pages(size); /* pages from usable, as rw counts them */
  if (need <= b->map.cap) {
    size_t old_rw = b->map.rw;
    /* Growth by realloc tends to go on (a buffer appended to): open an
     * eighth more than asked, within the capacity, so that the next steps
     * move no guard; that slack counts in the usable size. A shrink within
     * it, or under strategy none, keeps the pages open too. */
    size_t open = need + need / 8 < b->map.cap ? need + need / 8 : b->map.cap;
    open = grow_extent(open, b->map.cap, b->map.usable);
    if ((need <= old_rw && old_rw <= open) || (need < old_rw && LF.strategy == QM_STRATEGY_NONE)) {
      live_bytes(size, b->chunk.size);
      b->chunk.size = size;
      b->chunk.ashift = 0; /* realloc hands out malloc's kind of chunk */
      L.in_place++;
      qm_unlock(&S.lock);
      return p;
    }
    b->chunk.state = B_BUSY;
    qm_unlock(&S.lock);
    int err;
    bool dropped = false;
    size_t new_rw = need > old_rw ? open : need;
    /* a belt chunk's pages past its resident ones are the carved
     * reservation's: mapped afresh (open_afresh), its resident tail
     * opened again by mprotect (it merges back) */
    size_t kept = (b->chunk.flags & F_BELT) && b->map.dirty < new_rw ? b->map.dirty : new_rw;
    if (need > old_rw) {
      err = qm__range_revive(LF.strategy, (void *)(b->map.usable + (old_rw << qm__page_shift)),
                             (kept - old_rw) << qm__page_shift);
      if (!err && kept < new_rw &&
          (err = qm__sec_open_afresh(b->map.usable + (kept << qm__page_shift),
                                     (new_rw - kept) << qm__page_shift, thp_advice(b->map.cap))))
        qm__range_retire(LF.strategy, (void *)(b->map.usable + (old_rw << qm__page_shift)),
                         (kept - old_rw) << qm__page_shift, &dropped); /* as it was */
    } else
      err = qm__range_retire(LF.strategy, (void *)(b->map.usable + (need << qm__page_shift)),
                             (old_rw - need) << qm__page_shift, &dropped);
    qm_lock(&S.lock);
    b->chunk.state = B_LIVE;
    if (!err) {
      tail_sub(b);
      b->map.rw = new_rw;
      /* a belt chunk opened past its resident pages: those come from the
       * reservation, a mapping apart from pages an earlier reuse moved in
       * (their offsets differ), so its RW part may be two mappings now */
      if (new_rw > b->map.dirty && (b->chunk.flags & F_BELT)) {
        b->chunk.flags |= F_SPLIT;
        b->chunk.extra_vmas = more_vmas(b->chunk.extra_vmas, 1);
      }
      if (b->map.dirty < new_rw)
        b->map.dirty = new_rw;
      tail_add(b); /* a shrink keeps its tail resident */
      live_bytes(size, b->chunk.size);
      b->chunk.size = size;
      b->chunk.ashift = 0; /* realloc hands out malloc's kind of chunk */
      L.in_place++;
      bool over = qm__q_over(); /* that tail counts against the budget */
      qm_unlock(&S.lock);
      if (over)
        qm__sec_enforce_all(0);
      return p;
    }
    if (need < old_rw) { /* could not protect the tail: still correct */
      live_bytes(size, b->chunk.size);
      b->chunk.size = size;
      b->chunk.ashift = 0; /* realloc hands out malloc's kind of chunk */
      qm_unlock(&S.lock);
      return p;
    }
  }
  b->chunk.state = B_BUSY;
  qm_unlock(&S.lock);
  /* The stack only now, out of the lock: a resize in place keeps no stack
   * (the chunk's allocation stack stays the one that names it), and
   * capturing one at every call was most of a growing buffer's time (4
   * KiB steps to 8 MiB: 2047 reallocs, 4 of them moves, at about 3 us a
   * capture here). A move records it as the new chunk's allocation and
   * the old one's free; the copy below captures its own in malloc and
   * free. */
  trace_t t;
  trace_capture(&t);
  void *q = move_grow(i, size, need, &t);
  if (q)
    return q;
  qm_lock(&S.lock);
  b->chunk.state = B_LIVE;
  /* every byte the program may have written, slack past the request too */
  size_t old_usable = (b->map.rw - b->map.lead) << qm__page_shift;
  qm_unlock(&S.lock);
  q = qm__large_alloc(size, 0, false);
  if (!q)
    return NULL;
  memcpy(q, p, old_usable < size ? old_usable : size);
  qm_lock(&S.lock);
  L.moved++;
  qm_unlock(&S.lock);
  qm__large_free(p);
  return q;
}
