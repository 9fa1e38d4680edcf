/* quarantine_reuse.c: which pooled chunk a large request reuses: the
 * reuse choice among the aged chunks of the bins (drawn at random among
 * equal fits) and the gathering of a chunk from pooled belt pages. Under
 * S.lock; it takes chunks out of the bins and lowers their resident counts,
 * and leaves every chunk's state to the secondary. No state of its own.
 */
#include "quarantine.h"

#include "large_record.h"
#include "options.h"
#include "quarantine_state.h"
#include "strategy.h"

/* ---- the reuse choice (under S.lock) ---- */

/* Which aged chunk a request gets, among those that fit equally well: two
 * runs of a program, and two fork children of one process, reuse chunks in
 * different orders, so an exploit cannot groom which freed chunk a request
 * gets. Drawn under S.lock. */
static uint32_t rnd_below(uint32_t n) { return qm_rng_below(&Q.rng, n); }

/* Counts a request of `need` pages in its class; halves every count now and
 * then, so that the counts follow what the program asks for lately. */
static void demand_note(size_t need) {
  Q.demand[pclass(need)]++;
  if (++Q.demand_clock < DEMAND_HALF)
    return;
  Q.demand_clock = 0;
  for (unsigned c = 0; c < NBINS; c++)
    Q.demand[c] /= 2;
}

/* The aged chunk that serves `need` pages, or NIL (a fresh mapping then).
 * In order of preference:
 *  1. a chunk whose resident pages cover the request with at most
 *     reuse_max_waste_pct to spare: no fault at all. Chosen at random among
 *     those seen with at most a quarter to spare, else among the rest (with
 *     the quarantine off, the newest: its memory is the warmest); capacity
 *     beyond the resident pages is address space only.
 *  2. the cheapest of the rest that fits, counting a fault per page to
 *     fault in and half one per page of waste: one with fewer resident
 *     pages faults in only the difference, one with up to 4x the resident
 *     pages wastes some (its extra pages stay resident, inaccessible,
 *     counted against quarantine_mb while it is live); taken if it costs
 *     less than a fresh mapping, which faults in every page.
 *  3. a chunk with no page resident and at most the same spare capacity:
 *     saves the mmap (the only choice under discard and guard).
 * In a THP chunk (F_HUGE) the request is opened in whole huge pages: it
 * faults in what of them is not resident, and its lead counts as waste, so
 * a 400-page request takes a resident 2 MiB chunk fault-free (112 pages to
 * spare) instead of faulting in a fresh mapping. Before this, fresh chunks
 * of a few hundred pages were most of large churn's faults (W=8: 2-5 in 600
 * ops, each faulting in every page).
 * Measured in large churn (W=8, the 32 MiB window, 600 ops after 5000):
 * fitting by capacity alone, oldest first, with the oldest chunks' pages
 * dropped first, took 1.3 faults/op at quarantine_mb=96 (the drops hit the
 * chunks next in line) and needed 128 to get to 0.03; this takes 0.005-0.26
 * at 96. Random or oldest-first among the fault-free chunks made no
 * difference to the misses (simulated); best fit (fewest pages) doubled
 * them, as larger requests then found their chunks taken. Drawing among the
 * close fits first: in 600 ops after 1500 (the quarantine still filling)
 * 0.45 faults/op median of 8 runs, 0.28..0.65, against 0.76, 0.01..1.65
 * drawing among all fits; 2 threads 0.71 against 1.72 (3 runs). */
uint32_t qm__q_fit(size_t need, size_t align, bool *whole) {
  bool newest = LF.strategy == QM_STRATEGY_NONE;
  /* with the quarantine off the freed chunks are only a cache, and one that
   * fits nothing only grows the set of chunks until the budget drops pages
   * that then refault (measured: 0.6 faults/op in 2-thread churn at 50%,
   * 0.01 at 300%) */
  size_t waste = qm__opt.reuse_max_waste_pct;
  if (newest && waste < 300)
    waste = 300;
  size_t hot_max = need + need * waste / 100, far = need * 4;
  if (far < hot_max)
    far = hot_max;
  demand_note(need);
  size_t close_max = need + need / 4;
  uint32_t pick = NIL, alt = NIL;
  size_t alt_cost = SIZE_MAX;
  bool pick_close = false;
  unsigned fits = 0, scanned = 0;
  for (unsigned c = pclass(need); c <= pclass(far) && scanned < SCAN; c++) {
    for (uint32_t i = Q.hot[c]; i != NIL && scanned < SCAN; i = B(i)->q.next, scanned++) {
      const block_t *b = B(i);
      if (b->map.cap < need || (b->map.usable & (align - 1)))
        continue;
      /* what the request would open here (whole huge pages in a THP
       * chunk); the lead that adds is waste like any other page to spare */
      size_t n = qm_need_in(b, need, align);
      if (b->map.dirty >= n && b->map.dirty <= hot_max) {
        /* a close fit (at most a quarter to spare) beats a loose one: the
         * loose ones are left to the larger requests they also fit */
        bool close = b->map.dirty <= close_max;
        if (pick != NIL && pick_close && !close)
          continue;
        bool restart = pick != NIL && close && !pick_close; /* the draw starts again */
        fits = restart ? 1 : fits + 1;
        if (restart ||
            (newest ? pick == NIL || b->chunk.seq > B(pick)->chunk.seq : rnd_below(fits) == 0)) {
          pick = i;
          pick_close = close;
        }
        continue;
      }
      size_t faults = n > b->map.dirty ? n - b->map.dirty : 0;
      size_t cost = faults + ((b->map.dirty > n ? b->map.dirty : n) - need) / 2;
      if (b->map.dirty <= far && cost < alt_cost) {
        alt = i;
        alt_cost = cost;
      }
    }
    if (pick != NIL && c >= pclass(hot_max))
      break; /* past here no chunk is fault-free within the waste */
  }
  *whole = pick != NIL;
  if (pick != NIL)
    return pick;
  if (alt != NIL && alt_cost < need) {
    *whole = B(alt)->map.dirty >= qm_need_in(B(alt), need, align); /* a loose fit */
    return alt;
  }
  fits = 0;
  for (unsigned c = pclass(need); c <= pclass(hot_max) && c < NBINS; c++) {
    scanned = 0;
    for (uint32_t i = Q.cold[c]; i != NIL && scanned < SCAN; i = B(i)->q.next, scanned++) {
      const block_t *b = B(i);
      if (b->map.cap < need || b->map.cap > hot_max || (b->map.usable & (align - 1)))
        continue;
      fits++;
      if (newest ? pick == NIL || b->chunk.seq > B(pick)->chunk.seq : rnd_below(fits) == 0)
        pick = i;
    }
  }
  return pick;
}

