/* quarantine_limits.c: the quarantine's limits (chunk cap, mapping budget,
 * resident budget, the window) and the chunks that go when one is passed:
 * unmapped oldest first, or dropping their pages, least asked-for sizes
 * first. Under S.lock (but qm__q_mapped_bytes, which takes it); it chooses,
 * the secondary marks the chosen BUSY and works on them.
 */
#include "quarantine.h"

#include "large_record.h"
#include "options.h"
#include "out.h"
#include "quarantine_state.h"
#include "strategy.h"

/* ---- victims: chunks leaving the quarantine (unmapped) or losing their
 * pages (dropped), chosen here under the lock; the secondary marks them
 * BUSY under the same hold and works on them without it ---- */

/* Takes the oldest quarantined chunk to be unmapped: an aged one, or with
 * `unaged_too` any, counted in window_breaks if it was in the window (only
 * the default profile asks that, past the mapping budget or when a mapping
 * failed: see fresh() in secondary.c). Aged chunks are the FIFO's prefix up
 * to Q.age. A chunk not about to be buried is forgotten at once: its
 * mappings no longer count against the budget the next choice reads. */
static bool take_unmap_victim(victims_t *v, bool unaged_too) {
  bool window = false;
  for (uint32_t k = 0; k < Q.fifo.n; k++) {
    if (k == Q.age) {
      if (!unaged_too)
        break;
      window = true;
    }
    uint32_t i = qm_q_fifo_at(k);
    if (i == QM_AGE_EMPTY || B(i)->chunk.state != B_QUAR)
      continue;
    qm__q_unlink(i);
    bool belt = B(i)->chunk.flags & F_BELT; /* buried: its range stays the belt's */
    if (!belt)
      qm__forget(i);
    v->unmap[v->nunmap++] = i;
    Q.window_breaks += window && !belt;
    return true;
  }
  return false;
}

size_t qm__q_mapped_bytes(void) {
  size_t n = 0;
  qm_lock(&S.lock);
  for (uint32_t k = 0; k < Q.fifo.n; k++) {
    uint32_t i = qm_q_fifo_at(k);
    if (i != QM_AGE_EMPTY && B(i)->chunk.state == B_QUAR)
      n += B(i)->map.span;
  }
  qm_unlock(&S.lock);
  return n;
}

void qm__q_breach_warn(void) {
  static atomic_bool warned;
  if (!__atomic_load_n(&Q.window_breaks, __ATOMIC_RELAXED) ||
      atomic_exchange_explicit(&warned, true, memory_order_relaxed))
    return;
  qm_buf_t b;
  b.n = 0;
  qm_buf_str(&b, "out of memory, address space or mappings: freed large chunks unmapped before "
                 "their quarantine window passed, or large chunks given mappings of their own "
                 "off the belt, reused sooner (see window_breaks in the stats; "
                 "hardening=max fails the request instead)");
  qm__warn_buf(&b);
}

/* The resident pages the budget covers: quarantined chunks' and the ones
 * live chunks hold past their RW part. */
static size_t resident_pages(void) { return Q.qresident + Q.ltail; }

/* quarantine_mb, or less where the live large heap is small: at most
 * quarantine_live_pct of the bytes live large chunks were asked for, but
 * never below quarantine_floor_mb: a heap that frees and asks again for
 * chunks of random sizes finds them resident, fault-free, only where the
 * pool holds several of each (large churn, 128 KiB..4 MiB, 1 thread,
 * holds 6 MiB at W=1, 14-22 at W=8, about 50 at W=64, at 0.003 faults/op;
 * a floor of 16 MiB, or 400% with it, took W=8 to 1.5-2.5 faults/op, its
 * live heap a few MiB; at 2 threads it holds about 30 MiB, and 400% with a
 * floor of 32 dropped 6-15 chunks in 600 ops, 0.003-0.007 faults/op against
 * 0.002; 800%, none). A fixed 96 MiB kept that much
 * resident beside a heap of a few MiB: a buffer grown to 8 MiB then freed,
 * again and again, peaked at 93 MiB of RSS against glibc's 9.5. Only what
 * is resident is bounded: a chunk that loses its pages stays mapped and
 * inaccessible, in the window as before. */
static size_t budget_pages(void) {
  size_t cap = (size_t)qm__opt.quarantine_mb << 20, pct = qm__opt.quarantine_live_pct;
  if (pct) {
    size_t follow = Q.live / 100 * pct, floor = (size_t)qm__opt.quarantine_floor_mb << 20;
    if (Q.live / 100 > SIZE_MAX / pct)
      follow = SIZE_MAX;
    if (follow < floor)
      follow = floor;
    if (follow < cap)
      cap = follow;
  }
  return cap >> qm__page_shift;
}

/* Whether the quarantine is past one of its limits (under S.lock). */
bool qm__q_over_maps(size_t maps) {
  return Q.qcount > qm__opt.quarantine_max_chunks || maps > LF.map_budget ||
         resident_pages() > budget_pages();
}

