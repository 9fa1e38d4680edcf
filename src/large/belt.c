/* belt.c: the belt, large chunks' address space: a span of the layout (os.h)
 * cut into segments of SEG bytes, of which the first BT.len bytes (twice the
 * window at first) are in use, doubled up to the span's length whenever a
 * lap finds no room (live chunks pin it), so that no chunk leaves the belt
 * for want of room. A segment is claimed PROT_NONE MAP_NORESERVE when the
 * head first enters it and held from then on, unless a claim is refused
 * (RLIMIT_AS): then dead segments are given back, address space only, and
 * claimed again when the head next enters them, so a limit costs the window
 * nothing. The head carves in address order and wraps round. Invariants: the head enters
 * a segment only if no chunk's range in it is alive (users == 0), nothing in
 * it waits to be mapped afresh (unclean == 0, busy == 0), and its last
 * chunk was freed at least a window ago (window bytes carved and
 * window_frees large frees since), so a freed range never comes back
 * sooner; behind the head ranges are only ever released, never carved. A
 * dead range is mapped afresh PROT_NONE (alone, or with its whole segment
 * once the segment holds no chunk) so that it merges back into the
 * reservation: the belt holds a bounded number of mappings and gives its
 * page tables back. With belt_way=move a second span as long, the
 * mirror, holds the pages of freed chunks (the pool): a chunk's pages wait
 * at the same offset in it as its range has in the belt, so a pooled
 * chunk's place in the mirror is its own while its range is not dead, and
 * a dead range is mapped afresh in both. State under BT.lock, a leaf (taken
 * inside the secondary's); syscalls without it, but the rare claims and
 * give-backs of address space. Fixed state (base, mirror, the span's
 * length, segment table) is sealed in LF.
 */
#include "belt.h"

#include <errno.h>
#include <stdatomic.h>

#include "large.h"
#include "options.h"
#include "os.h"

#define SEG_SHIFT 24 /* 16 MiB: small enough that a long-lived chunk pins little */
#define SEG ((size_t)1 << SEG_SHIFT)
#define MIN_SEGS 16  /* below 256 MiB of address space the belt is not worth it */
#define PEND 256     /* dead ranges waiting to be mapped afresh */
#define WHOLE 32     /* emptied segments waiting to be mapped afresh */
#define GAP_PAGES 16 /* a chunk starts 1 to GAP_PAGES guard pages after the last */
#define NOSEG SIZE_MAX
#define GROWTH 8 /* the span holds this many times the belt's first length */

typedef struct belt_seg {
  uint32_t users;       /* chunks whose range is in it and not dead */
  uint16_t busy;        /* mappings afresh in flight over it */
  uint16_t unclean;     /* dead ranges in it not yet mapped afresh */
  uint64_t free_odo;    /* the odometer when its last chunk was freed */
  uint64_t free_seq;    /* large frees then */
  _Atomic uint8_t ever; /* it held a chunk (reports) */
  uint8_t whole;        /* queued for a mapping afresh of all of it */
  uint8_t claimed;      /* its address space is held (and the mirror's) */
  uint8_t given;        /* it held chunks and its address space was given back */
} belt_seg_t;

typedef struct pend {
  uintptr_t base;
  size_t len;
  size_t seg;
} pend_t;

static struct {
  qm_lock_t lock;
  size_t head, headseg; /* offset of the next carve; the segment it is in, if entered */
  size_t len, nseg;     /* bytes and segments in use, from the span's start */
  size_t given;         /* segments that held chunks and were given back unclaimed */
  _Atomic uint64_t odo;
  pend_t pend[PEND];
  unsigned npend;
  size_t whole[WHOLE];
  unsigned nwhole;
  qm_rng_t rng;
} BT = {.lock = QM_LOCK_INIT, .headseg = NOSEG};

static belt_seg_t *seg_at(size_t s) {
  QM_CHECK_OP(s, <, LF.belt_nseg);
  return &LF.belt_seg[s];
}
static size_t seg_of(uintptr_t a) { return (a - LF.belt_base) >> SEG_SHIFT; }

/* The window in force, in bytes: window_gb, at most half the belt in use
 * so that the head always finds room a window behind it. */
static uint64_t window_bytes(void) {
  uint64_t w = (uint64_t)qm__opt.window_gb << 30, half = BT.len / 2;
  return w < half ? w : half;
}

