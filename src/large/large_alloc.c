/* large_alloc.c: a large request served: by a quarantined chunk it fits
 * (reused in place, or its pages moved to a range carved afresh), by
 * pieces of pooled chunks gathered into one, or by a fresh chunk from the
 * belt or a mapping of its own. A chunk is BUSY while it is worked on out
 * of the lock, and LIVE once handed out.
 */
#include "secondary.h"

#include <string.h>

#include "os.h"
#include "secondary_int.h"

/* From this size up a fresh mapping is asked of qm_os_could_map first (it
 * reads /proc: a cost only requests this large can carry) */
#define QM_ASK_FIRST ((size_t)1 << 30)

/* The RW extent, in pages, of a request for `need` pages. A chunk that gets
 * THP is opened in whole huge pages and placed to end flush at the last one:
 * opening only its own pages split the last PMD, and a split PMD stays 512
 * PTEs for good, so in large churn (W=8) only 6 of 88 MiB stayed huge. On a
 * VM that shadows the page tables each PTE changed by mprotect costs about
 * 5 us at its next touch (measured here, though the guest counts no fault):
 * whole huge pages made large churn 1.2-1.5x faster. The trailing guard stays
 * at the chunk's last page; what moves is the leading one: the bytes between
 * the huge page's start and the user pointer are the chunk's own slack.
 * Over-aligned requests keep exact extents (the lead would break their
 * alignment). */
static size_t extent(size_t need, size_t align) {
  if (align > qm__page || !want_thp(pclass_pages(pclass(need))))
    return need;
  size_t hp = LF.thp_size >> qm__page_shift;
  return (need + hp - 1) / hp * hp;
}

/* The capacity a new chunk of `need` pages gets (its page class, whole
 * huge pages where it gets THP, 2 MiB-aligned then). */
static size_t shape(size_t need, bool noreuse, size_t *align, bool *huge) {
  size_t cap = noreuse ? need : pclass_pages(pclass(need));
  if (cap < need) /* past the last class */
    cap = need;
  *huge = want_thp(cap);
  if (*huge && *align < LF.thp_size)
    *align = LF.thp_size;
  if (*huge) { /* whole huge pages, for any later extent (see extent()) */
    size_t hp = LF.thp_size >> qm__page_shift;
    cap = (cap + hp - 1) / hp * hp;
  }
  return cap;
}

/* Whether a request of `need` pages may be gathered from pooled pages
 * (gather_reuse): a chunk of its size would come from the belt, and the
 * kernel moves a range of several mappings in one mremap (the gathered
 * chunk is several, and moves whole at its next free or reuse). */
static bool may_gather(size_t need, size_t align) {
  if (LF.belt_way == QM_BELT_IN_PLACE)
    return false;
  bool huge;
  size_t cap = shape(need, false, &align, &huge);
  return use_belt(cap, false) && qm_os_move_spans_vmas();
}

/* Records a BUSY chunk as handed to the caller (under S.lock). Returns how
 * many of its first bytes may be non-zero: calloc must clear those. */
static size_t serve_locked(uint32_t i, size_t size, unsigned ashift, size_t need, size_t lead,
                           bool reused, const trace_t *t) {
  block_t *b = B(i);
  qm__note_alloc(i, t);
  uintptr_t was = user_of(b);
  b->map.lead = lead;
  if (reused)
    qm__tab_rekey(was, user_of(b), i);
  size_t nonzero = (b->map.dirty > lead ? b->map.dirty - lead : 0) << qm__page_shift;
  /* pages that come back writable: under protect with the fast path, and
   * pages moved RW from the belt's pool on any kernel */
  bool kept = LF.fast || ((b->chunk.flags & F_BELT) && LF.belt_way == QM_BELT_MOVE);
  if (reused && LF.strategy == QM_STRATEGY_PROTECT && kept)
    L.avoided += b->map.dirty < need ? b->map.dirty : need;
  /* every page open to the user may be written, and stays counted until its
   * pages are dropped: calloc on a later reuse relies on it */
  if (b->map.dirty < b->map.rw)
    b->map.dirty = b->map.rw;
  tail_add(b);
  b->chunk.size = size;
  b->chunk.ashift = (uint8_t)ashift;
  b->chunk.state = B_LIVE;
  b->chunk.flags &= (uint8_t)~F_FREED;
  qm__set_vmas(b, true);
  L.live++;
  live_bytes(size, 0);
  L.allocs++;
  L.reuses += reused;
  return nonzero < size ? nonzero : size;
}

