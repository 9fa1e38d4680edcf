/* secondary.c: large chunks: their allocation, free and realloc, their
 * burial and the work on chunks the quarantine lets go, set-up, stats and
 * fork. It orchestrates the parts that own the rest: the records
 * (large_record.c), the quarantine (quarantine.c), the belt's address
 * space (belt.c); reports read the records (large_report.c). Its own
 * state is L (counts, and what it learnt of the kernel). Invariants: only
 * this file changes a chunk's state (LIVE, QUAR, BUSY, DEAD); it writes
 * the map and chunk parts of a record (large.h), and no other, only under
 * S.lock or as the one thread that marked the chunk BUSY; no syscall is made
 * under S.lock except growing the record table; a LIVE chunk is RW exactly
 * on [usable, usable + rw pages) and inaccessible elsewhere in its
 * mapping; a QUAR chunk is inaccessible throughout (strategy none aside).
 * Under S.lock only the belt's lock is taken (a leaf). Calls go down
 * only: to the quarantine, the records, the belt, the probe and the OS
 * layer.
 */
#include "secondary.h"

#include <errno.h>
#include <stdatomic.h>
#include <string.h>

#include "belt.h"
#include "describe.h"
#include "guarded.h"
#include "large_record.h"
#include "options.h"
#include "os.h"
#include "probe.h"
#include "quarantine.h"
#include "report.h"
#include "strategy.h"

/* The secondary's own state (under S.lock, but init_lock): what it
 * counts, and what it learnt of the kernel. */
static struct {
  qm_lock_t init_lock;
  size_t live, live_bytes;
  uint64_t allocs, reuses, fresh, avoided, in_place, moved;
  uint64_t unmaps, drops, buried;     /* chunks unmapped, that lost their pages, buried */
  uint64_t belt_fresh, belt_moves;    /* belt chunks carved, reuses by move */
  uint64_t belt_pooled;               /* frees whose pages moved to the mirror */
  uint64_t belt_gathers, belt_pieces; /* reuses assembled from pieces, and those */
  bool no_dontunmap;                  /* mremap refused MREMAP_DONTUNMAP: no belt, no move */
} L = {.init_lock = QM_LOCK_INIT};

/* A stack captured on the way in, before any lock (unwinding takes none of
 * qmalloc's, but may take the loader's). */
static void trace_capture(trace_t *t) {
  t->n = LF.frames ? qm__stack_capture_unlocked(t->pc, LF.frames) : 0;
  t->tid = LF.frames ? qm__thread_id() : 0;
}

/* A live chunk's tail (tail_pages) counts against the quarantine's
 * resident budget from its hand-out or resize to its free or resize; most
 * chunks have none. */
static void tail_add(const block_t *b) {
  size_t n = tail_pages(b);
  if (n)
    qm__q_tail_add(n);
}
static void tail_sub(const block_t *b) {
  size_t n = tail_pages(b);
  if (n)
    qm__q_tail_sub(n);
}

/* The bytes live chunks were asked for, changed by `add` and `sub` (under
 * S.lock): the quarantine's resident budget follows them (qm__q_live). */
static void live_bytes(size_t add, size_t sub) {
  L.live_bytes = L.live_bytes + add - sub;
  qm__q_live(L.live_bytes);
}

/* Chunks that keep their pages across reuse (protect, none) and span a
 * transparent huge page get one: each of its 512 pages then changes
 * protection with one PMD, and is touched again at the cost of one; a 4 KiB
 * page costs a PTE each, and on a VM a shadow-table sync each. Linux 6.2+
 * keeps PMD-mapped THP writable through mprotect(RW) (the probe's
 * fast_thp); before that, one fault per 2 MiB instead of 512. */
/* How densely the program writes its large chunks: an average, in 256ths,
 * of the share of a freed chunk's pages that are resident (written, or
 * resident from an earlier use), over chunks of base pages (a THP chunk's
 * touched huge page is resident whole, which says nothing). A huge page
 * pays where most of its 512 pages are written; where a program writes a
 * few bytes of each large chunk, each THP chunk costs 2 MiB of RSS a huge
 * page for a few KiB (small churn's phases=8 mixed, 2 bytes written per
 * chunk of 16 KiB..2 MiB: 84 MiB peak RSS with THP, 39 without, jemalloc
 * 32). So THP goes to new chunks only while the average says at least half
 * the pages are written; it starts there (large churn and growing buffers
 * write every page). Read and written without a lock: a lost update only
 * delays the average by one chunk. */
#define DENSE_ONE 256u
static _Atomic uint32_t density = DENSE_ONE;