/* The belt's first length: twice the window. Address space only, claimed
 * segment by segment as the head enters it, so RLIMIT_AS does not shrink
 * it (it did while the belt was mapped whole at start: at RLIMIT_AS = 1 GiB
 * it got a quarter of the rest, under its 256 MiB floor, and was off, every
 * chunk reused in place after quarantine_min_frees); a limit meets a claim,
 * and give_back() makes room. */
static size_t reservation_bytes(void) { return ((size_t)qm__opt.window_gb << 31) & ~(SEG - 1); }

/* len bytes of the layout (os.h) at a segment-aligned address, so that a
 * segment mapped afresh frees whole page tables (and a huge page's place in
 * the mirror is as aligned as in the belt); 0 if it has no room. Nothing
 * is mapped: the head claims each segment as it first enters it. */
static uintptr_t reserve_aligned(size_t len) { return qm_os_span(len, SEG); }

/* Claims segment s, and its place in the mirror, PROT_NONE (under BT.lock:
 * once a segment, so rare), with the unclaimed ones after it up to as many
 * as are held already (at most 64, 1 GiB), so that the claims are few: one
 * per 16 MiB carved was an mmap for every 8 ops of large churn. Alone
 * where more is refused. False where the address space is refused. */
static size_t nclaimed;
static bool claim_run(size_t s, size_t n) {
  size_t off = s << SEG_SHIFT, len = n << SEG_SHIFT;
  if (qm_os_claim((void *)(LF.belt_base + off), len, QM_PROT_NONE))
    return false;
  if (LF.belt_mirror && qm_os_claim((void *)(LF.belt_mirror + off), len, QM_PROT_NONE)) {
    qm_os_unmap((void *)(LF.belt_base + off), len);
    return false;
  }
  for (size_t k = s; k < s + n; k++) {
    BT.given -= seg_at(k)->given;
    seg_at(k)->claimed = 1;
    seg_at(k)->given = 0;
  }
  nclaimed += n;
  return true;
}
static bool claim(size_t s) {
  if (seg_at(s)->claimed)
    return true;
  size_t n = 1, most = nclaimed < 64 ? (nclaimed ? nclaimed : 1) : 64;
  while (n < most && s + n < BT.nseg && !seg_at(s + n)->claimed)
    n++;
  return claim_run(s, n) || (n > 1 && claim_run(s, 1));
}

/* Gives the address space of dead segments back (under BT.lock, where a
 * claim was refused: rare): segments no live chunk's range is in, nothing
 * queued in or in flight over, not the head's and not [lo, hi], the ones
 * the carve in progress enters. They keep their window (free_odo,
 * free_seq, ever); the head claims them again when it enters them. Nothing
 * else maps there meanwhile (the layout lies far below where the kernel
 * puts mappings of its choosing: os.c), and a dangling pointer into one
 * faults with the same report. Returns whether any went. */
static bool give_back(size_t lo, size_t hi) {
  bool any = false;
  for (size_t s = 0; s < BT.nseg; s++) {
    belt_seg_t *g = seg_at(s);
    if (!g->claimed || g->users || g->busy || g->unclean || g->whole || s == BT.headseg ||
        (s >= lo && s <= hi))
      continue;
    qm_os_unmap((void *)(LF.belt_base + (s << SEG_SHIFT)), SEG);
    if (LF.belt_mirror)
      qm_os_unmap((void *)(LF.belt_mirror + (s << SEG_SHIFT)), SEG);
    g->claimed = 0;
    nclaimed--;
    g->given = atomic_load_explicit(&g->ever, memory_order_relaxed);
    BT.given += g->given;
    any = true;
  }
  return any;
}

/* Claims segments [lo, hi] for a carve, giving dead ones back first where
 * the address space is refused. */
static bool claim_all(size_t lo, size_t hi) {
  for (size_t k = lo; k <= hi; k++)
    if (!claim(k) && !(give_back(lo, hi) && claim(k)))
      return false;
  return true;
}

/* Doubles the belt in use, up to the span (under BT.lock): a lap found no
 * room, every segment pinned by live chunks or in its window. The head goes
 * to the first new segment, which never held a chunk. */
static bool grow(void) {
  if (BT.nseg >= LF.belt_nseg)
    return false;
  size_t n = BT.nseg * 2 < LF.belt_nseg ? BT.nseg * 2 : LF.belt_nseg;
  BT.head = BT.len;
  BT.nseg = n;
  BT.len = n << SEG_SHIFT;
  return true;
}