/* The same, then unlocks S.lock, tidies the belt if `tidy` (a burial
 * asked for it), enforces the limits, and zeroes what may be non-zero if
 * asked; a reused chunk may bring resident pages past the request, which
 * count against the budget. */
static void *serve_unlock(uint32_t i, size_t size, unsigned ashift, size_t need, size_t lead,
                          bool zero, bool reused, const trace_t *t, bool tidy) {
  size_t nonzero = serve_locked(i, size, ashift, need, lead, reused, t);
  bool over = qm__q_over();
  uintptr_t u = user_of(B(i));
  qm_unlock(&S.lock);
  if (tidy)
    qm__belt_tidy();
  if (over)
    qm__sec_enforce_all(0);
  if (zero && nonzero)
    memset((void *)u, 0, nonzero);
  return (void *)u;
}

/* The same, taking the lock. */
static void *serve(uint32_t i, size_t size, unsigned ashift, size_t need, size_t lead, bool zero,
                   bool reused, const trace_t *t) {
  qm_lock(&S.lock);
  return serve_unlock(i, size, ashift, need, lead, zero, reused, t, false);
}

/* Under S.lock: record i becomes the BUSY chunk of fresh range r (carved
 * from the belt, or mapped), need of its cap pages RW, and is published. */
static void publish_fresh(uint32_t i, const qm_range_t *r, size_t cap, size_t need, size_t lead,
                          uint8_t flags) {
  block_t *b = B(i);
  b->map = (blk_map_t){
      .base = r->base, .usable = r->usable, .span = r->span, .cap = cap, .rw = need, .lead = lead};
  b->chunk = (blk_chunk_t){.state = B_BUSY, .flags = flags};
  qm__rec_publish(i);
  L.fresh++;
}

/* A fresh chunk carved from the belt: its RW part mapped afresh in the
 * reservation (open_afresh: one mapping whatever the reservation is made
 * of there), its THP advice given to its whole range (the rest of its
 * capacity too, which realloc may open). NULL where the belt has no room
 * or the part cannot be mapped: the caller maps one. */
static void *fresh_belt(size_t size, unsigned ashift, size_t need, size_t lead, size_t align,
                        bool zero, size_t cap, bool huge, const trace_t *t) {
  qm_range_t r;
  qm_lock(&S.lock);
  uint32_t i = qm__sec_carve_locked(cap, align, &r);
  qm_unlock(&S.lock);
  if (i == NIL)
    return NULL;
  if (qm__sec_open_afresh(r.usable, need << qm__page_shift, 0)) {
    qm__sec_uncarve(i, &r);
    return NULL;
  }
  int adv = thp_advice(cap);
  if (adv > 0)
    qm_os_hugepage((void *)r.base, r.span);
  else if (adv < 0)
    qm_os_nohugepage((void *)r.base, r.span);
  /* Where one mremap() moves one mapping only (5.10, 5.15), the chunk is
   * given its anonymous-memory root (anon_vma) now, by writing its user
   * pointer's page (a zero: calloc's promise holds; the user's first write
   * would fault there anyway). A mapping with none, a chunk freed unwritten
   * (in tests, belt_on()'s malloc(1 MiB) and free), moves so; a smaller
   * request that reuses it opens part of it, that part gets an anon_vma at
   * its first write, and at free those kernels never merge it back with
   * the rest, which has none (is_mergeable_anon_vma(): a neighbour without
   * one merges only if its anon_vma_chain is singular; 6.x merges them):
   * the chunk's pages were then two mappings with nothing in its record
   * saying so, and their next move was refused (booted: 5.15 + series, 2
   * in unit-belt-protect-one-vma, each such a 1 MiB chunk split where the
   * smaller request ended). */
  if (!qm_os_move_spans_vmas())
    *(volatile char *)(r.usable + (lead << qm__page_shift)) = 0;
  qm_lock(&S.lock);
  qm__tab_reserve(); /* reserved when carved; another thread may have used it */
  publish_fresh(i, &r, cap, need, lead, (uint8_t)(F_BELT | (huge ? F_HUGE : 0)));
  L.belt_fresh++;
  qm_unlock(&S.lock);
  return serve(i, size, ashift, need, lead, zero, false, t);
}

