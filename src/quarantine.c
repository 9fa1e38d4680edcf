/* quarantine.c: freed large chunks between their free and their reuse or
 * unmapping: the FIFO (an aging queue of records, oldest first, Q.age its
 * aged prefix), the hot and cold bins of aged chunks (lists through the
 * records), the limits (chunk cap, mapping budget, resident budget) and
 * the chunks that go when one is passed, the reuse choice and the
 * gathering of pooled pages. Its state is Q, private to this file, under
 * S.lock; it makes no syscall and changes no chunk's state (the secondary
 * does, and works on the chunks chosen here). Of a record it writes the q
 * part (large.h), and a pooled chunk's dirty pages as it gathers from it.
 * The window: a freed chunk stays mapped and out of every bin until
 * quarantine_min_frees large frees and quarantine_min_mb MiB of them came
 * after it (only the mapping budget unmaps it earlier); a chunk in a bin
 * is always QUAR and aged.
 */
#include "quarantine.h"

#include "large_record.h"
#include "options.h"
#include "out.h"
#include "strategy.h"

/* The quarantine's state, all of it under S.lock. */
static struct {
  /* the FIFO, oldest first: positions of LF.qring holding record indices
   * (a chunk's own in its q.pos), QM_AGE_EMPTY where a chunk left from
   * within; cap positions in use, a power of two up to LF.blk_max (0 until
   * the first chunk enters); age, the aged prefix: the entries, empty ones
   * included, before the first chunk not aged (fifo.n: all are) */
  qm_age_t fifo;
  uint32_t cap, age;
  uint32_t pushes; /* chunks entered, counted up to PREFILL_AT */
  /* aged chunks: hot[] by resident pages (dirty), cold[] (none resident) by
   * capacity; nhot[] counts the hot bins, demand[] the requests per class */
  uint32_t hot[NBINS], cold[NBINS], nhot[NBINS], demand[NBINS];
  uint32_t demand_clock;
  qm_rng_t rng;                     /* the reuse choice */
  size_t qcount, qpages, qresident; /* chunks, usable pages, resident pages */
  size_t ltail; /* resident pages live chunks hold past their RW part (the budget counts them) */
  size_t live;  /* bytes live large chunks were asked for (the budget follows them) */
  /* quarantined chunks unmapped before their window passed, and chunks
   * the belt should carry mapped on their own (secondary.c): only out of
   * address space, memory or mappings, only in the default profile */
  uint64_t window_breaks;
} Q;

void qm__q_init(void) {
  for (unsigned c = 0; c < NBINS; c++)
    Q.hot[c] = Q.cold[c] = NIL;
}

void qm__q_tail_add(size_t pages) { Q.ltail += pages; }

void qm__q_tail_sub(size_t pages) { Q.ltail -= pages; }

void qm__q_live(size_t bytes) { Q.live = bytes; }

void qm__q_window_broken(void) { Q.window_breaks++; }

void qm__q_stats(qm_stats_t *s) {
  s->quarantine_chunks = Q.qcount;
  s->quarantine_bytes = Q.qpages << qm__page_shift;
  s->quarantine_resident_bytes = Q.qresident << qm__page_shift;
  s->window_breaks = Q.window_breaks;
}

/* ---- the FIFO and the bins (under S.lock) ---- */

/* A bin holds aged chunks by what serves a request best: hot[] by resident
 * pages (a request that fits them takes no fault), cold[] by capacity (no
 * page resident: only the mmap is saved). */
static uint32_t *bin_head(const block_t *b) {
  return b->q.cold ? &Q.cold[b->q.bin] : &Q.hot[b->q.bin];
}

static void bin_insert(uint32_t i) {
  block_t *b = B(i);
  if (b->q.inbin)
    return;
  b->q.cold = !b->map.dirty;
  b->q.bin = (uint8_t)pclass(b->map.dirty ? b->map.dirty : b->map.cap);
  uint32_t *h = bin_head(b);
  b->q.prev = NIL;
  b->q.next = *h;
  if (*h != NIL)
    B(*h)->q.prev = i;
  *h = i;
  b->q.inbin = true;
  if (!b->q.cold)
    Q.nhot[b->q.bin]++;
}

static void bin_remove(uint32_t i) {
  block_t *b = B(i);
  if (!b->q.inbin)
    return;
  if (b->q.prev != NIL)
    B(b->q.prev)->q.next = b->q.next;
  else
    *bin_head(b) = b->q.next;
  if (b->q.next != NIL)
    B(b->q.next)->q.prev = b->q.prev;
  b->q.inbin = false;
  if (!b->q.cold)
    Q.nhot[b->q.bin]--;
}

/* The FIFO is an aging queue (age.h) of record indices: a chunk leaves it
 * from within, whenever a request reuses it from a bin, a belt chunk is
 * buried or the budgets unmap the oldest chunk not BUSY, by emptying its
 * entry (found by its q.pos). A full ring is compacted, or doubled if fewer
 * than half its entries are empty: O(1) a push. It can always take one
 * more: it holds records, at most LF.blk_max entries, and the chunk
 * entering is not among them. */
static void fifo_moved(uint32_t i, uint32_t at) { B(i)->q.pos = at; }

/* Writes to the pages of positions [from, to) (the entries as they are):
 * faulted in now, while the ring grows or a program starts to churn large
 * chunks, and not one at a time as the pushes first reach them (a fault in
 * a thousand frees in the midst of churn, as long as the ring had never
 * wrapped). */
static void fifo_touch(uint32_t from, uint32_t to) {
  uint32_t step = (uint32_t)(qm__page / sizeof(uint32_t));
  for (uint32_t k = from; k < to; k = (k | (step - 1)) + 1) {
    volatile uint32_t *e = &LF.qring[k];
    *e = *e;
  }
}