void qm__belt_init(bool mirror) {
  if (!qm__opt.window_gb || LF.belt_base)
    return;
  /* the span holds GROWTH times the first length, less where the layout
   * has no room for that; the segment table covers the span (24 bytes a
   * 16 MiB segment: 1.5 MiB of address space for 1 TiB, its pages touched
   * as the belt grows into them) */
  for (size_t len = reservation_bytes(); len >= MIN_SEGS * SEG; len = (len / 2) & ~(SEG - 1))
    for (size_t span = len * GROWTH; span >= len; span /= 2) {
      /* at most a quarter of the layout, the mirror included: a span
       * reserved while the mirror's found no room stays taken, and in a
       * 39-bit address space (a 252 GiB layout, os.c) the tries at 64 GiB
       * windows used the layout up; there the window is 8 GiB */
      if (span * (mirror ? 2 : 1) > qm_os_layout_bytes() / 4)
        continue;
      size_t nseg = span >> SEG_SHIFT;
      void *segs;
      if (qm_os_map_guarded(qm_page_up(nseg * sizeof(belt_seg_t)), QM_PROT_RW, &segs))
        return;
      uintptr_t b = reserve_aligned(span), m = b && mirror ? reserve_aligned(span) : 0;
      if (b && (m || !mirror)) {
        LF.belt_base = b;
        LF.belt_mirror = m;
        LF.belt_len = span;
        LF.belt_nseg = nseg;
        LF.belt_seg = segs;
        BT.len = len;
        BT.nseg = len >> SEG_SHIFT;
        /* the head starts at a random segment: where the first chunks lie
         * is not known from the reservation's address */
        BT.head =
            (size_t)qm_rng_below(&BT.rng, (uint32_t)(BT.nseg < UINT32_MAX ? BT.nseg : UINT32_MAX))
            << SEG_SHIFT;
        return;
      }
      qm_os_unmap_guarded(segs, qm_page_up(nseg * sizeof(belt_seg_t)));
    }
}

void qm__belt_prefill(void) {
  qm_lock(&BT.lock);
  size_t n = BT.nseg;
  qm_unlock(&BT.lock);
  if (LF.belt_base)
    qm_os_populate(LF.belt_seg, qm_page_up(n * sizeof(belt_seg_t)));
}

bool qm__belt_on(void) { return LF.belt_base && qm__opt.window_gb; }

uintptr_t qm__belt_shadow(uintptr_t a) {
  QM_CHECK(LF.belt_mirror && a - LF.belt_base < LF.belt_len);
  return LF.belt_mirror + (a - LF.belt_base);
}

uint64_t qm__belt_odometer(void) { return atomic_load_explicit(&BT.odo, memory_order_relaxed); }

/* Queues segment s to be mapped afresh whole, if it holds no chunk and
 * something in it waits (under BT.lock); its queued ranges are dropped,
 * the whole mapping covers them. Never the head's segment: the head may
 * carve the rest of it meanwhile. */
static void maybe_whole(size_t s) {
  belt_seg_t *g = seg_at(s);
  if (g->users || !g->unclean || g->whole || s == BT.headseg || BT.nwhole == WHOLE)
    return;
  for (unsigned k = 0; k < BT.npend;)
    if (BT.pend[k].seg == s) {
      BT.pend[k] = BT.pend[--BT.npend];
      g->unclean--;
    } else {
      k++;
    }
  g->whole = 1;
  g->busy++;
  BT.whole[BT.nwhole++] = s;
}

/* Whether the head may enter segment s now (under BT.lock). */
static bool enterable(size_t s, uint64_t frees) {
  belt_seg_t *g = seg_at(s);
  if (g->users || g->busy || g->unclean) {
    maybe_whole(s); /* one that could not be queued when it emptied */
    return false;
  }
  if (!atomic_load_explicit(&g->ever, memory_order_relaxed))
    return true;
  return BT.odo - g->free_odo >= window_bytes() && frees - g->free_seq >= qm__opt.window_frees;
}

/* The head leaves its segment: if that emptied meanwhile, it can be mapped
 * afresh now. */
static void leave_head(void) {
  size_t s = BT.headseg;
  BT.headseg = NOSEG;
  if (s != NOSEG)
    maybe_whole(s);
}