/* Serves a request with the pages of the pooled belt chunk i (BUSY, out of
 * the quarantine): they move to a range carved afresh (mremap with
 * MREMAP_DONTUNMAP: no copy, no fault). Under belt_way=protect they moved
 * PROT_NONE from i's own range and the range is then opened; under
 * belt_way=move they come RW from i's place in the mirror, and a request
 * they fit exactly takes no mprotect at all (a misfit one, for the pages
 * past them or the ones it does not take). i's own range stays PROT_NONE and goes back to
 * the belt, dead, so a dangling pointer into it faults until the belt
 * comes round a window later. Measured here (6.18): 0 faults rewriting
 * every page, either way. NULL where no range can be carved or the move
 * fails: i is buried (its pages dropped) and the caller takes a fresh
 * chunk. */
static void *move_reuse(uint32_t i, size_t size, unsigned ashift, size_t pages, size_t need,
                        size_t align, bool zero, const trace_t *t) {
  block_t *o = B(i);
  size_t open = qm_need_in(o, need, align), moved = o->map.dirty;
  bool pooled = o->chunk.pool & P_POOLED;
  uintptr_t from = pooled ? qm__belt_shadow(o->map.usable) : o->map.usable;
  bool huge = o->chunk.flags & F_HUGE;
  size_t calign = huge && align < LF.thp_size ? LF.thp_size : align;
  qm_range_t r;
  uint32_t j = NIL;
  /* a range of several VMAs moves in one mremap() only on kernels that
   * allow it (see qm_os_move_spans_vmas) */
  if (!(o->chunk.flags & F_SPLIT) || qm_os_move_spans_vmas()) {
    qm_lock(&S.lock);
    j = qm__sec_carve_locked(o->map.cap, calign, &r);
    qm_unlock(&S.lock);
  }
  if (j == NIL) {
    qm__sec_bury(i);
    return NULL;
  }
  int err = moved ? qm_os_move((void *)from, moved << qm__page_shift, (void *)r.usable, true) : 0;
  if (err) {
    /* the kernel may have unmapped the destination before failing: the
     * range is left as it is, its segment never carved again (mapping it
     * afresh could take what another thread's mmap got there meanwhile) */
    qm_lock(&S.lock);
    if (err == EINVAL)
      L.no_dontunmap = true; /* before Linux 5.7: no belt from now on */
    qm__rec_free(j);
    qm_unlock(&S.lock);
    qm__sec_bury(i);
    return NULL;
  }
  /* moved RW, the pages need no opening: only those past them the request
   * takes are opened, or those it does not take closed (a misfit: they
   * stay resident, PROT_NONE, as under protect). Moved PROT_NONE, those it
   * takes are opened (one mapping: moved whole). The part past them is the
   * carved reservation: mapped afresh (open_afresh), one mapping; with no
   * advice, as the reservation had none there before. */
  int perr = open > moved ? qm__sec_open_afresh(r.usable + (moved << qm__page_shift),
                                                (open - moved) << qm__page_shift, 0)
                          : 0;
  if (!perr && !pooled)
    perr = qm_os_protect((void *)r.usable, (open < moved ? open : moved) << qm__page_shift,
                         QM_PROT_NONE, QM_PROT_RW);
  else if (!perr && open < moved)
    perr = qm_os_protect((void *)(r.usable + (open << qm__page_shift)),
                         (moved - open) << qm__page_shift, QM_PROT_RW, QM_PROT_NONE);
  if (perr) {
    qm__sec_uncarve(j, &r); /* the moved pages go with it */
    qm__sec_bury(i);
    return NULL;
  }
  qm_lock(&S.lock);
  qm__tab_reserve();
  block_t *b = B(j);
  /* the moved pages are a VMA of their own (their page offsets are the old
   * range's): split from the rest of the RW part if that is more */
  bool split = moved && (open > moved || (o->chunk.flags & F_SPLIT));
  b->map = (blk_map_t){.base = r.base,
                       .usable = r.usable,
                       .span = r.span,
                       .cap = o->map.cap,
                       .rw = open,
                       .dirty = moved};
  b->chunk = (blk_chunk_t){.state = B_BUSY,
                           .flags = (uint8_t)(F_BELT | (huge ? F_HUGE : 0) | (split ? F_SPLIT : 0)),
                           .extra_vmas = more_vmas(o->chunk.extra_vmas, moved && open > moved)};
  qm__rec_publish(j);
  L.belt_moves++;
  /* its range and, pooled, its place in the mirror (emptied) are mapped
   * afresh with the other dead ranges, in a batch */
  bool work = qm__sec_bury_locked(i, false);
  return serve_unlock(j, size, ashift, open, open - pages, zero, true, t, work);
}