static bool thp_dense(void) {
  return atomic_load_explicit(&density, memory_order_relaxed) >= DENSE_ONE / 2;
}

/* Folds the share of a freed chunk's pages that are resident into the
 * average (one mincore, of its first MiB at most): chunks of base pages
 * only, of at least 32 pages, under the strategies that give THP. */
static void note_density(const block_t *b) {
  size_t pages = b->map.rw > b->map.lead ? b->map.rw - b->map.lead : 0;
  if (!LF.thp_size || (b->chunk.flags & F_HUGE) || pages < 32 ||
      (LF.strategy != QM_STRATEGY_PROTECT && LF.strategy != QM_STRATEGY_NONE))
    return;
  if (pages > 256)
    pages = 256;
  long n = qm_os_resident_pages((void *)user_of(b), pages << qm__page_shift);
  if (n < 0)
    return;
  uint32_t d = atomic_load_explicit(&density, memory_order_relaxed);
  uint32_t share = (uint32_t)((size_t)n * DENSE_ONE / pages);
  atomic_store_explicit(&density, d - d / 8 + share / 8, memory_order_relaxed);
}

static bool want_thp(size_t cap_pages) {
  return LF.thp_size && qm__opt.thp_min_mb && thp_dense() &&
         (LF.strategy == QM_STRATEGY_PROTECT || LF.strategy == QM_STRATEGY_NONE) &&
         cap_pages << qm__page_shift >= qm__opt.thp_min_mb << 20 &&
         cap_pages << qm__page_shift >= LF.thp_size;
}

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

/* The pages a realloc opens, `n` from usable, in a chunk of cap pages
 * there: in one that gets THP, up to a huge-page boundary (within cap),
 * so that what is opened covers whole aligned huge pages. The kernel gives
 * a huge page at a fault only where the aligned 2 MiB lie in one mapping
 * that asks for them and hold no page yet, so opening a buffer's growth
 * page by page gave it 4 KiB pages for good (a buffer grown in 4 KiB
 * steps from 2 to 8 MiB took 1536 faults; now 3, and no PMD is split by a
 * guard). The slack is the chunk's own, as a THP chunk's extent is
 * (extent()). */
static size_t grow_extent(size_t n, size_t cap, uintptr_t usable) {
  size_t hp = LF.thp_size >> qm__page_shift;
  if (!hp || !want_thp(cap) || (usable & (LF.thp_size - 1)))
    return n;
  size_t whole = (n + hp - 1) / hp * hp;
  return whole < cap ? whole : cap;
}

/* The THP advice of a fresh mapping: 1 asks for huge pages, -1 refuses them
 * where thp_min_mb=0 says never (under THP "always" the kernel would give
 * them to every aligned 2 MiB of the chunk otherwise), 0 leaves the default. */
static int thp_advice(size_t cap_pages) {
  if (want_thp(cap_pages))
    return 1;
  return LF.thp_size && !qm__opt.thp_min_mb && cap_pages << qm__page_shift >= LF.thp_size ? -1 : 0;
}

/* Opens [p, p+len) of a range carved from the belt where no page of it is
 * resident: one mapping made afresh RW (qm_os_map_fixed), then THP advice
 * adv as thp_advice() gives it, for the new mapping has none. Not
 * mprotect(RW): the belt's reservation there may be several mappings
 * (pieces that had pages, whose anon_vma differ, cannot merge; ranges left
 * behind by MREMAP_DONTUNMAP are mappings of their own until mapped
 * afresh), and mprotect leaves them several, which no record counts: on
 * Linux 5.10 and 5.15 with the mprotect fast path, booted, the move of
 * such a chunk was refused (EFAULT, a range of several mappings) and its
 * pages dropped. Same syscalls: an mmap for the mprotect. */
static int open_afresh(uintptr_t p, size_t len, int adv) {
  if (!len)
    return 0;
  int err = qm_os_map_fixed((void *)p, len, QM_PROT_RW);
  if (!err && adv > 0)
    qm_os_hugepage((void *)p, len);
  else if (!err && adv < 0)
    qm_os_nohugepage((void *)p, len);
  return err;
}

/* Whether a chunk of cap pages comes from the belt: under protect, while
 * window_gb asks for it, and not a chunk that is never reused (those are
 * unmapped when they leave the quarantine: address space goes back). */