bool qm__belt_carve(size_t usable_len, size_t align, uint64_t frees, qm_range_t *out,
                    uintptr_t *evict_lo, uintptr_t *evict_hi) {
  if (!LF.belt_base)
    return false;
  size_t pg = qm__page;
  if (align < pg)
    align = pg;
  qm_lock(&BT.lock);
  size_t gap = (1 + qm_rng_below(&BT.rng, GAP_PAGES)) * pg;
  /* a lap, and a segment: every segment is tried once; where none has room,
   * the belt grows and the head tries the new ones */
  do {
    if (usable_len > BT.len / 4 || align > BT.len / 4)
      continue;
    for (size_t tries = 0; tries <= BT.nseg + 1; tries++) {
      uintptr_t head = LF.belt_base + BT.head;
      uintptr_t usable = qm_align_up(head + gap, align);
      /* an alignment past a segment (aligned_alloc(32 MiB, ...)) starts
       * the range at its leading guard: the segments skipped to reach the
       * alignment are not entered, so they pin nothing and their windows
       * run on; within a segment the padding stays the chunk's range */
      uintptr_t start = align > SEG ? usable - gap : head;
      uintptr_t end = usable + usable_len + pg;
      if (end > LF.belt_base + BT.len) { /* round to the start */
        leave_head();
        BT.head = 0;
        continue;
      }
      size_t first = seg_of(start), last = seg_of(end - 1);
      size_t s = first == BT.headseg ? first + 1 : first, lo = s;
      for (; s <= last; s++)
        if (!enterable(s, frees))
          break;
      if (s <= last) { /* skip past the segment it may not enter */
        leave_head();
        BT.head = (s + 1) << SEG_SHIFT;
        if (BT.head >= BT.len)
          BT.head = 0;
        continue;
      }
      /* the address space of the segments it enters, held from now on;
       * where a limit refuses it even once dead segments are given back,
       * no chunk from the belt */
      if (!claim_all(first, last)) {
        qm_unlock(&BT.lock);
        return false;
      }
      /* the new chunk counts in its segments before the head leaves its
       * own: leave_head() queues that segment to be mapped afresh whole if
       * its chunks are all dead and one waits to be mapped afresh, and the
       * new chunk may begin in it. The other way round, the mapping afresh
       * took a live chunk's first pages (the API fuzzer's SEGV reading one) */
      for (s = first; s <= last; s++) {
        seg_at(s)->users++;
        atomic_store_explicit(&seg_at(s)->ever, 1, memory_order_relaxed);
      }
      if (last != BT.headseg)
        leave_head();
      *evict_lo = LF.belt_base + (lo << SEG_SHIFT);
      *evict_hi = lo <= last ? LF.belt_base + ((last + 1) << SEG_SHIFT) : *evict_lo;
      BT.headseg = last;
      BT.head = end - LF.belt_base;
      /* near its segment's end, the head claims the next one ahead: what
       * lies right after the last chunk is then the belt's, whatever the
       * process maps meanwhile (a failure here is met again at entry) */
      if (SEG - (BT.head & (SEG - 1)) <= SEG / 4 && last + 1 < BT.nseg)
        claim(last + 1);
      atomic_store_explicit(&BT.odo, BT.odo + (end - start), memory_order_relaxed);
      qm_unlock(&BT.lock);
      *out = (qm_range_t){.base = start, .usable = usable, .span = end - start};
      return true;
    }
  } while (grow());
  qm_unlock(&BT.lock);
  return false;
}

bool qm__belt_release(uintptr_t base, size_t span, uint64_t free_odo, uint64_t free_seq,
                      bool clean) {
  qm_lock(&BT.lock);
  for (size_t s = seg_of(base), last = seg_of(base + span - 1); s <= last; s++) {
    belt_seg_t *g = seg_at(s);
    QM_CHECK(g->users);
    g->users--;
    if (free_odo > g->free_odo)
      g->free_odo = free_odo;
    if (free_seq > g->free_seq)
      g->free_seq = free_seq;
    if (!clean) {
      /* its part of the range, to be mapped afresh alone or with the
       * segment; where the queue is full it waits for the segment's turn */
      uintptr_t lo = LF.belt_base + (s << SEG_SHIFT), hi = lo + SEG;
      lo = lo > base ? lo : base;
      hi = hi < base + span ? hi : base + span;
      g->unclean++;
      if (!g->users && s != BT.headseg)
        maybe_whole(s);
      else if (BT.npend < PEND)
        BT.pend[BT.npend++] = (pend_t){.base = lo, .len = hi - lo, .seg = s};
    } else if (!g->users) {
      maybe_whole(s);
    }
  }
  /* a whole segment at once; single ranges only once the queue is full:
   * by then most of their segments have emptied and go whole (large churn
   * W=8 made 0.66 mmap calls per op with a queue of 64 flushed at half) */
  bool work = BT.nwhole || BT.npend == PEND;
  qm_unlock(&BT.lock);
  return work;
}