/* Settles the pieces' chunks once their pages moved (under S.lock): one
 * that gave all it had is dead (buried: its range and its emptied place in
 * the mirror are mapped afresh with the other dead ranges), one with pages
 * left stays pooled. Returns whether the caller must qm__belt_tidy(). */
static bool settle_pieces(const piece_t *pc, unsigned n) {
  bool work = false;
  for (unsigned k = 0; k < n; k++)
    if (qm__q_settle(pc[k].i))
      work |= qm__sec_bury_locked(pc[k].i, false);
    else
      B(pc[k].i)->chunk.state = B_QUAR;
  return work;
}

/* Gives pieces back to the pool unmoved (under S.lock). */
static void ungather_locked(const piece_t *pc, unsigned n) {
  for (unsigned k = 0; k < n; k++)
    B(pc[k].i)->chunk.state = B_QUAR;
  qm__q_ungather(pc, n);
}

/* Serves a request that no pooled chunk covers alone (q_fit found no chunk
 * whose resident pages cover it) with a chunk carved afresh and filled
 * with pieces of pooled chunks' pages (qm__q_gather chooses them), each
 * moved by one mremap with MREMAP_DONTUNMAP: the chunk takes no fault,
 * whatever the sizes of the chunks the pages came from (only a request the
 * pool covers in full, within MAX_PIECES, or one larger than all the
 * quarantine holds, is gathered: gather_plan_locked).
 * Pages that waited PROT_NONE
 * (belt_way=protect) are opened with one mprotect over the whole extent;
 * pages pooled RW (move) need none, but for the part the pool could not
 * give. Syscalls: one mremap a piece, and the mprotect. A chunk that gave
 * only part of its pages keeps the rest, pooled where they were, and its
 * range: a dangling pointer into the part given still faults (PROT_NONE,
 * or mapped afresh under move) and names that chunk, whose record covers
 * its whole range; one that gave all is buried like the chunk of
 * move_reuse. THP: a chunk of huge pages is carved 2 MiB-aligned and
 * takes pieces of whole huge pages first, which then move PMD by PMD. The
 * pieces are separate mappings (their page offsets differ): a chunk of n
 * pieces holds n - 1 more (extra_vmas), within MAX_PIECES; it is F_SPLIT,
 * so it is gathered only on kernels whose mremap moves a range of several
 * mappings at once (6.x; 5.10 and 5.15 refuse with EFAULT), where it moves
 * again whole at its next free and reuse. NULL where the pool has nothing
 * to give, or no range can be carved, or a move fails: the caller maps a
 * fresh chunk. */
typedef struct gather {
  piece_t pc[MAX_PIECES];
  unsigned n;
  size_t need, cap; /* the extent opened (whole huge pages), the capacity */
  bool huge;
  uint32_t j; /* the new chunk's record */
  qm_range_t r;
} gather_t;