bool qm__q_over(void) { return qm__q_over_maps(qm__rec_maps()); }

/* The aged resident chunk least likely to be asked for: from the hot bin
 * with the most chunks for the requests lately made of the sizes it serves
 * (its own class and the two below: within reuse_max_waste_pct), the
 * larger class on a tie. NIL if no aged chunk has a page resident. */
static uint32_t surplus_victim(void) {
  unsigned best = NBINS;
  uint64_t best_n = 0, best_d = 1;
  for (unsigned c = 0; c < NBINS; c++) {
    if (!Q.nhot[c])
      continue;
    uint64_t d =
        1 + (uint64_t)Q.demand[c] + (c ? Q.demand[c - 1] : 0) + (c > 1 ? Q.demand[c - 2] : 0);
    /* n / d >= best_n / best_d, compared without dividing */
    if (best == NBINS || Q.nhot[c] * best_d >= best_n * d) {
      best = c;
      best_n = Q.nhot[c];
      best_d = d;
    }
  }
  return best == NBINS ? NIL : Q.hot[best];
}

static bool chosen_to_drop(const victims_t *v, uint32_t i) {
  for (unsigned k = 0; k < v->ndrop; k++)
    if (v->drop[k] == i)
      return true;
  return false;
}

/* The youngest quarantined chunk with pages resident: the last to be reused,
 * so the one whose pages are dropped when only the window is left. Not one
 * chosen already (it is still QUAR until the secondary marks it). */
static uint32_t youngest_resident(const victims_t *v) {
  for (uint32_t k = Q.fifo.n; k-- > 0;) {
    uint32_t i = qm_q_fifo_at(k);
    if (i != QM_AGE_EMPTY && B(i)->chunk.state == B_QUAR && B(i)->map.dirty &&
        !chosen_to_drop(v, i))
      return i;
  }
  return NIL;
}

/* A chunk to lose its pages: out of the bins and its pages no longer
 * counted (a belt chunk, buried, leaves the quarantine). */
static void take_drop_victim(victims_t *v, uint32_t i) {
  if (B(i)->chunk.flags & F_BELT) { /* buried: it leaves the quarantine */
    qm__q_unlink(i);
  } else {
    qm__q_bin_remove(i);            /* binned again, cold, once its pages are gone */
    Q.qresident -= B(i)->map.dirty; /* counted as gone now; the drop follows */
  }
  v->drop[v->ndrop++] = i;
}

/* The cap counts aged chunks only: the window wins over it. Past the
 * resident budget the aged chunks of the least asked-for sizes lose their
 * pages first (the oldest, as before, were the ones next in line for
 * reuse), and only then the youngest chunks in the window. A chunk without
 * pages stays mapped, cold: reusing it saves an mmap. */
bool qm__q_choose(victims_t *v, size_t extra_maps) {
  qm__q_age();
  while (v->nunmap < VICTIMS && Q.qcount > qm__opt.quarantine_max_chunks)
    if (!take_unmap_victim(v, false))
      break;
  /* the window goes only in the default profile: under hardening=max the
   * mapping budget is exceeded instead, until a mapping fails */
  bool keep_window = qm__opt.hardening == QM_HARDENING_MAX;
  while (v->nunmap < VICTIMS && qm__rec_maps() + extra_maps > LF.map_budget)
    if (!take_unmap_victim(v, false) && (keep_window || !take_unmap_victim(v, true)))
      break;
  size_t budget = budget_pages();
  while (resident_pages() > budget && Q.qresident && v->nunmap < VICTIMS && v->ndrop < VICTIMS) {
    uint32_t i = surplus_victim();
    if (i == NIL)
      i = youngest_resident(v);
    if (i == NIL)
      break;
    take_drop_victim(v, i);
  }
  return v->nunmap == VICTIMS || v->ndrop == VICTIMS;
}

void qm__q_choose_all(victims_t *v, bool unaged_too) {
  qm__q_age();
  while (v->nunmap < VICTIMS && take_unmap_victim(v, unaged_too))
    ;
}

size_t qm__q_choose_resident(victims_t *v) {
  size_t bytes = 0;
  /* by position from the oldest as it was: a belt chunk taken leaves the
   * FIFO, and the head may move past its emptied entry; nothing enters
   * meanwhile */
  qm_age_t walk = Q.fifo;
  for (uint32_t k = 0; k < walk.n && v->ndrop < VICTIMS; k++) {
    uint32_t i = LF.qring[qm_age_at(&walk, k, Q.cap)];
    if (i == QM_AGE_EMPTY)
      continue;
    block_t *b = B(i);
    if (b->chunk.state != B_QUAR || !b->map.dirty)
      continue;
    bytes += b->map.dirty << qm__page_shift;
    take_drop_victim(v, i);
  }
  return bytes;
}