static bool use_belt(size_t cap, bool noreuse) {
  return LF.strategy == QM_STRATEGY_PROTECT && !noreuse && qm__belt_on() && !L.no_dontunmap &&
         cap << qm__page_shift < qm__opt.unmap_threshold_mb << 20;
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

/* A chunk's extra mappings (extra_vmas) with `more`, saturating: past
 * MAX_GATHER_VMAS it is never gathered from, whatever the count. */
static uint8_t more_vmas(uint8_t had, unsigned more) {
  return (uint8_t)(had + more < UINT8_MAX ? had + more : UINT8_MAX);
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

/* Carves a range from the belt with a record for it (BUSY); NIL if either
 * cannot be had. The dead records of the segments it enters go first. */
static uint32_t carve_locked(size_t cap, size_t align, qm_range_t *r) {
  uint32_t i = qm__tab_reserve() ? qm__rec_alloc() : NIL;
  uintptr_t lo, hi;
  if (i != NIL && qm__belt_carve(cap << qm__page_shift, align, qm__rec_frees(), r, &lo, &hi)) {
    qm__dead_evict(lo, hi);
    B(i)->chunk.state = B_BUSY;
    return i;
  }
  if (i != NIL)
    qm__rec_free(i);
  return NIL;
}

/* Gives a carved range back unused (its record too): nothing was freed in
 * it, so it sets no window. */
static void uncarve(uint32_t i, const qm_range_t *r) {
  bool clean = qm__belt_clean(r->base, r->span) == 0;
  qm_lock(&S.lock);
  qm__rec_free(i);
  bool work = qm__belt_release(r->base, r->span, 0, 0, clean);
  qm_unlock(&S.lock);
  if (work)
    qm__belt_tidy();
}

/* ---- burial: a belt chunk's end ---- */

/* A BUSY belt chunk that left the user is dead (under S.lock): no page of
 * it is kept, its range goes back to the belt (clean: mapped afresh
 * already), its record to the ring of dead records. */
static void entomb(uint32_t i) {
  block_t *b = B(i);
  qm__rec_unmapped(i);
  b->map.rw = b->map.dirty = 0;
  b->chunk.pool = 0;
  b->chunk.state = B_DEAD;
  L.buried++;
}

/* The record joins the ring of dead records; the first time the ring's
 * storage is made ready in one go, so is the belt's segment table. */
static void keep_dead(uint32_t i) {
  if (qm__dead_push(i))
    qm__belt_prefill();
}

/* Returns whether the caller must qm__belt_tidy(). */
static bool bury_locked(uint32_t i, bool clean) {
  block_t *b = B(i);
  entomb(i);
  bool work = qm__belt_release(b->map.base, b->map.span, b->chunk.odo, b->chunk.seq, clean);
  keep_dead(i);
  return work;
}

/* The same for a chunk whose range is never given back to the belt (a
 * failed move may have left a hole in the mirror where its pages were to
 * go): its segments are never carved again. */
static void entomb_locked(uint32_t i) {
  entomb(i);
  keep_dead(i);
}

/* The same, its pages dropped first: its range mapped afresh, or for a
 * pooled chunk (its range mapped afresh at free) its place in the mirror. */
static void bury(uint32_t i) {
  block_t *b = B(i);
  bool clean = b->chunk.pool & P_POOLED ? qm__belt_clean_shadow(b->map.base, b->map.span) == 0 &&
                                              (b->chunk.pool & P_CLEAN)
                                        : qm__belt_clean(b->map.base, b->map.span) == 0;
  qm_lock(&S.lock);
  bool work = bury_locked(i, clean);
  qm_unlock(&S.lock);
  if (work)
    qm__belt_tidy();
}

/* ---- the quarantine's victims: chosen by it under S.lock, marked BUSY
 * here under the same hold, worked on without the lock ---- */

static void take_victims_locked(const victims_t *v) {
  for (unsigned k = 0; k < v->nunmap; k++)
    B(v->unmap[k])->chunk.state = B_BUSY;
  for (unsigned k = 0; k < v->ndrop; k++)
    B(v->drop[k])->chunk.state = B_BUSY;
}

/* Unmaps the unmap victims and drops the drop victims' pages (belt chunks
 * of either are buried), then, under S.lock, frees the unmapped chunks'
 * records and gives the quarantine back the chunks that only lost their
 * pages. Empties v. */
static void process_victims(victims_t *v) {
  /* belt chunks are buried (dead from now on, their records kept for
   * reports): read before, since a buried record may be reused at once */
  bool ub[VICTIMS], db[VICTIMS];
  for (unsigned k = 0; k < v->nunmap; k++)
    ub[k] = B(v->unmap[k])->chunk.flags & F_BELT;
  for (unsigned k = 0; k < v->ndrop; k++)
    db[k] = B(v->drop[k])->chunk.flags & F_BELT;
  for (unsigned k = 0; k < v->nunmap; k++)
    if (ub[k])
      bury(v->unmap[k]);
    else
      qm__unmap_forgotten(v->unmap[k]);
  for (unsigned k = 0; k < v->ndrop; k++) {
    block_t *b = B(v->drop[k]);
    if (db[k])
      bury(v->drop[k]);
    else
      qm__range_drop(LF.strategy, (void *)b->map.usable, b->map.dirty << qm__page_shift);
  }
  if (!v->nunmap && !v->ndrop)
    return;
  qm_lock(&S.lock);
  for (unsigned k = 0; k < v->nunmap; k++)
    if (!ub[k])
      qm__rec_free(v->unmap[k]);
  for (unsigned k = 0; k < v->ndrop; k++) {
    if (db[k])
      continue;
    block_t *b = B(v->drop[k]);
    b->map.dirty = 0;
    b->chunk.state = B_QUAR;
    qm__q_dropped(v->drop[k]);
  }
  L.unmaps += v->nunmap;
  L.drops += v->ndrop;
  qm_unlock(&S.lock);
  v->nunmap = v->ndrop = 0;
}

/* Enforces every quarantine limit, however many rounds it takes. */
static void enforce_all(size_t extra_maps) {
  victims_t v = {.nunmap = 0};
  bool more;
  do {
    qm_lock(&S.lock);
    more = qm__q_choose(&v, extra_maps);
    take_victims_locked(&v);
    qm_unlock(&S.lock);
    process_victims(&v);
  } while (more);
  qm__q_breach_warn();
}

/* Unmaps every quarantined chunk, or only the aged ones; returns whether
 * there was any. */
static bool unmap_all(bool unaged_too) {
  bool any = false;
  for (;;) {
    victims_t v = {.nunmap = 0};
    qm_lock(&S.lock);
    qm__q_choose_all(&v, unaged_too);
    take_victims_locked(&v);
    qm_unlock(&S.lock);
    if (!v.nunmap) {
      qm__q_breach_warn();
      return any;
    }
    any = true;
    process_victims(&v);
  }
}

/* A BUSY chunk that left the user, its range retired (dropped: its pages
 * gone), goes into the quarantine (under S.lock); returns whether the
 * caller must enforce_all(). Inaccessible there but under strategy none;
 * the windows of the quarantine and of the belt count from now. */
static bool enter_locked(uint32_t i, bool dropped) {
  block_t *b = B(i);
  if (dropped)
    b->map.dirty = 0;
  if (LF.strategy != QM_STRATEGY_NONE)
    b->map.rw = 0;
  b->chunk.seq = qm__rec_frees();
  b->chunk.state = B_QUAR;
  return qm__q_enter(i);
}

/* ---- initialisation ---- */

static void ensure_ready(void) {
  if (QM_LIKELY(atomic_load_explicit(&S.ready, memory_order_acquire)))
    return;
  qm_lock(&L.init_lock);
  if (!atomic_load_explicit(&S.ready, memory_order_relaxed)) {
    const qm_probe_result_t *r = qm__probe();
    LF.strategy = r->strategy;
    LF.fast = r->fast_dirty == 1;
    qm__q_init();
    LF.frames = (unsigned)qm__opt.stack_frames;
    qm__blk_reserve();
    long long sys = qm_os_read_number("/proc/sys/vm/max_map_count");
    if (sys <= 0)
      sys = 65530;
    size_t headroom = (size_t)sys / 8 > 256 ? (size_t)sys / 8 : 256;
    LF.map_budget = qm__opt.max_mappings     ? qm__opt.max_mappings
                    : (size_t)sys > headroom ? (size_t)sys - headroom
                                             : 1;
    /* the guarded slots keep their share (at most half; none if off) */
    LF.map_budget -= qm__guarded_maps_reserved(LF.map_budget);
    /* THP where the kernel offers it (madvise or always) */
    char thp[64];
    if (qm_os_read_file("/sys/kernel/mm/transparent_hugepage/enabled", thp, sizeof thp) > 0 &&
        !strstr(thp, "[never]")) {
      long long pmd = qm_os_read_number("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size");
      LF.thp_size = pmd > 0 && qm_is_pow2((size_t)pmd) ? (size_t)pmd : 0;
    }
    /* the belt: only where freed chunks keep their pages (protect), and
     * where the probe found moving them fault-free; the strategies that
     * drop pages keep their chunks in mappings of their own, reused in
     * place (as does protect where a move faulted). Not in a build under
     * AddressSanitizer: the sanitizer's shadow of every fresh range the
     * pages move to faults in, so reuse there is not fault-free. The way
     * pages move is the probe's (belt_way). */
    if (LF.strategy == QM_STRATEGY_PROTECT && r->belt_way != QM_BELT_IN_PLACE && !QM_ASAN)
      qm__belt_init(r->belt_way == QM_BELT_MOVE);
    LF.belt_way = LF.belt_base ? r->belt_way : QM_BELT_IN_PLACE;
    /* protect on a kernel without the fast path only for the belt's pool:
     * without a belt, chunks drop their pages as the probe would have had
     * them do (strategy auto) */
    if (LF.strategy == QM_STRATEGY_PROTECT && !LF.fast && !LF.belt_base &&
        qm__opt.strategy == QM_STRAT_AUTO)
      LF.strategy = r->guard_regions ? QM_STRATEGY_GUARD : QM_STRATEGY_DISCARD;
    if (LF.blk) /* else sealed once a later request reserves the table */
      qm__late_seal(qm__lfix);
    atomic_store_explicit(&S.ready, 1, memory_order_release);
  }
  qm_unlock(&L.init_lock);
}

/* ---- allocation ---- */

static void *fail_enomem(void) {
  errno = ENOMEM;
  return NULL;
}

/* Records a BUSY chunk as handed to the caller (under S.lock). Returns how
 * many of its first bytes may be non-zero: calloc must clear those. */
static size_t hand_out_locked(uint32_t i, size_t size, unsigned ashift, size_t need, size_t lead,
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
static void *hand_out_unlock(uint32_t i, size_t size, unsigned ashift, size_t need, size_t lead,
                             bool zero, bool reused, const trace_t *t, bool tidy) {
  size_t nonzero = hand_out_locked(i, size, ashift, need, lead, reused, t);
  bool over = qm__q_over();
  uintptr_t u = user_of(B(i));
  qm_unlock(&S.lock);
  if (tidy)
    qm__belt_tidy();
  if (over)
    enforce_all(0);
  if (zero && nonzero)
    memset((void *)u, 0, nonzero);
  return (void *)u;
}

/* The same, taking the lock. */
static void *hand_out(uint32_t i, size_t size, unsigned ashift, size_t need, size_t lead, bool zero,
                      bool reused, const trace_t *t) {
  qm_lock(&S.lock);
  return hand_out_unlock(i, size, ashift, need, lead, zero, reused, t, false);
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
  uint32_t i = carve_locked(cap, align, &r);
  qm_unlock(&S.lock);
  if (i == NIL)
    return NULL;
  if (open_afresh(r.usable, need << qm__page_shift, 0)) {
    uncarve(i, &r);
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
  return hand_out(i, size, ashift, need, lead, zero, false, t);
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
    j = carve_locked(o->map.cap, calign, &r);
    qm_unlock(&S.lock);
  }
  if (j == NIL) {
    bury(i);
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
    bury(i);
    return NULL;
  }
  /* moved RW, the pages need no opening: only those past them the request
   * takes are opened, or those it does not take closed (a misfit: they
   * stay resident, PROT_NONE, as under protect). Moved PROT_NONE, those it
   * takes are opened (one mapping: moved whole). The part past them is the
   * carved reservation: mapped afresh (open_afresh), one mapping; with no
   * advice, as the reservation had none there before. */
  int perr = open > moved ? open_afresh(r.usable + (moved << qm__page_shift),
                                        (open - moved) << qm__page_shift, 0)
                          : 0;
  if (!perr && !pooled)
    perr = qm_os_protect((void *)r.usable, (open < moved ? open : moved) << qm__page_shift,
                         QM_PROT_NONE, QM_PROT_RW);
  else if (!perr && open < moved)
    perr = qm_os_protect((void *)(r.usable + (open << qm__page_shift)),
                         (moved - open) << qm__page_shift, QM_PROT_RW, QM_PROT_NONE);
  if (perr) {
    uncarve(j, &r); /* the moved pages go with it */
    bury(i);
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
  bool work = bury_locked(i, false);
  return hand_out_unlock(j, size, ashift, open, open - pages, zero, true, t, work);
}

/* Settles the pieces' chunks once their pages moved (under S.lock): one
 * that gave all it had is dead (buried: its range and its emptied place in
 * the mirror are mapped afresh with the other dead ranges), one with pages
 * left stays pooled. Returns whether the caller must qm__belt_tidy(). */
static bool settle_pieces(const piece_t *pc, unsigned n) {
  bool work = false;
  for (unsigned k = 0; k < n; k++)
    if (qm__q_settle(pc[k].i))
      work |= bury_locked(pc[k].i, false);
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
    g->j = g->n && (got >= g->need || (all && !round)) ? carve_locked(g->cap, a, &g->r) : NIL;
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
  int perr = moved < need ? open_afresh(r.usable + (moved << qm__page_shift),
                                        (need - moved) << qm__page_shift, thp_advice(cap))
                          : 0;
  if (!perr && closed)
    perr = qm_os_protect((void *)r.usable, (moved < need ? moved : need) << qm__page_shift,
                         QM_PROT_NONE, QM_PROT_RW);
  if (!perr && open && moved > need)
    perr = qm_os_protect((void *)(r.usable + (need << qm__page_shift)),
                         (moved - need) << qm__page_shift, QM_PROT_RW, QM_PROT_NONE);
  if (perr) {
    uncarve(j, &r); /* the moved pages go with it */
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
  return hand_out_unlock(j, size, ashift, need, lead, zero, true, t, work);
}

/* A chunk the belt should carry takes a mapping of its own (no room on the
 * belt even grown, or its address space refused under RLIMIT_AS): its
 * range would come back after quarantine_min_frees, inside the window.
 * Under hardening=max the request fails instead (false); else the break is
 * counted in window_breaks (under S.lock, as the quarantine's) and warned
 * of once. */
static bool may_leave_window(void) { return qm__opt.hardening != QM_HARDENING_MAX; }
static void left_window(void) {
  qm_lock(&S.lock);
  qm__q_window_broken();
  qm_unlock(&S.lock);
  qm__q_breach_warn();
}

static void *fresh(size_t size, unsigned ashift, size_t need, size_t lead, size_t align, bool zero,
                   bool noreuse, const trace_t *t) {
  bool huge;
  size_t cap = shape(need, noreuse, &align, &huge);
  bool off_belt = use_belt(cap, noreuse);
  if (off_belt) {
    enforce_all(0);
    void *p = fresh_belt(size, ashift, need, lead, align, zero, cap, huge, t);
    if (p)
      return p;
    if (!may_leave_window())
      return fail_enomem();
  }
  enforce_all(3);
  qm_range_t r;
  int err = qm__range_map(LF.strategy, cap << qm__page_shift, align, need << qm__page_shift,
                          thp_advice(cap), &r);
  /* Out of address space, memory or mappings: unmapping quarantined chunks
   * may let the mapping succeed, and is done only where it can: never for a
   * request the kernel refuses whatever is freed (malloc(16 TiB) once
   * emptied the whole quarantine on its way to ENOMEM). The aged chunks go
   * first; the window (quarantine_min_frees, quarantine_min_mb) only in the
   * default profile, as the last resort (failing instead would leave a
   * program that freed everything unable to allocate again), counted and
   * warned of. Under hardening=max the request fails instead. */
  int rounds = qm__opt.hardening == QM_HARDENING_MAX ? 1 : 2;
  if (err == ENOMEM && !qm_os_could_map((cap << qm__page_shift) + align + 2 * qm__page,
                                        need << qm__page_shift, qm__q_mapped_bytes()))
    rounds = 0;
  for (int round = 0; err == ENOMEM && round < rounds; round++)
    if (unmap_all(round == 1))
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
    left_window();
  return hand_out(i, size, ashift, need, lead, zero, false, t);
}

/* Unmaps a BUSY chunk whose protection could not be changed, and forgets
 * it: never leave a chunk half-protected. */
static void discard_block(uint32_t i) {
  if (B(i)->chunk.flags & F_BELT) { /* its range stays the belt's, dead */
    bury(i);
    qm_lock(&S.lock);
    L.unmaps++; /* counted as the unmap it replaces */
    qm_unlock(&S.lock);
    return;
  }
  qm_lock(&S.lock);
  qm__forget(i);
  qm_unlock(&S.lock);
  qm__unmap_forgotten(i);
  qm_lock(&S.lock);
  qm__rec_free(i);
  L.unmaps++;
  qm_unlock(&S.lock);
}

void *qm__large_alloc(size_t size, size_t align, bool zero) {
  if (size > QM_MAX_REQUEST || align > QM_MAX_REQUEST)
    return fail_enomem();
  ensure_ready();
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
        size_t nonzero = hand_out_locked(i, size, ashift, open, open - pages, true, &t);
        bool over = qm__q_over();
        uintptr_t u = user_of(B(i));
        qm_unlock(&S.lock);
        if (over)
          enforce_all(0);
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
        return hand_out(i, size, ashift, open, open - pages, zero, true, &t);
      }
      discard_block(i);
    }
  }
  return fresh(size, ashift, need, lead, align, zero, noreuse, &t);
}

/* ---- free ---- */

/* Looks up a pointer about to be freed or resized; reports anything that is
 * not a live chunk's user pointer. Returns with S.lock held. */
static uint32_t find_live_locked(void *p, qm_op_t op) {
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
static bool unmap_on_free(const block_t *b) {
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

/* belt_way=move: the pages of a BUSY belt chunk that left the user move to
 * its place in the belt's mirror, RW as they are (mremap with
 * MREMAP_DONTUNMAP), and its own range, left empty, is mapped afresh
 * PROT_NONE (it merges back into the belt): a dangling pointer faults at
 * once, as under protect, and the record keeps its address for reports. At
 * reuse the pages move on with their write bits: no mprotect and no fault
 * on any kernel (move_reuse). Mapping the range afresh rather than
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
     * move_reuse); its pages are dropped */
    close_range(b, len);
    qm_lock(&S.lock);
    entomb_locked(i);
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
    enforce_all(0);
  return true;
}

/* Moves a BUSY chunk that left the user into the quarantine (or unmaps it
 * where the quarantine cannot hold it). */
static void retire_block(uint32_t i, bool unmap_now) {
  block_t *b = B(i);
  if (!unmap_now && (b->chunk.flags & F_BELT) && LF.belt_way == QM_BELT_MOVE) {
    if (!pool_block(i))
      bury(i);
    return;
  }
  if (!unmap_now) {
    int strat = LF.strategy;
    if (b->chunk.flags & F_NOREUSE && strat == QM_STRATEGY_PROTECT)
      strat = QM_STRATEGY_DISCARD; /* never reused: holding its pages is waste */
    bool dropped;
    if (qm__range_retire(strat, (void *)b->map.usable, b->map.rw << qm__page_shift, &dropped)) {
      discard_block(i);
      return;
    }
    qm_lock(&S.lock);
    bool over = enter_locked(i, dropped);
    qm_unlock(&S.lock);
    if (over)
      enforce_all(0);
    return;
  }
  discard_block(i);
}

void qm__large_free(void *p) {
  if (!atomic_load_explicit(&S.ready, memory_order_acquire))
    qm__report_bad_pointer(QM_OP_FREE, p);
  trace_t t;
  trace_capture(&t);
  uint32_t i = find_live_locked(p, QM_OP_FREE);
  block_t *b = B(i);
  b->chunk.state = B_BUSY;
  b->chunk.flags |= F_FREED;
  tail_sub(b);
  b->chunk.odo = qm__belt_odometer();
  b->chunk.seq = qm__note_free(i, &t);
  L.live--;
  live_bytes(0, b->chunk.size);
  bool none = LF.strategy == QM_STRATEGY_NONE, unmap_now = unmap_on_free(b);
  if (none && !unmap_now) { /* nothing to retire: straight in, one lock */
    bool over = enter_locked(i, false);
    qm_unlock(&S.lock);
    if (over)
      enforce_all(0);
    return;
  }
  qm_unlock(&S.lock);
  note_density(b); /* BUSY: its pages are still where the user had them */
  retire_block(i, unmap_now);
  if (unmap_now)
    qm__q_breach_warn();
}

size_t qm__large_usable(void *p, qm_op_t op) {
  if (!atomic_load_explicit(&S.ready, memory_order_acquire))
    qm__report_bad_pointer(op, p);
  uint32_t i = find_live_locked(p, op);
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
  uint32_t i = find_live_locked(p, op);
  size_t n = B(i)->chunk.size;
  *align = B(i)->chunk.ashift ? (size_t)1 << B(i)->chunk.ashift : QM_MIN_ALIGN;
  qm_unlock(&S.lock);
  return n;
}

/* ---- realloc ---- */

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
    uint32_t k = carve_locked(cap, huge ? LF.thp_size : 0, &r);
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
    err = open_afresh(r.usable + moved, (need << qm__page_shift) - moved, 0);
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
      uncarve(i, &r);
      return NULL;
    }
    /* a failed move may have unmapped a belt range: it is left as it is
     * (see move_reuse) */
    qm_lock(&S.lock);
    if (err == EINVAL)
      L.no_dontunmap = true; /* before Linux 5.7: copy from now on */
    qm__rec_free(i);
    qm_unlock(&S.lock);
    return NULL;
  }
  if (off_belt && !belt)
    left_window();
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
  o->chunk.odo = qm__belt_odometer();
  o->chunk.seq = qm__note_free(old, t);
  L.live--;
  live_bytes(0, o->chunk.size);
  bool unmap_now = unmap_on_free(o);
  qm_unlock(&S.lock);
  if (o->chunk.flags & F_BELT) /* its range is empty: dead at once, mapped afresh */
    bury(old);
  else
    retire_block(old, unmap_now);
  return (void *)u;
}