int qm__belt_clean(uintptr_t base, size_t span) { return qm_os_reserve_fixed((void *)base, span); }

int qm__belt_clean_shadow(uintptr_t base, size_t span) {
  return qm_os_reserve_fixed((void *)qm__belt_shadow(base), span);
}

/* A dead range or segment mapped afresh, and its place in the mirror,
 * which a pooled chunk's pages may have left RW and empty. */
static int clean_both(uintptr_t base, size_t span) {
  int err = qm__belt_clean(base, span);
  if (!err && LF.belt_mirror)
    err = qm__belt_clean_shadow(base, span);
  return err;
}

void qm__belt_tidy(void) {
  pend_t p[PEND];
  size_t w[WHOLE];
  qm_lock(&BT.lock);
  /* the segments that emptied since their ranges were queued go whole */
  for (unsigned k = 0; k < BT.npend && BT.nwhole < WHOLE;) {
    unsigned before = BT.npend;
    maybe_whole(BT.pend[k].seg);
    if (BT.npend == before)
      k++;
  }
  /* single ranges only from a full queue (see qm__belt_release) */
  unsigned np = BT.npend == PEND ? BT.npend : 0, nw = BT.nwhole;
  for (unsigned k = 0; k < np; k++) {
    p[k] = BT.pend[k];
    seg_at(p[k].seg)->busy++;
  }
  for (unsigned k = 0; k < nw; k++)
    w[k] = BT.whole[k];
  BT.npend -= np;
  BT.nwhole = 0;
  qm_unlock(&BT.lock);
  if (!np && !nw)
    return;
  /* by address, so that neighbours (chunks that died side by side, with
   * the guard pages between them) go in one call */
  for (unsigned k = 1; k < np; k++)
    for (unsigned j = k; j && p[j - 1].base > p[j].base; j--) {
      pend_t t = p[j];
      p[j] = p[j - 1];
      p[j - 1] = t;
    }
  int perr[PEND], werr[WHOLE];
  for (unsigned k = 0, run; k < np; k += run) {
    uintptr_t end = p[k].base + p[k].len;
    for (run = 1; k + run < np && p[k + run].base == end; run++)
      end = p[k + run].base + p[k + run].len;
    int err = clean_both(p[k].base, end - p[k].base);
    for (unsigned j = k; j < k + run; j++)
      perr[j] = err;
  }
  for (unsigned k = 0; k < nw; k++)
    werr[k] = clean_both(LF.belt_base + (w[k] << SEG_SHIFT), SEG);
  qm_lock(&BT.lock);
  for (unsigned k = 0; k < np; k++) {
    belt_seg_t *g = seg_at(p[k].seg);
    g->busy--;
    if (!perr[k] && g->unclean)
      g->unclean--;
  }
  for (unsigned k = 0; k < nw; k++) {
    belt_seg_t *g = seg_at(w[k]);
    g->busy--;
    g->whole = 0;
    if (!werr[k])
      g->unclean = 0;
  }
  qm_unlock(&BT.lock);
}

bool qm__belt_holds(uintptr_t a, bool *ever) {
  if (!LF.belt_base || a < LF.belt_base || a - LF.belt_base >= LF.belt_len)
    return false;
  *ever = atomic_load_explicit(&LF.belt_seg[seg_of(a)].ever, memory_order_relaxed);
  return true;
}

void qm__belt_stats(uint64_t *reserved, uint64_t *window, uint64_t *maps) {
  qm_lock(&BT.lock);
  *reserved = BT.len;
  *window = LF.belt_base ? window_bytes() : 0;
  /* the reservation's own pieces (one more for each segment given back
   * between claimed ones), the queued ranges (a range left by a move may be
   * two), the queued segments; as many again in the mirror */
  *maps = LF.belt_base
              ? (1 + BT.given + 2 * (uint64_t)BT.npend + BT.nwhole) * (LF.belt_mirror ? 2 : 1)
              : 0;
  qm_unlock(&BT.lock);
}

void qm__belt_fork_prepare(void) { qm_fork_lock(&BT.lock); }
void qm__belt_fork_parent(void) { qm_unlock(&BT.lock); }
void qm__belt_fork_child(void) { qm_lock_reinit(&BT.lock); }