/* ---- gathering: a chunk assembled from pooled pages (under S.lock) ----
 *
 * Where no pooled chunk's resident pages cover a request within the waste
 * allowed (q_fit), the request used to fault in what they did not cover (a
 * misfit), or all of it in a fresh chunk; in large churn that was every
 * fault left once the pool had formed (W=64, 3000 ops after 2000: 4-11
 * fresh chunks and 17-19 misfits, 700-1300 faults). On the belt pages and
 * addresses part ways, so any pooled pages serve any request: the new
 * chunk, carved afresh, is filled with pieces moved from one or more
 * pooled chunks, each piece one mremap (secondary.c, gather_reuse).
 * Which pages: a chunk that covers what is left with the fewest pages to
 * spare gives exactly that (from its tail: its record keeps the rest,
 * still pooled, at the same place, and its range stays its own); where
 * none covers it, the one with the most pages gives all of them and the
 * search goes on. That keeps the pieces few (a request larger than any
 * pooled chunk takes the largest first) and splits no chunk that a
 * smaller one could serve whole, so the pool does not crumble into
 * slivers. Age plays no part: a belt chunk's range waits for the belt,
 * not for its pages. */

/* What a gathering takes pieces of: chunks of huge pages (their pages
 * PMD-mapped: whole huge pages of them, 2 MiB-aligned), or the others.
 * A huge page is never split: cutting a piece out of one splits its PMD
 * into 512 PTEs for good, and on a VM that shadows page tables each PTE
 * moved costs about 5 us at its next touch (gathering from any chunk at
 * any offset took large churn from 450 to 60-110 ops/s at W=8). */
enum { G_SMALL, G_HUGE };

/* A chunk whose pages a gathering may take: pooled on the belt (QUAR,
 * binned, pages resident), its pages at most vmax mappings, of the kind
 * asked for. In-place chunks are reused where they are. */
static unsigned g_kind;
static bool gatherable(const block_t *b, unsigned vmax) {
  if (!(b->chunk.flags & F_BELT) || b->chunk.state != B_QUAR || !b->map.dirty ||
      b->chunk.extra_vmas >= vmax)
    return false;
  size_t hp = LF.thp_size >> qm__page_shift;
  if (g_kind == G_SMALL)
    return !(b->chunk.flags & F_HUGE);
  return (b->chunk.flags & F_HUGE) && hp && b->map.dirty % hp == 0;
}

/* The gatherable chunk with the fewest resident pages, at least n: in the
 * first class that has one (a class above n's holds only chunks that cover
 * n; in n's own, some may hold fewer). NIL if none. */
static uint32_t least_covering(size_t n, unsigned vmax) {
  for (unsigned c = pclass(n); c < NBINS; c++) {
    if (!Q.nhot[c])
      continue;
    uint32_t best = NIL;
    unsigned scanned = 0;
    for (uint32_t i = Q.hot[c]; i != NIL && scanned < SCAN; i = B(i)->q.next, scanned++) {
      const block_t *b = B(i);
      if (gatherable(b, vmax) && b->map.dirty >= n &&
          (best == NIL || b->map.dirty < B(best)->map.dirty))
        best = i;
    }
    if (best != NIL)
      return best;
  }
  return NIL;
}

/* The gatherable chunk with the most resident pages, at most `most` (of
 * the highest class that has one), NIL if none. */