/* Under S.lock: chooses the pieces and carves the range for them. Only a
 * request the pool covers in full is gathered, or one larger than all the
 * quarantine holds: one it covers in part faults in the rest either way,
 * and gathering it then only cut more chunks into pieces (measured: W=64
 * churn went from 0.3 to 1-1.5 faults/op, small requests finding only huge
 * pages, which they may not split, left in the pool). False: nothing
 * taken, nothing carved. */
static bool gather_plan_locked(gather_t *g, size_t need, size_t align) {
  g->need = need;
  for (int round = 0; round < 2; round++) {
    size_t a = align;
    g->cap = shape(g->need, false, &a, &g->huge);
    size_t got = 0;
    bool all = false;
    g->n = qm__q_gather(g->need, g->cap, g->huge, g->pc, MAX_PIECES, &got, &all);
    QM_CHECK_OP(got, <=, g->cap); /* the pieces fit the range carved */
    g->j =
        g->n && (got >= g->need || (all && !round)) ? qm__sec_carve_locked(g->cap, a, &g->r) : NIL;
    if (g->n && g->j == NIL)
      qm__q_ungather(g->pc, g->n); /* still QUAR: not marked yet */
    if (g->j != NIL) {
      for (unsigned k = 0; k < g->n; k++)
        B(g->pc[k].i)->chunk.state = B_BUSY;
      return true;
    }
    /* a smaller request that small pages cannot fill takes whole huge
     * pages, opened as a THP chunk's extent is (extent(): its lead is its
     * own slack), as q_fit lets it take a pooled huge chunk whole: where
     * most pooled pages were huge, small requests otherwise faulted in
     * fresh chunks beside them */
    size_t hp = LF.thp_size >> qm__page_shift;
    if (round || g->huge || !hp || align > qm__page)
      return false;
    g->need = (need + hp - 1) / hp * hp;
  }
  return false;
}

static void *gather_reuse(gather_t *g, size_t size, unsigned ashift, size_t pages, bool zero,
                          const trace_t *t) {
  size_t need = g->need, lead = need - pages;
  const piece_t *pc = g->pc;
  unsigned n = g->n;
  size_t cap = g->cap;
  bool huge = g->huge;
  uint32_t j = g->j;
  qm_range_t r = g->r;
  size_t moved = 0;
  bool closed = false, open = false; /* some pages waited PROT_NONE; some RW */
  int err = 0;
  unsigned k = 0;
  for (; k < n && !err; k++) {
    const block_t *o = B(pc[k].i);
    uintptr_t from = o->chunk.pool & P_POOLED ? qm__belt_shadow(o->map.usable) : o->map.usable;
    closed |= !(o->chunk.pool & P_POOLED);
    open |= o->chunk.pool & P_POOLED;
    err = qm_os_move((void *)(from + (pc[k].off << qm__page_shift)), pc[k].n << qm__page_shift,
                     (void *)(r.usable + (moved << qm__page_shift)), true);
    if (!err)
      moved += pc[k].n;
  }
  if (err) {
    /* as in move_reuse, the failed move's destination is left as it is and
     * its segments never carved again; what moved before it is dropped
     * (that part of the range is this chunk's). The pieces not moved go
     * back to the pool. */
    if (moved)
      qm__belt_clean(r.usable, moved << qm__page_shift);
    qm_lock(&S.lock);
    if (err == EINVAL)
      L.no_dontunmap = true;
    qm__rec_free(j);
    ungather_locked(pc + k - 1, n - (k - 1));
    bool work = settle_pieces(pc, k - 1);
    qm_unlock(&S.lock);
    if (work)
      qm__belt_tidy();
    return NULL;
  }
  /* the extent opened: what the pool did not give mapped afresh
   * (open_afresh: the carved reservation may be several mappings) with
   * its advice, the pieces that waited PROT_NONE by one mprotect; and
   * pages past it (a chunk taken whole with a few to spare) closed where
   * they came RW: they stay with the chunk, resident, as a misfit's do in
   * move_reuse */
  int perr = moved < need ? qm__sec_open_afresh(r.usable + (moved << qm__page_shift),
                                                (need - moved) << qm__page_shift, thp_advice(cap))
                          : 0;
  if (!perr && closed)
    perr = qm_os_protect((void *)r.usable, (moved < need ? moved : need) << qm__page_shift,
                         QM_PROT_NONE, QM_PROT_RW);
  if (!perr && open && moved > need)
    perr = qm_os_protect((void *)(r.usable + (need << qm__page_shift)),
                         (moved - need) << qm__page_shift, QM_PROT_RW, QM_PROT_NONE);
  if (perr) {
    qm__sec_uncarve(j, &r); /* the moved pages go with it */
    qm_lock(&S.lock);
    bool work = settle_pieces(pc, n);
    qm_unlock(&S.lock);
    if (work)
      qm__belt_tidy();
    return NULL;
  }
  qm_lock(&S.lock);
  qm__tab_reserve();
  block_t *b = B(j);
  unsigned parts = moved < need; /* mappings its RW part is */
  for (unsigned m = 0; m < n; m++)
    parts += pc[m].vmas;
  b->map = (blk_map_t){.base = r.base,
                       .usable = r.usable,
                       .span = r.span,
                       .cap = cap,
                       .rw = need,
                       .dirty = moved,
                       .lead = lead};
  b->chunk =
      (blk_chunk_t){.state = B_BUSY,
                    .flags = (uint8_t)(F_BELT | (huge ? F_HUGE : 0) | (parts > 1 ? F_SPLIT : 0)),
                    .extra_vmas = (uint8_t)(parts - 1)};
  qm__rec_publish(j);
  L.belt_moves++;
  L.belt_gathers++;
  L.belt_pieces += n;
  bool work = settle_pieces(pc, n);
  return serve_unlock(j, size, ashift, need, lead, zero, true, t, work);
}

