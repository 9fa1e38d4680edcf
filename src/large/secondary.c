/* secondary.c: large chunks, the core of the secondary: its state L, what
 * its files share (secondary_int.h), set-up, the burial of belt chunks, the
 * work on chunks the quarantine lets go, trim, stats and fork. A request
 * is served by large_alloc.c, a free by large_free.c, a resize by
 * large_realloc.c. It orchestrates the parts that own the rest: the records
 * (large_record.c), the quarantine (quarantine.c), the belt's address
 * space (belt.c); reports read the records (large_report.c). Invariants:
 * only these four files change a chunk's state (LIVE, QUAR, BUSY, DEAD);
 * they write the map and chunk parts of a record (large.h), and no other,
 * only under S.lock or as the one thread that marked the chunk BUSY; no
 * syscall is made under S.lock except growing the record table; a LIVE
 * chunk is RW exactly on [usable, usable + rw pages) and inaccessible
 * elsewhere in its mapping; a QUAR chunk is inaccessible throughout
 * (strategy none aside). Under S.lock only the belt's lock is taken (a
 * leaf). Calls go down only: to the quarantine, the records, the belt, the
 * probe and the OS layer.
 */
#include "secondary.h"

#include <string.h>

#include "guarded.h"
#include "os.h"
#include "probe.h"
#include "secondary_int.h"

qm_sec_t L = {.init_lock = QM_LOCK_INIT};

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
_Atomic uint32_t qm__sec_density = DENSE_ONE;

/* Folds the share of a freed chunk's pages that are resident into the
 * average (one mincore, of its first MiB at most): chunks of base pages
 * only, of at least 32 pages, under the strategies that give THP. */
void qm__sec_note_density(const block_t *b) {
  size_t pages = b->map.rw > b->map.lead ? b->map.rw - b->map.lead : 0;
  if (!LF.thp_size || (b->chunk.flags & F_HUGE) || pages < 32 ||
      (LF.strategy != QM_STRATEGY_PROTECT && LF.strategy != QM_STRATEGY_NONE))
    return;
  if (pages > 256)
    pages = 256;
  long n = qm_os_resident_pages((void *)user_of(b), pages << qm__page_shift);
  if (n < 0)
    return;
  uint32_t d = atomic_load_explicit(&qm__sec_density, memory_order_relaxed);
  uint32_t share = (uint32_t)((size_t)n * DENSE_ONE / pages);
  atomic_store_explicit(&qm__sec_density, d - d / 8 + share / 8, memory_order_relaxed);
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
int qm__sec_open_afresh(uintptr_t p, size_t len, int adv) {
  if (!len)
    return 0;
  int err = qm_os_map_fixed((void *)p, len, QM_PROT_RW);
  if (!err && adv > 0)
    qm_os_hugepage((void *)p, len);
  else if (!err && adv < 0)
    qm_os_nohugepage((void *)p, len);
  return err;
}

/* Carves a range from the belt with a record for it (BUSY); NIL if either
 * cannot be had. The dead records of the segments it enters go first. */
uint32_t qm__sec_carve_locked(size_t cap, size_t align, qm_range_t *r) {
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
void qm__sec_uncarve(uint32_t i, const qm_range_t *r) {
  bool clean = qm__belt_clean(r->base, r->span) == 0;
  qm_lock(&S.lock);
  qm__rec_free(i);
  bool work = qm__belt_release(r->base, r->span, 0, 0, clean);
  qm_unlock(&S.lock);
  if (work)
    qm__belt_tidy();
}

/* A chunk the belt should carry took a mapping of its own
 * (may_leave_window): the break is counted and warned of. */
void qm__sec_left_window(void) {
  qm_lock(&S.lock);
  qm__q_window_broken();
  qm_unlock(&S.lock);
  qm__q_breach_warn();
}

/* ---- a chunk's end: burial on the belt, or discarded ---- */

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
bool qm__sec_bury_locked(uint32_t i, bool clean) {
  block_t *b = B(i);
  entomb(i);
  bool work = qm__belt_release(b->map.base, b->map.span, b->chunk.odo, b->chunk.seq, clean);
  keep_dead(i);
  return work;
}

/* The same for a chunk whose range is never given back to the belt (a
 * failed move may have left a hole in the mirror where its pages were to
 * go): its segments are never carved again. */
void qm__sec_entomb_locked(uint32_t i) {
  entomb(i);
  keep_dead(i);
}

/* The same, its pages dropped first: its range mapped afresh, or for a
 * pooled chunk (its range mapped afresh at free) its place in the mirror. */
void qm__sec_bury(uint32_t i) {
  block_t *b = B(i);
  bool clean = b->chunk.pool & P_POOLED ? qm__belt_clean_shadow(b->map.base, b->map.span) == 0 &&
                                              (b->chunk.pool & P_CLEAN)
                                        : qm__belt_clean(b->map.base, b->map.span) == 0;
  qm_lock(&S.lock);
  bool work = qm__sec_bury_locked(i, clean);
  qm_unlock(&S.lock);
  if (work)
    qm__belt_tidy();
}

/* Unmaps a BUSY chunk whose protection could not be changed, and forgets
 * it: never leave a chunk half-protected. */
void qm__sec_discard_block(uint32_t i) {
  if (B(i)->chunk.flags & F_BELT) { /* its range stays the belt's, dead */
    qm__sec_bury(i);
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
      qm__sec_bury(v->unmap[k]);
    else
      qm__unmap_forgotten(v->unmap[k]);
  for (unsigned k = 0; k < v->ndrop; k++) {
    block_t *b = B(v->drop[k]);
    if (db[k])
      qm__sec_bury(v->drop[k]);
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
void qm__sec_enforce_all(size_t extra_maps) {
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
bool qm__sec_unmap_all(bool unaged_too) {
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

/* ---- initialisation ---- */

void qm__sec_ensure_ready(void) {
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
    qm__sec_unmap_all(true);
  atomic_store_explicit(&qm__sec_density, DENSE_ONE, memory_order_relaxed); /* learnt afresh */
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
 * lock (taken inside it by qm__sec_ensure_ready), its own lock, then the belt's
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