void *qm__large_realloc(void *p, size_t size) {
  if (size > QM_MAX_REQUEST)
    return fail_enomem();
  uint32_t i = find_live_locked(p, QM_OP_REALLOC);
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
          (err = open_afresh(b->map.usable + (kept << qm__page_shift),
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
        enforce_all(0);
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

/* ---- trim, flush, stats, fork ---- */

size_t qm__large_trim(void) {
  if (!atomic_load_explicit(&S.ready, memory_order_acquire))
    return 0;
  size_t total = 0;
  for (;;) {
    victims_t v = {.nunmap = 0};
    qm_lock(&S.lock);
    total += qm__q_choose_resident(&v);
    take_victims_locked(&v);
    qm_unlock(&S.lock);
    if (!v.ndrop)
      return total;
    process_victims(&v);
  }
}

#ifdef QM_TEST_HOOKS
void qm__large_flush(void) {
  if (atomic_load_explicit(&S.ready, memory_order_acquire))
    unmap_all(true);
  atomic_store_explicit(&density, DENSE_ONE, memory_order_relaxed); /* learnt afresh */
}
#endif

void qm__large_stats(qm_stats_t *s) {
  if (!atomic_load_explicit(&S.ready, memory_order_acquire))
    return;
  qm_lock(&S.lock);
  s->large_live_chunks = L.live;
  s->large_live_bytes = L.live_bytes;
  size_t maps, peak, mapped;
  qm__rec_stats(&maps, &peak, &mapped);
  s->large_mapped_bytes = mapped;
  s->large_allocs = L.allocs;
  s->large_frees = qm__rec_frees();
  s->reuses = L.reuses;
  s->fresh_maps = L.fresh;
  s->faults_avoided = L.avoided;
  s->realloc_in_place = L.in_place;
  s->realloc_moved = L.moved;
  s->mappings_estimate = maps;
  s->mappings_budget = LF.map_budget;
  s->strategy = LF.strategy;
  s->unmaps = L.unmaps;
  s->drops = L.drops;
  qm__q_stats(s);
  s->belt_moves = L.belt_moves;
  s->belt_fresh = L.belt_fresh;
  s->belt_way = LF.belt_way;
  s->belt_pooled = L.belt_pooled;
  s->belt_gathers = L.belt_gathers;
  s->belt_pieces = L.belt_pieces;
  qm_unlock(&S.lock);
  qm__belt_stats(&s->belt_reserved_bytes, &s->belt_window_bytes, &s->belt_mappings);
}

size_t qm__large_mappings_peak(void) {
  qm_lock(&S.lock);
  size_t maps, n, mapped;
  qm__rec_stats(&maps, &n, &mapped);
  qm_unlock(&S.lock);
  return n;
}

size_t qm__large_object_size(uintptr_t a) {
  if (!atomic_load_explicit(&S.ready, memory_order_acquire))
    return SIZE_MAX;
  size_t r = SIZE_MAX;
  qm_lock(&S.lock);
  uint32_t i = qm__rec_find(a);
  if (i != NIL) {
    const block_t *b = B(i);
    uintptr_t u = user_of(b);
    r = b->chunk.state == B_LIVE && a >= u && a - u < b->chunk.size ? b->chunk.size - (a - u) : 0;
  }
  qm_unlock(&S.lock);
  return r;
}

/* The secondary's part of the fork lock order: its init lock, the probe
 * lock (taken inside it by ensure_ready), its own lock, then the belt's
 * (taken inside it). */
void qm__large_fork_prepare(void) {
  qm_fork_lock(&L.init_lock);
  qm__probe_fork_prepare();
  qm_fork_lock(&S.lock);
  qm__belt_fork_prepare();
}
void qm__large_fork_parent(void) {
  qm__belt_fork_parent();
  qm_unlock(&S.lock);
  qm__probe_fork_parent();
  qm_unlock(&L.init_lock);
}
/* A chunk another thread had BUSY at fork stays BUSY in the child: its
 * owner does not exist there, so the chunk is simply never touched again. */
void qm__large_fork_child(void) {
  qm__unwind_fork_child();
  qm__belt_fork_child();
  qm_lock_reinit(&S.lock);
  qm__probe_fork_child();
  qm_lock_reinit(&L.init_lock);
}