static void *fresh(size_t size, unsigned ashift, size_t need, size_t lead, size_t align, bool zero,
                   bool noreuse, const trace_t *t) {
  bool huge;
  size_t cap = shape(need, noreuse, &align, &huge);
  bool off_belt = use_belt(cap, noreuse);
  if (off_belt) {
    qm__sec_enforce_all(0);
    void *p = fresh_belt(size, ashift, need, lead, align, zero, cap, huge, t);
    if (p)
      return p;
    if (!may_leave_window())
      return fail_enomem();
  }
  qm__sec_enforce_all(3);
  /* A request the kernel refuses whatever is freed (malloc(16 TiB) once
   * emptied the whole quarantine on its way to ENOMEM) is neither retried
   * nor, from QM_ASK_FIRST up, tried at all: the PROT_NONE reservation of
   * 32 TiB that the kernel grants before refusing the RW part costs two
   * syscalls, and qemu-user 7.2 fills a page table of its own for every
   * page reserved (24 GiB for 32 TiB: the OOM killer ends it) */
  size_t span = (cap << qm__page_shift) + align + 2 * qm__page;
  bool asked = need >= QM_ASK_FIRST >> qm__page_shift;
  bool could = !asked || qm_os_could_map(span, need << qm__page_shift, qm__q_mapped_bytes());
  qm_range_t r;
  int err = could ? qm__range_map(LF.strategy, cap << qm__page_shift, align, need << qm__page_shift,
                                  thp_advice(cap), &r)
                  : ENOMEM;
  /* Out of address space, memory or mappings: unmapping quarantined chunks
   * may let the mapping succeed, and is done only where it can. The aged
   * chunks go first; the window (quarantine_min_frees, quarantine_min_mb)
   * only in the default profile, as the last resort (failing instead would
   * leave a program that freed everything unable to allocate again),
   * counted and warned of. Under hardening=max the request fails instead. */
  int rounds = qm__opt.hardening == QM_HARDENING_MAX ? 1 : 2;
  if (err == ENOMEM &&
      (asked ? !could : !qm_os_could_map(span, need << qm__page_shift, qm__q_mapped_bytes())))
    rounds = 0;
  for (int round = 0; err == ENOMEM && round < rounds; round++)
    if (qm__sec_unmap_all(round == 1))
      err = qm__range_map(LF.strategy, cap << qm__page_shift, align, need << qm__page_shift,
                          thp_advice(cap), &r);
  if (err)
    return fail_enomem();
  qm_lock(&S.lock);
  uint32_t i = qm__tab_reserve() ? qm__rec_alloc() : NIL;
  if (i == NIL) {
    qm_unlock(&S.lock);
    qm_os_unmap((void *)r.base, r.span);
    return fail_enomem();
  }
  publish_fresh(i, &r, cap, need, lead, (uint8_t)((noreuse ? F_NOREUSE : 0) | (huge ? F_HUGE : 0)));
  qm_unlock(&S.lock);
  if (off_belt)
    qm__sec_left_window();
  return serve(i, size, ashift, need, lead, zero, false, t);
}