/* Chunks entered after which the ring's pages are touched (fifo_touch):
 * the program churns large chunks. */
#define PREFILL_AT 256

/* The first capacity: twice the aged chunks the cap allows (the chunks in
 * the window come on top, and half empty is when the ring grows). */
static uint32_t fifo_cap0(void) {
  size_t want = 2 * ((size_t)qm__opt.quarantine_max_chunks + 1), cap = 64;
  while (cap < want && cap < LF.blk_max)
    cap *= 2;
  return (uint32_t)(cap < LF.blk_max ? cap : LF.blk_max);
}

static void fifo_room(void) {
  uint32_t cap = Q.cap, newcap = cap;
  if (Q.qcount >= cap / 2 && cap < LF.blk_max) {
    newcap = cap * 2;
    fifo_touch(cap, newcap);
  }
  qm_age_compact(&Q.fifo, LF.qring, cap, newcap, &Q.age, fifo_moved);
  Q.cap = newcap;
  QM_CHECK(!qm_age_full(&Q.fifo, Q.cap));
}

static void q_append(uint32_t i) {
  block_t *b = B(i);
  if (!Q.cap)
    Q.cap = fifo_cap0();
  if (qm_age_full(&Q.fifo, Q.cap))
    fifo_room();
  if (Q.pushes < PREFILL_AT && ++Q.pushes == PREFILL_AT)
    fifo_touch(0, Q.cap);
  uint32_t at = qm_age_push(&Q.fifo, Q.cap);
  LF.qring[at] = i;
  b->q.pos = at;
  Q.qcount++;
  Q.qpages += b->map.cap;
  Q.qresident += b->map.dirty;
}

/* Takes a chunk out of the quarantine (to reuse or unmap it). Its place
 * is checked first: a corrupted q.pos must not empty another's, nor match
 * a stale copy that a compaction left past the queue's entries. */
void qm__q_unlink(uint32_t i) {
  block_t *b = B(i);
  QM_CHECK(b->q.pos < Q.cap && LF.qring[b->q.pos] == i);
  QM_CHECK_OP((b->q.pos + Q.cap - Q.fifo.head) % Q.cap, <, Q.fifo.n);
  bin_remove(i);
  LF.qring[b->q.pos] = QM_AGE_EMPTY;
  qm_age_skip(&Q.fifo, LF.qring, Q.cap, &Q.age);
  Q.qcount--;
  Q.qpages -= b->map.cap;
  Q.qresident -= b->map.dirty;
}

/* The k-th oldest entry of the FIFO (k < fifo.n): a record index, or
 * QM_AGE_EMPTY. */
static uint32_t fifo_at(uint32_t k) { return LF.qring[qm_age_at(&Q.fifo, k, Q.cap)]; }

/* Moves every chunk that has aged enough (min frees and min bytes freed
 * after it) into the bins where allocation looks. FIFO order makes the aged
 * chunks a prefix of the quarantine. */
static bool aged(const block_t *b) {
  /* a belt chunk's pages are reused at another address: its own range
   * waits for the belt, so its pages need not wait at all */
  if (LF.strategy == QM_STRATEGY_NONE || (b->chunk.flags & F_BELT))
    return true;
  uint64_t bytes, frees = qm__rec_clock(&bytes);
  return frees - b->chunk.seq >= qm__opt.quarantine_min_frees &&
         bytes - b->q.mark >= qm__opt.quarantine_min_mb << 20;
}

void qm__q_age(void) {
  for (; Q.age < Q.fifo.n; Q.age++) {
    uint32_t i = fifo_at(Q.age);
    if (i == QM_AGE_EMPTY)
      continue;
    block_t *b = B(i);
    if (!aged(b))
      break;
    /* a chunk BUSY being dropped is binned when it comes back */
    if (!(b->chunk.flags & F_NOREUSE) && b->chunk.state == B_QUAR)
      bin_insert(i);
  }
}

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
    bin_remove(i);
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
    bin_insert(i);
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
    bin_insert(p[k].i);
  }
}

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
    uint32_t i = fifo_at(k);
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
    uint32_t i = fifo_at(k);
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
static bool over(size_t maps) {
  return Q.qcount > qm__opt.quarantine_max_chunks || maps > LF.map_budget ||
         resident_pages() > budget_pages();
}

bool qm__q_over(void) { return over(qm__rec_maps()); }

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
    uint32_t i = fifo_at(k);
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
    bin_remove(i);                  /* binned again, cold, once its pages are gone */
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

void qm__q_dropped(uint32_t i) {
  if (!(B(i)->chunk.flags & F_NOREUSE) && aged(B(i))) /* q_age may have passed it */
    bin_insert(i);
}

/* Puts a chunk, its range retired and now QUAR, into the quarantine
 * (under S.lock); returns whether the quarantine is past a limit. Its
 * window counts from now: the frees counted (chunk.seq, stamped by the
 * secondary under the same hold) and their bytes. */
bool qm__q_enter(uint32_t i) {
  block_t *b = B(i);
  qm__rec_clock(&b->q.mark);
  size_t maps = qm__set_vmas(b, LF.strategy == QM_STRATEGY_NONE);
  q_append(i);
  return over(maps);
}

#ifdef QM_TEST_HOOKS
void qm__q_fifo(uint32_t *cap, uint32_t *head, uint32_t *n) {
  qm_lock(&S.lock);
  *cap = Q.cap;
  *head = Q.fifo.head;
  *n = Q.fifo.n;
  qm_unlock(&S.lock);
}
#endif