static uint32_t most_resident(size_t most, unsigned vmax) {
  for (unsigned c = pclass(most) + 1; c-- > 0;) {
    if (!Q.nhot[c])
      continue;
    uint32_t best = NIL;
    unsigned scanned = 0;
    for (uint32_t i = Q.hot[c]; i != NIL && scanned < SCAN; i = B(i)->q.next, scanned++) {
      const block_t *b = B(i);
      if (gatherable(b, vmax) && b->map.dirty <= most &&
          (best == NIL || b->map.dirty > B(best)->map.dirty))
        best = i;
    }
    if (best != NIL)
      return best;
  }
  return NIL;
}

/* Adds pieces of the kind g_kind asks for to p[*n], while pages are left
 * and pieces and mappings allowed; whether it stopped for want of pooled
 * pages (none left of the kind that fit). */
static bool gather_kind(size_t cap, piece_t *p, unsigned *n, unsigned max, size_t *left,
                        size_t *total, unsigned *vleft) {
  /* a chunk's pages are split only where what it keeps is a chunk's worth
   * (128 KiB, the least large request): splitting off all but a sliver
   * left the pool full of slivers, each a record and a mapping, that no
   * request could use but as one more piece */
  size_t min_rest = ((size_t)128 << 10) >> qm__page_shift;
  size_t hp = LF.thp_size >> qm__page_shift;
  while (*left && *n < max && *vleft) {
    /* huge pages only while a whole one is wanted */
    if (g_kind == G_HUGE && *left < hp)
      return false;
    size_t take = 0, want = g_kind == G_HUGE ? *left / hp * hp : *left;
    /* one that covers what is left, whole if it has only a few pages to
     * spare and they fit the new chunk */
    uint32_t i = least_covering(want, *vleft);
    if (i != NIL && B(i)->map.dirty - want >= min_rest) /* its tail, then */
      i = NIL;
    if (i != NIL && *total + B(i)->map.dirty > cap)
      i = NIL;
    if (i != NIL)
      take = B(i)->map.dirty;
    /* else the tail of one that keeps a chunk's worth, of a single mapping
     * if one is (or, if none keeps that much, a sliver of one). A tail of
     * several mappings counts all of them against the new chunk's
     * allowance, as a whole chunk's do: before it was taken too, a pool of
     * gathered chunks (two huge pages, two mappings each) gave nothing to
     * the smaller requests, which then faulted in fresh chunks (large churn
     * W=8, 600 ops after 1508: 2-5 fresh chunks, 0.2-1.5 faults/op; after,
     * none, 0.003) */
    if (i == NIL && (i = least_covering(want + min_rest, 1)) == NIL &&
        (i = least_covering(want + min_rest, *vleft)) == NIL)
      i = least_covering(want, 1);
    if (i != NIL && !take)
      take = want;
    /* else all of the largest that fits the new chunk, and on */
    if (i == NIL && (i = most_resident(cap - *total, *vleft)) != NIL)
      take = B(i)->map.dirty;
    if (i == NIL)
      return true;
    block_t *b = B(i);
    *vleft -= b->chunk.extra_vmas + 1u;
    /* out of the bins (the secondary marks it BUSY), its place in the
     * FIFO kept; what it gives is no longer the quarantine's */
    qm__q_bin_remove(i);
    b->map.dirty -= take;
    Q.qresident -= take;
    p[(*n)++] = (piece_t){.i = i, .off = b->map.dirty, .n = take, .vmas = b->chunk.extra_vmas + 1u};
    *left -= take < *left ? take : *left;
    *total += take;
  }
  return false;
}

unsigned qm__q_gather(size_t need, size_t cap, bool huge, piece_t *p, unsigned max, size_t *got,
                      bool *all) {
  size_t left = need, total = 0, held = Q.qresident;
  unsigned n = 0, vleft = MAX_GATHER_VMAS;
  qm__q_age();
  /* a chunk of huge pages takes whole huge pages, each landing 2 MiB-
   * aligned (the chunk starts so): they move PMD by PMD and stay huge; a
   * smaller chunk takes small pages. Each kind serves its own: huge
   * chunks filled up with small pages took them from the small requests,
   * which cannot take huge pages apart, and these then faulted in fresh
   * chunks beside a pool of huge pages (W=64: 14-27 fresh chunks in 3000
   * ops against 4-9) */
  g_kind = huge && LF.thp_size ? G_HUGE : G_SMALL;
  bool dry = gather_kind(cap, p, &n, max, &left, &total, &vleft);
  /* a request larger than all the quarantine holds takes all of it that
   * it can: growing tables, each freed when the next is made, otherwise
   * left every older one's pages pooled for requests that never came
   * (python3 dict churn: 0.3-0.6 MB of its peak RSS) */
  *all = dry && held < need;
  *got = total;
  return n;
}

bool qm__q_settle(uint32_t i) {
  block_t *b = B(i);
  if (b->map.dirty) {
    qm__q_bin_insert(i);
    return false;
  }
  qm__q_unlink(i);
  return true;
}

void qm__q_ungather(const piece_t *p, unsigned n) {
  for (unsigned k = 0; k < n; k++) {
    block_t *b = B(p[k].i);
    b->map.dirty += p[k].n;
    Q.qresident += p[k].n;
    qm__q_bin_insert(p[k].i);
  }
}