void *qm__large_alloc(size_t size, size_t align, bool zero) {
  if (size > QM_MAX_REQUEST || align > QM_MAX_REQUEST)
    return fail_enomem();
  qm__sec_ensure_ready();
  trace_t t;
  trace_capture(&t);
  size_t pages = qm_pages(size ? size : 1);
  unsigned ashift = align > QM_MIN_ALIGN ? (unsigned)__builtin_ctzll(align) : 0;
  if (align < qm__page)
    align = qm__page;
  size_t need = extent(pages, align), lead = need - pages;
  bool noreuse = need << qm__page_shift >= qm__opt.unmap_threshold_mb << 20;
  if (!noreuse && LF.strategy != QM_STRATEGY_UNMAP) {
    bool can_gather =
        may_gather(need, align); /* before the lock: its first call tests the kernel */
    qm_lock(&S.lock);
    qm__q_age();
    bool whole = false;
    uint32_t i = qm__q_fit(need, align, &whole);
    /* no chunk's resident pages cover the request: on the belt it is
     * gathered from pooled pages instead of faulting in the difference
     * (gather_reuse), the chunk q_fit found left pooled */
    gather_t g;
    bool gather = !whole && can_gather && gather_plan_locked(&g, need, align);
    if (gather)
      i = NIL;
    /* what the picked chunk opens: a THP chunk serving a smaller request
     * opens whole huge pages too, placed as extent() places its own */
    size_t open = i != NIL ? qm_need_in(B(i), need, align) : need;
    if (i != NIL) {
      qm__q_unlink(i);
      B(i)->chunk.state = B_BUSY;
      if (open <= B(i)->map.rw) { /* open already (strategy none): no syscall */
        size_t nonzero = serve_locked(i, size, ashift, open, open - pages, true, &t);
        bool over = qm__q_over();
        uintptr_t u = user_of(B(i));
        qm_unlock(&S.lock);
        if (over)
          qm__sec_enforce_all(0);
        if (zero && nonzero)
          memset((void *)u, 0, nonzero);
        return (void *)u;
      }
    }
    qm_unlock(&S.lock);
    if (i != NIL && (B(i)->chunk.flags & F_BELT)) {
      void *p = move_reuse(i, size, ashift, pages, need, align, zero, &t);
      if (p)
        return p;
      i = NIL;
    }
    if (gather) {
      void *p = gather_reuse(&g, size, ashift, pages, zero, &t);
      if (p)
        return p;
    }
    if (i != NIL) {
      block_t *b = B(i);
      int err = 0;
      if (open > b->map.rw)
        err = qm__range_revive(LF.strategy, (void *)(b->map.usable + (b->map.rw << qm__page_shift)),
                               (open - b->map.rw) << qm__page_shift);
      if (!err) {
        if (b->map.rw < open)
          b->map.rw = open;
        return serve(i, size, ashift, open, open - pages, zero, true, &t);
      }
      qm__sec_discard_block(i);
    }
  }
  return fresh(size, ashift, need, lead, align, zero, noreuse, &t);
}
