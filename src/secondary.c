/* secondary.c: large chunks, their quarantine and their reuse. Invariants:
 * a chunk's record (base, span, usable, rw pages, state) is changed only
 * under S.lock or by the one thread that marked it BUSY; no syscall is made
 * under S.lock except growing the record table; a LIVE chunk is RW exactly
 * on [usable, usable + rw pages) and inaccessible elsewhere in its mapping;
 * a QUAR chunk is inaccessible throughout (strategy none aside). The lock is
 * a leaf: nothing else is locked while it is held. The window: a freed
 * chunk stays mapped and out of every bin until quarantine_min_frees large
 * frees and quarantine_min_mb MiB of them came after it (only the mapping
 * budget unmaps it earlier); a chunk in a bin is always QUAR and aged.
 */
#include "secondary.h"

#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <ucontext.h>
#include <unistd.h>

#include "guarded.h"
#include "init.h"
#include "lock.h"
#include "options.h"
#include "os.h"
#include "primary.h"
#include "probe.h"
#include "qm.h"
#include "report.h"
#include "stack.h"
#include "strategy.h"

#define NIL UINT32_MAX
#define NBINS 160
#define MAX_RECORDS ((size_t)1 << 20) /* the most chunks the mapping cap allows, and more */
#define VICTIMS 32
#define SCAN 32          /* chunks a request looks at: bounds the time under the lock */
#define DEMAND_HALF 4096 /* requests after which the demand counts are halved */

enum { B_UNUSED, B_LIVE, B_QUAR, B_BUSY };
/* F_FREED: the chunk left the user (freed, or the old range of a realloc
 * move) and has not been handed out since; a BUSY chunk with it is being
 * retired or dropped, one without it is being resized or revived. */
/* F_SPLIT: the RW pages may be several VMAs. A realloc move puts the old
 * pages in front of pages of the new mapping, and the two never merge (their
 * vm_pgoff differ), so a chunk that came from a move keeps two or more. */
/* F_COLD: in a cold bin (no page resident), while F_INBIN. */
enum { F_NOREUSE = 1, F_INBIN = 2, F_FREED = 4, F_SPLIT = 8, F_COLD = 16 };

typedef struct block {
  uintptr_t base, usable; /* the mapping, and its first usable page = user pointer */
  size_t span, size;      /* mapping bytes (guards included); requested bytes */
  size_t cap, rw, dirty;  /* pages: usable, RW now, possibly non-zero */
  uint64_t seq, mark;     /* large frees / bytes freed when it was quarantined */
  uint32_t qprev, qnext, bprev, bnext;
  uint8_t state, flags, vmas, bclass; /* bclass: its bin while F_INBIN */
} block_t;

typedef struct slot {
  uintptr_t key; /* a chunk's user pointer; 0 = empty */
  uint32_t idx;
} slot_t;

static struct {
  qm_lock_t lock;
  qm_lock_t init_lock;
  atomic_int ready;
  int strategy;
  bool fast; /* the kernel keeps protect-strategy reuse fault-free */
  block_t *blk;
  size_t nblk, blk_committed, blk_max; /* records in use (high water), RW, reserved */
  uint32_t free_rec;
  slot_t *tab;
  size_t tab_cap, tab_used;
  uint32_t qhead, qtail, age; /* quarantine FIFO, oldest first; first not aged */
  /* aged chunks: hot[] by resident pages (dirty), cold[] (none resident) by
   * capacity; nhot[] counts the hot bins, demand[] the requests per class */
  uint32_t hot[NBINS], cold[NBINS], nhot[NBINS], demand[NBINS];
  uint32_t demand_clock;
  uint64_t rng;                     /* the reuse choice; 0 until seeded */
  size_t qcount, qpages, qresident; /* chunks, usable pages, resident pages */
  size_t ltail;                     /* resident pages live chunks hold past their RW part */
  uint64_t frees, freed_bytes;      /* the clocks quarantine age is read on */
  size_t maps, map_budget;
  size_t live, live_bytes, mapped_bytes;
  uint64_t allocs, reuses, fresh, unmaps, drops, avoided, in_place, moved;
  bool no_dontunmap;
  size_t thp_size; /* PMD size where transparent huge pages can be had, else 0 */
  /* the stack table: per record, frames allocating then frames freeing */
  uintptr_t *stk[MAX_RECORDS / ((size_t)1 << 13)];
  unsigned frames;      /* option stack_frames */
  size_t stk_committed; /* records whose entries are mapped */
  size_t maps_peak;
} S = {.lock = QM_LOCK_INIT, .init_lock = QM_LOCK_INIT};

/* Page classes, four per doubling: bins of quarantined chunks by capacity,
 * and the capacity a fresh chunk is given, so that a chunk freed by one
 * request fits later ones of nearby sizes. Rounding up costs address space
 * only: pages past the request stay PROT_NONE and are never touched. */
static unsigned pclass(size_t n) {
  if (n <= 4)
    return n ? (unsigned)n - 1 : 0;
  unsigned l = 63u - (unsigned)__builtin_clzll((unsigned long long)(n - 1));
  unsigned c = 4 + (l - 2) * 4 + (unsigned)(((n - 1) >> (l - 2)) - 4);
  return c < NBINS ? c : NBINS - 1;
}
static size_t pclass_pages(unsigned c) {
  if (c < 4)
    return c + 1;
  unsigned k = c - 4, l = 2 + k / 4;
  return ((size_t)1 << l) + ((size_t)(k % 4 + 1) << (l - 2));
}

static block_t *B(uint32_t i) { return &S.blk[i]; }

/* Resident pages a live chunk holds past its RW part: left by an earlier,
 * larger use or by a shrink, inaccessible, and kept like quarantined pages
 * (S.ltail sums them over live chunks). */
static size_t tail_pages(const block_t *b) { return b->dirty > b->rw ? b->dirty - b->rw : 0; }

/* Chunks that keep their pages across reuse (protect, none) and span a
 * transparent huge page get one: each of its 512 pages then changes
 * protection with one PMD, and is touched again at the cost of one; a 4 KiB
 * page costs a PTE each, and on a VM a shadow-table sync each. Linux 6.2+
 * keeps PMD-mapped THP writable through mprotect(RW) (the probe's
 * fast_thp); before that, one fault per 2 MiB instead of 512. */
static bool want_thp(size_t cap_pages) {
  return S.thp_size && qm__opt.thp_min_mb &&
         (S.strategy == QM_STRATEGY_PROTECT || S.strategy == QM_STRATEGY_NONE) &&
         cap_pages << qm__page_shift >= qm__opt.thp_min_mb << 20 &&
         cap_pages << qm__page_shift >= S.thp_size;
}

/* The THP advice of a fresh mapping: 1 asks for huge pages, -1 refuses them
 * where thp_min_mb=0 says never (under THP "always" the kernel would give
 * them to every aligned 2 MiB of the chunk otherwise), 0 leaves the default. */
static int thp_advice(size_t cap_pages) {
  if (want_thp(cap_pages))
    return 1;
  return S.thp_size && !qm__opt.thp_min_mb && cap_pages << qm__page_shift >= S.thp_size ? -1 : 0;
}

/* ---- the record table and the address -> record hash (under S.lock) ---- */

/* Reserves the record table: as large as the address space allows, down to
 * 2048 records under a tight RLIMIT_AS. Retried on later allocations if it
 * failed at start-up, so one ENOMEM does not disable large chunks for good. */
static bool blk_reserve(void) {
  for (size_t n = MAX_RECORDS; n >= 2048; n /= 8) {
    void *p;
    /* guarded: records hold chunk addresses, and a committed prefix that
     * reaches the end must not touch a neighbour */
    if (qm_os_map_guarded(qm_page_up(n * sizeof(block_t)), QM_PROT_NONE, &p) == 0) {
      S.blk_max = n;
      S.blk = p;
      return true;
    }
  }
  return false;
}

/* ---- the stack table, beside the records and grown with them (under
 * S.lock): segments of STK_SEG records' entries, each mapped when the
 * records reach it and never moved (the SIGSEGV report reads them without
 * the lock), so its address space grows with use; records whose segment
 * could not be mapped simply carry no stacks ---- */

#define STK_SEG ((size_t)1 << 13) /* 2.25 MiB at 16 frames */

/* One record's entry: who allocated and freed its chunk, and when it was
 * freed, then S.frames allocating frames and S.frames freeing ones. Kept
 * here and not in block_t, so that the records' reservation (1 Mi of them)
 * does not grow with stacks, and stack_frames=0 costs no address space. */
typedef struct stk {
  uint64_t free_seq, free_ms; /* large frees counted, and the clock, when freed */
  uint32_t alloc_tid, free_tid;
  uint8_t nalloc, nfree;
} stk_t;

static size_t stk_entry_bytes(void) {
  return (sizeof(stk_t) + 7) / 8 * 8 + S.frames * 2 * sizeof(uintptr_t);
}

static size_t stk_seg_bytes(void) { return qm_page_up(STK_SEG * stk_entry_bytes()); }

static void stk_grow(void) {
  while (S.frames && S.stk_committed < S.blk_committed) {
    size_t seg = S.stk_committed / STK_SEG;
    if (seg >= sizeof S.stk / sizeof S.stk[0])
      return;
    void *p;
    if (qm_os_map_guarded(stk_seg_bytes(), QM_PROT_RW, &p))
      return; /* tried again when the records grow */
    S.stk[seg] = p;
    S.stk_committed = (seg + 1) * STK_SEG;
  }
}

/* Record i's entry; NULL without one. */
static stk_t *stk_at(uint32_t i) {
  if (!S.frames || i >= S.stk_committed)
    return NULL;
  return (stk_t *)((char *)S.stk[i / STK_SEG] + (i % STK_SEG) * stk_entry_bytes());
}

/* Its frames: the allocating ones, then (at S.frames) the freeing ones. */
static uintptr_t *stk_pcs(stk_t *e) {
  return (uintptr_t *)((char *)e + (sizeof(stk_t) + 7) / 8 * 8);
}

/* A stack captured on the way in, before any lock (unwinding takes none of
 * qmalloc's, but may take the loader's). */
typedef struct trace {
  uintptr_t pc[QM_STACK_MAX];
  unsigned n;
  uint32_t tid;
} trace_t;

static void trace_capture(trace_t *t) {
  t->n = S.frames ? qm__stack_capture(t->pc, S.frames) : 0;
  t->tid = S.frames ? qm__thread_id() : 0;
}

/* Records t as chunk i's allocating stack (the chunk is the caller's). */
static void note_alloc(uint32_t i, const trace_t *t) {
  stk_t *e = stk_at(i);
  if (!e)
    return;
  e->nalloc = (uint8_t)t->n;
  e->alloc_tid = t->tid;
  memcpy(stk_pcs(e), t->pc, t->n * sizeof(uintptr_t));
}

/* And as its freeing stack, at S.frees counted (under S.lock). */
static void note_free(uint32_t i, const trace_t *t) {
  stk_t *e = stk_at(i);
  if (!e)
    return;
  e->nfree = (uint8_t)t->n;
  e->free_tid = t->tid;
  e->free_seq = S.frees;
  e->free_ms = qm__clock_ms();
  memcpy(stk_pcs(e) + S.frames, t->pc, t->n * sizeof(uintptr_t));
}

static uint32_t rec_alloc(void) {
  if (!S.blk && !blk_reserve())
    return NIL;
  if (S.free_rec != NIL) {
    uint32_t i = S.free_rec;
    S.free_rec = B(i)->qnext;
    return i;
  }
  if (S.nblk == S.blk_max)
    return NIL;
  if (S.nblk == S.blk_committed) {
    size_t step = (64 << 10) / sizeof(block_t);
    size_t from = qm_page_up(S.blk_committed * sizeof(block_t));
    size_t to = qm_page_up((S.blk_committed + step) * sizeof(block_t));
    if (qm_os_protect((char *)S.blk + from, to - from, QM_PROT_NONE, QM_PROT_RW))
      return NIL;
    S.blk_committed = to / sizeof(block_t);
    stk_grow();
  }
  return (uint32_t)S.nblk++;
}

static void rec_free(uint32_t i) {
  block_t *b = B(i);
  memset(b, 0, sizeof *b);
  b->state = B_UNUSED;
  b->qnext = S.free_rec;
  S.free_rec = i;
}

static size_t hash(uintptr_t k) { return (size_t)((k >> 12) * 0x9e3779b97f4a7c15ull); }

static uint32_t tab_find(uintptr_t k) {
  if (!S.tab_cap)
    return NIL;
  size_t m = S.tab_cap - 1;
  for (size_t i = hash(k) & m;; i = (i + 1) & m) {
    if (S.tab[i].key == k)
      return S.tab[i].idx;
    if (!S.tab[i].key)
      return NIL;
  }
}

static void tab_put(slot_t *t, size_t cap, uintptr_t k, uint32_t idx) {
  size_t m = cap - 1, i = hash(k) & m;
  while (t[i].key)
    i = (i + 1) & m;
  t[i].key = k;
  t[i].idx = idx;
}

/* Keeps the load at most 1/2; false if there is no memory to grow. */
static bool tab_reserve(void) {
  if ((S.tab_used + 1) * 2 <= S.tab_cap)
    return true;
  size_t cap = S.tab_cap ? S.tab_cap * 2 : 512;
  void *p;
  if (qm_os_map_guarded(qm_page_up(cap * sizeof(slot_t)), QM_PROT_RW, &p))
    return false;
  slot_t *t = p;
  for (size_t i = 0; i < S.tab_cap; i++)
    if (S.tab[i].key)
      tab_put(t, cap, S.tab[i].key, S.tab[i].idx);
  if (S.tab)
    qm_os_unmap_guarded(S.tab, qm_page_up(S.tab_cap * sizeof(slot_t)));
  S.tab = t;
  S.tab_cap = cap;
  return true;
}

static void tab_insert(uintptr_t k, uint32_t idx) {
  tab_put(S.tab, S.tab_cap, k, idx);
  S.tab_used++;
}

/* Linear-probing delete with backward shift: no tombstones. */
static void tab_remove(uintptr_t k) {
  size_t m = S.tab_cap - 1, i = hash(k) & m;
  while (S.tab[i].key != k) {
    QM_CHECK(S.tab[i].key);
    i = (i + 1) & m;
  }
  for (size_t j = (i + 1) & m; S.tab[j].key; j = (j + 1) & m) {
    size_t home = hash(S.tab[j].key) & m;
    /* move j into the hole at i unless its home lies cyclically in (i, j] */
    if ((j > i && (home <= i || home > j)) || (j < i && home <= i && home > j)) {
      S.tab[i] = S.tab[j];
      i = j;
    }
  }
  S.tab[i].key = 0;
  S.tab_used--;
}

/* ---- the quarantine (under S.lock) ---- */

static void set_vmas(block_t *b, bool live) {
  unsigned v = qm__range_vmas(S.strategy, live);
  S.maps = S.maps - b->vmas + v;
  b->vmas = (uint8_t)v;
  if (S.maps > S.maps_peak)
    S.maps_peak = S.maps;
}

/* A bin holds aged chunks by what serves a request best: hot[] by resident
 * pages (a request that fits them takes no fault), cold[] by capacity (no
 * page resident: only the mmap is saved). */
static uint32_t *bin_head(const block_t *b) {
  return b->flags & F_COLD ? &S.cold[b->bclass] : &S.hot[b->bclass];
}

static void bin_insert(uint32_t i) {
  block_t *b = B(i);
  if (b->flags & F_INBIN)
    return;
  b->flags &= (uint8_t)~F_COLD;
  if (!b->dirty)
    b->flags |= F_COLD;
  b->bclass = (uint8_t)pclass(b->dirty ? b->dirty : b->cap);
  uint32_t *h = bin_head(b);
  b->bprev = NIL;
  b->bnext = *h;
  if (*h != NIL)
    B(*h)->bprev = i;
  *h = i;
  b->flags |= F_INBIN;
  if (!(b->flags & F_COLD))
    S.nhot[b->bclass]++;
}

static void bin_remove(uint32_t i) {
  block_t *b = B(i);
  if (!(b->flags & F_INBIN))
    return;
  if (b->bprev != NIL)
    B(b->bprev)->bnext = b->bnext;
  else
    *bin_head(b) = b->bnext;
  if (b->bnext != NIL)
    B(b->bnext)->bprev = b->bprev;
  b->flags &= (uint8_t)~F_INBIN;
  if (!(b->flags & F_COLD))
    S.nhot[b->bclass]--;
}

static void q_append(uint32_t i) {
  block_t *b = B(i);
  b->qnext = NIL;
  b->qprev = S.qtail;
  if (S.qtail != NIL)
    B(S.qtail)->qnext = i;
  else
    S.qhead = i;
  S.qtail = i;
  if (S.age == NIL)
    S.age = i;
  S.qcount++;
  S.qpages += b->cap;
  S.qresident += b->dirty;
}

/* Takes a chunk out of the quarantine (to reuse or unmap it). */
static void q_unlink(uint32_t i) {
  block_t *b = B(i);
  bin_remove(i);
  if (S.age == i)
    S.age = b->qnext;
  if (b->qprev != NIL)
    B(b->qprev)->qnext = b->qnext;
  else
    S.qhead = b->qnext;
  if (b->qnext != NIL)
    B(b->qnext)->qprev = b->qprev;
  else
    S.qtail = b->qprev;
  S.qcount--;
  S.qpages -= b->cap;
  S.qresident -= b->dirty;
}

/* Moves every chunk that has aged enough (min frees and min bytes freed
 * after it) into the bins where allocation looks. FIFO order makes the aged
 * chunks a prefix of the quarantine. */
static bool aged(const block_t *b) {
  if (S.strategy == QM_STRATEGY_NONE)
    return true;
  return S.frees - b->seq >= qm__opt.quarantine_min_frees &&
         S.freed_bytes - b->mark >= qm__opt.quarantine_min_mb << 20;
}

static void q_age(void) {
  while (S.age != NIL) {
    block_t *b = B(S.age);
    if (!aged(b))
      break;
    /* a chunk BUSY being dropped is binned when it comes back */
    if (!(b->flags & F_NOREUSE) && b->state == B_QUAR)
      bin_insert(S.age);
    S.age = b->qnext;
  }
}

/* ---- the reuse choice (under S.lock) ---- */

/* xorshift64*, seeded from the per-process secret: two runs of a program
 * reuse chunks in different orders, so an exploit cannot groom which freed
 * chunk a request gets. Before the secret exists (only while qmalloc starts,
 * for a qmalloc_default_options() that allocates) it gives a fixed value
 * and stays unseeded. */
static uint64_t rnd(void) {
  if (QM_UNLIKELY(!S.rng)) {
    if (!qm__secret)
      return 0x9e3779b97f4a7c15ull;
    S.rng = (qm__secret ^ 0xd1b54a32d192ed03ull) * 0x9e3779b97f4a7c15ull | 1;
  }
  uint64_t x = S.rng;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  S.rng = x;
  return x * 0x2545f4914f6cdd1dull;
}

/* Reseeds in a fork child, from the state and the pid: forked workers of one
 * parent then differ from it and from each other. */
static void rnd_fork(void) {
  (void)rnd();
  if (!S.rng)
    return; /* no secret yet: seeded later, from it */
  uint64_t z = S.rng ^ (uint64_t)getpid() * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  S.rng = (z ^ (z >> 31)) | 1;
}

/* Uniform in [0, n), n > 0. */
static uint32_t rnd_below(uint32_t n) { return (uint32_t)(((rnd() >> 32) * n) >> 32); }

/* Counts a request of `need` pages in its class; halves every count now and
 * then, so that the counts follow what the program asks for lately. */
static void demand_note(size_t need) {
  S.demand[pclass(need)]++;
  if (++S.demand_clock < DEMAND_HALF)
    return;
  S.demand_clock = 0;
  for (unsigned c = 0; c < NBINS; c++)
    S.demand[c] /= 2;
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
static uint32_t q_fit(size_t need, size_t align) {
  bool newest = S.strategy == QM_STRATEGY_NONE;
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
    for (uint32_t i = S.hot[c]; i != NIL && scanned < SCAN; i = B(i)->bnext, scanned++) {
      const block_t *b = B(i);
      if (b->cap < need || (b->usable & (align - 1)))
        continue;
      if (b->dirty >= need && b->dirty <= hot_max) {
        /* a close fit (at most a quarter to spare) beats a loose one: the
         * loose ones are left to the larger requests they also fit */
        bool close = b->dirty <= close_max;
        if (pick != NIL && pick_close && !close)
          continue;
        bool restart = pick != NIL && close && !pick_close; /* the draw starts again */
        fits = restart ? 1 : fits + 1;
        if (restart || (newest ? pick == NIL || b->seq > B(pick)->seq : rnd_below(fits) == 0)) {
          pick = i;
          pick_close = close;
        }
        continue;
      }
      size_t cost = b->dirty < need ? need - b->dirty : (b->dirty - need) / 2;
      if (b->dirty <= far && cost < alt_cost) {
        alt = i;
        alt_cost = cost;
      }
    }
    if (pick != NIL && c >= pclass(hot_max))
      return pick; /* past here no chunk is fault-free within the waste */
  }
  if (pick != NIL)
    return pick;
  if (alt != NIL && alt_cost < need)
    return alt;
  fits = 0;
  for (unsigned c = pclass(need); c <= pclass(hot_max) && c < NBINS; c++) {
    scanned = 0;
    for (uint32_t i = S.cold[c]; i != NIL && scanned < SCAN; i = B(i)->bnext, scanned++) {
      const block_t *b = B(i);
      if (b->cap < need || b->cap > hot_max || (b->usable & (align - 1)))
        continue;
      fits++;
      if (newest ? pick == NIL || b->seq > B(pick)->seq : rnd_below(fits) == 0)
        pick = i;
    }
  }
  return pick;
}

/* Takes a BUSY chunk's address out of the table before its mapping goes
 * (under S.lock): once munmap returns, mmap may hand the same address to
 * another thread, whose chunk must not meet this record. The record itself
 * is released after the munmap (unmapped()). */
static void forget(uint32_t i) {
  block_t *b = B(i);
  S.maps -= b->vmas;
  b->vmas = 0;
  S.mapped_bytes -= b->span;
  tab_remove(b->usable);
}

/* Unmaps a forgotten chunk; where even that is refused (a VMA split at the
 * mapping cap), its pages at least are dropped: the address space stays
 * lost, the memory does not. Without the lock. */
static void unmap_forgotten(uint32_t i) {
  block_t *b = B(i);
  if (qm_os_unmap((void *)b->base, b->span))
    qm_os_dontneed((void *)b->usable, b->cap << qm__page_shift);
}

/* ---- victims: chunks leaving the quarantine (unmapped) or losing their
 * pages (dropped), chosen under the lock, worked on outside it ---- */

typedef struct victims {
  uint32_t unmap[VICTIMS], drop[VICTIMS];
  unsigned nunmap, ndrop;
} victims_t;

/* Takes the oldest quarantined chunk to be unmapped: an aged one, or with
 * `unaged_too` any (only the mapping budget asks that: past it, mmap would
 * fail). Aged chunks are the FIFO's prefix up to S.age. */
static bool take_unmap_victim(victims_t *v, bool unaged_too) {
  for (uint32_t i = S.qhead; i != NIL && (unaged_too || i != S.age); i = B(i)->qnext) {
    if (B(i)->state != B_QUAR)
      continue;
    q_unlink(i);
    B(i)->state = B_BUSY;
    forget(i);
    v->unmap[v->nunmap++] = i;
    return true;
  }
  return false;
}

/* The resident pages the budget covers: quarantined chunks' and the ones
 * live chunks hold past their RW part. */
static size_t resident_pages(void) { return S.qresident + S.ltail; }

static size_t budget_pages(void) { return (qm__opt.quarantine_mb << 20) >> qm__page_shift; }

/* Whether the quarantine is past one of its limits (under S.lock). */
static bool q_over(void) {
  return S.qcount > qm__opt.quarantine_max_chunks || S.maps > S.map_budget ||
         resident_pages() > budget_pages();
}

/* The aged resident chunk least likely to be asked for: from the hot bin
 * with the most chunks for the requests lately made of the sizes it serves
 * (its own class and the two below: within reuse_max_waste_pct), the
 * larger class on a tie. NIL if no aged chunk has a page resident. */
static uint32_t surplus_victim(void) {
  unsigned best = NBINS;
  uint64_t best_n = 0, best_d = 1;
  for (unsigned c = 0; c < NBINS; c++) {
    if (!S.nhot[c])
      continue;
    uint64_t d =
        1 + (uint64_t)S.demand[c] + (c ? S.demand[c - 1] : 0) + (c > 1 ? S.demand[c - 2] : 0);
    /* n / d >= best_n / best_d, compared without dividing */
    if (best == NBINS || S.nhot[c] * best_d >= best_n * d) {
      best = c;
      best_n = S.nhot[c];
      best_d = d;
    }
  }
  return best == NBINS ? NIL : S.hot[best];
}

/* The youngest quarantined chunk with pages resident: the last to be reused,
 * so the one whose pages are dropped when only the window is left. */
static uint32_t youngest_resident(void) {
  for (uint32_t i = S.qtail; i != NIL; i = B(i)->qprev)
    if (B(i)->state == B_QUAR && B(i)->dirty)
      return i;
  return NIL;
}

/* Chooses what must go so that the quarantine respects its chunk cap, the
 * mapping budget (with `extra_maps` about to be added) and its resident
 * budget. The cap counts aged chunks only: the window wins over it. Past the
 * resident budget the aged chunks of the least asked-for sizes lose their
 * pages first (the oldest, as before, were the ones next in line for
 * reuse), and only then the youngest chunks in the window. A chunk without
 * pages stays mapped, cold: reusing it saves an mmap. Returns true when v is
 * full and the caller should call again. */
static bool q_enforce(victims_t *v, size_t extra_maps) {
  q_age();
  while (v->nunmap < VICTIMS && S.qcount > qm__opt.quarantine_max_chunks)
    if (!take_unmap_victim(v, false))
      break;
  while (v->nunmap < VICTIMS && S.maps + extra_maps > S.map_budget)
    if (!take_unmap_victim(v, false) && !take_unmap_victim(v, true))
      break;
  size_t budget = budget_pages();
  while (resident_pages() > budget && S.qresident && v->nunmap < VICTIMS && v->ndrop < VICTIMS) {
    uint32_t i = surplus_victim();
    if (i == NIL)
      i = youngest_resident();
    if (i == NIL)
      break;
    bin_remove(i);              /* binned again, cold, once its pages are gone */
    S.qresident -= B(i)->dirty; /* counted as gone now; the drop follows */
    B(i)->state = B_BUSY;
    v->drop[v->ndrop++] = i;
  }
  return v->nunmap == VICTIMS || v->ndrop == VICTIMS;
}

static void process_victims(victims_t *v) {
  for (unsigned k = 0; k < v->nunmap; k++)
    unmap_forgotten(v->unmap[k]);
  for (unsigned k = 0; k < v->ndrop; k++) {
    block_t *b = B(v->drop[k]);
    qm__range_drop(S.strategy, (void *)b->usable, b->dirty << qm__page_shift);
  }
  if (!v->nunmap && !v->ndrop)
    return;
  qm_lock(&S.lock);
  for (unsigned k = 0; k < v->nunmap; k++)
    rec_free(v->unmap[k]);
  for (unsigned k = 0; k < v->ndrop; k++) {
    block_t *b = B(v->drop[k]);
    b->dirty = 0;
    b->state = B_QUAR;
    if (!(b->flags & F_NOREUSE) && aged(b)) /* q_age may have passed it */
      bin_insert(v->drop[k]);
  }
  S.unmaps += v->nunmap;
  S.drops += v->ndrop;
  qm_unlock(&S.lock);
  v->nunmap = v->ndrop = 0;
}

/* Enforces every quarantine limit, however many rounds it takes. */
static void enforce(size_t extra_maps) {
  victims_t v = {.nunmap = 0};
  bool more;
  do {
    qm_lock(&S.lock);
    more = q_enforce(&v, extra_maps);
    qm_unlock(&S.lock);
    process_victims(&v);
  } while (more);
}

/* Unmaps every quarantined chunk, or only the aged ones; returns whether
 * there was any. */
static bool unmap_quarantine(bool unaged_too) {
  bool any = false;
  for (;;) {
    victims_t v = {.nunmap = 0};
    qm_lock(&S.lock);
    q_age();
    while (v.nunmap < VICTIMS && take_unmap_victim(&v, unaged_too))
      ;
    qm_unlock(&S.lock);
    if (!v.nunmap)
      return any;
    any = true;
    process_victims(&v);
  }
}

/* ---- initialisation ---- */

static void fault_handler_install(void);

static void ensure_ready(void) {
  if (QM_LIKELY(atomic_load_explicit(&S.ready, memory_order_acquire)))
    return;
  qm_lock(&S.init_lock);
  if (!atomic_load_explicit(&S.ready, memory_order_relaxed)) {
    const qm_probe_result_t *r = qm__probe();
    S.strategy = r->strategy;
    S.fast = r->fast_dirty == 1;
    S.qhead = S.qtail = S.age = S.free_rec = NIL;
    S.frames = (unsigned)qm__opt.stack_frames;
    for (unsigned c = 0; c < NBINS; c++)
      S.hot[c] = S.cold[c] = NIL;
    blk_reserve();
    long long sys = qm_os_read_number("/proc/sys/vm/max_map_count");
    if (sys <= 0)
      sys = 65530;
    size_t headroom = (size_t)sys / 8 > 256 ? (size_t)sys / 8 : 256;
    S.map_budget = qm__opt.max_mappings     ? qm__opt.max_mappings
                   : (size_t)sys > headroom ? (size_t)sys - headroom
                                            : 1;
    /* the guarded slots keep their share (at most half; none if off) */
    S.map_budget -= qm__guarded_maps_reserved(S.map_budget);
    /* THP where the kernel offers it (madvise or always) */
    char thp[64];
    if (qm_os_read_file("/sys/kernel/mm/transparent_hugepage/enabled", thp, sizeof thp) > 0 &&
        !strstr(thp, "[never]")) {
      long long pmd = qm_os_read_number("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size");
      S.thp_size = pmd > 0 && qm_is_pow2((size_t)pmd) ? (size_t)pmd : 0;
    }
    atomic_store_explicit(&S.ready, 1, memory_order_release);
  }
  qm_unlock(&S.init_lock);
}

/* ---- allocation ---- */

static void *fail_enomem(void) {
  errno = ENOMEM;
  return NULL;
}

/* Records a BUSY chunk as handed to the caller (under S.lock). Returns how
 * many of its first bytes may be non-zero: calloc must clear those. */
static size_t hand_out_locked(uint32_t i, size_t size, size_t need, bool reused, const trace_t *t) {
  block_t *b = B(i);
  note_alloc(i, t);
  size_t nonzero = b->dirty << qm__page_shift;
  if (reused && S.strategy == QM_STRATEGY_PROTECT && S.fast)
    S.avoided += b->dirty < need ? b->dirty : need;
  /* every page open to the user may be written, and stays counted until its
   * pages are dropped: calloc on a later reuse relies on it */
  if (b->dirty < b->rw)
    b->dirty = b->rw;
  S.ltail += tail_pages(b);
  b->size = size;
  b->state = B_LIVE;
  b->flags &= (uint8_t)~F_FREED;
  set_vmas(b, true);
  S.live++;
  S.live_bytes += size;
  S.allocs++;
  S.reuses += reused;
  return nonzero < size ? nonzero : size;
}

/* The same, taking the lock, and zeroing what may be non-zero if asked; a
 * reused chunk may bring resident pages past the request, which count
 * against the budget. */
static void *hand_out(uint32_t i, size_t size, size_t need, bool zero, bool reused,
                      const trace_t *t) {
  qm_lock(&S.lock);
  size_t nonzero = hand_out_locked(i, size, need, reused, t);
  bool over = q_over();
  qm_unlock(&S.lock);
  if (over)
    enforce(0);
  if (zero && nonzero)
    memset((void *)B(i)->usable, 0, nonzero);
  return (void *)B(i)->usable;
}

static void *fresh(size_t size, size_t need, size_t align, bool zero, bool noreuse,
                   const trace_t *t) {
  size_t cap = noreuse ? need : pclass_pages(pclass(need));
  if (cap < need) /* past the last class */
    cap = need;
  bool huge = want_thp(cap);
  if (huge && align < S.thp_size)
    align = S.thp_size;
  enforce(3);
  qm_range_t r;
  int err = qm__range_map(S.strategy, cap << qm__page_shift, align, need << qm__page_shift,
                          thp_advice(cap), &r);
  /* out of address space or mappings: the aged chunks go first, and the
   * window itself only as the last resort (failing instead would leave a
   * program that freed everything unable to allocate again) */
  for (int round = 0; err == ENOMEM && round < 2; round++)
    if (unmap_quarantine(round == 1))
      err = qm__range_map(S.strategy, cap << qm__page_shift, align, need << qm__page_shift,
                          thp_advice(cap), &r);
  if (err)
    return fail_enomem();
  qm_lock(&S.lock);
  uint32_t i = tab_reserve() ? rec_alloc() : NIL;
  if (i == NIL) {
    qm_unlock(&S.lock);
    qm_os_unmap((void *)r.base, r.span);
    return fail_enomem();
  }
  block_t *b = B(i);
  *b = (block_t){.base = r.base,
                 .usable = r.usable,
                 .span = r.span,
                 .cap = cap,
                 .rw = need,
                 .state = B_BUSY,
                 .flags = noreuse ? F_NOREUSE : 0,
                 .qprev = NIL,
                 .qnext = NIL,
                 .bprev = NIL,
                 .bnext = NIL};
  tab_insert(b->usable, i);
  S.mapped_bytes += r.span;
  S.fresh++;
  qm_unlock(&S.lock);
  return hand_out(i, size, need, zero, false, t);
}

/* Unmaps a BUSY chunk whose protection could not be changed, and forgets
 * it: never leave a chunk half-protected. */
static void discard_block(uint32_t i) {
  qm_lock(&S.lock);
  forget(i);
  qm_unlock(&S.lock);
  unmap_forgotten(i);
  qm_lock(&S.lock);
  rec_free(i);
  S.unmaps++;
  qm_unlock(&S.lock);
}

void *qm__large_alloc(size_t size, size_t align, bool zero) {
  if (size > QM_MAX_REQUEST || align > QM_MAX_REQUEST)
    return fail_enomem();
  ensure_ready();
  trace_t t;
  trace_capture(&t);
  size_t need = qm_pages(size ? size : 1);
  if (align < qm__page)
    align = qm__page;
  bool noreuse = need << qm__page_shift >= qm__opt.unmap_threshold_mb << 20;
  if (!noreuse && S.strategy != QM_STRATEGY_UNMAP) {
    qm_lock(&S.lock);
    q_age();
    uint32_t i = q_fit(need, align);
    if (i != NIL) {
      q_unlink(i);
      B(i)->state = B_BUSY;
      if (need <= B(i)->rw) { /* open already (strategy none): no syscall */
        size_t nonzero = hand_out_locked(i, size, need, true, &t);
        bool over = q_over();
        qm_unlock(&S.lock);
        if (over)
          enforce(0);
        if (zero && nonzero)
          memset((void *)B(i)->usable, 0, nonzero);
        return (void *)B(i)->usable;
      }
    }
    qm_unlock(&S.lock);
    if (i != NIL) {
      block_t *b = B(i);
      int err = 0;
      if (need > b->rw)
        err = qm__range_revive(S.strategy, (void *)(b->usable + (b->rw << qm__page_shift)),
                               (need - b->rw) << qm__page_shift);
      if (!err) {
        if (b->rw < need)
          b->rw = need;
        return hand_out(i, size, need, zero, true, &t);
      }
      discard_block(i);
    }
  }
  return fresh(size, need, align, zero, noreuse, &t);
}

/* ---- free ---- */

static void describe_block(qm_buf_t *d, const block_t *b, const char *state) {
  qm_buf_str(d, state);
  qm_buf_str(d, "large chunk, ");
  qm_buf_dec(d, b->size);
  qm_buf_str(d, " bytes");
}

static _Noreturn void report_bad_pointer(const char *what, void *p) {
  qm_buf_t d;
  d.n = 0;
  const char *kind = "";
  if (qm__large_describe((uintptr_t)p, &kind, &d)) {
    /* a chunk being unmapped has left the table already: freeing its user
     * pointer again is still a double free */
    if (!strcmp(kind, "use-after-free") && !strcmp(what, "invalid free of") && d.n > 9 &&
        !memcmp(d.s, "offset 0 ", 9))
      qm__report_fatal_tail("double free of", p, &d, qm__large_report_stacks);
    qm__report_fatal_tail(what, p, &d, qm__large_report_stacks);
  }
  qm__report_fatal(what, p, "not allocated by qmalloc");
}

/* Looks up a pointer about to be freed or resized; reports anything that is
 * not a live chunk's user pointer. Returns with S.lock held. */
static uint32_t find_live_locked(void *p, const char *what) {
  qm_lock(&S.lock);
  uint32_t i = tab_find((uintptr_t)p);
  if (i == NIL) {
    qm_unlock(&S.lock);
    report_bad_pointer(what, p);
  }
  if (B(i)->state != B_LIVE) {
    block_t copy = *B(i);
    qm_unlock(&S.lock);
    qm_buf_t d;
    d.n = 0;
    bool is_free = !strcmp(what, "invalid free of");
    describe_block(&d, &copy, is_free ? "" : "freed ");
    qm__report_fatal_tail(is_free ? "double free of" : what, p, &d, qm__large_report_stacks);
  }
  return i;
}

/* Whether a chunk just freed goes straight to munmap rather than into the
 * quarantine (under S.lock): strategy unmap, no quarantine, a never-reused
 * chunk with the quarantine off, or the mapping budget reached. */
static bool unmap_on_free(const block_t *b) {
  bool none = S.strategy == QM_STRATEGY_NONE;
  return S.strategy == QM_STRATEGY_UNMAP || !qm__opt.quarantine_max_chunks ||
         (none && b->flags & F_NOREUSE) ||
         S.maps - b->vmas + qm__range_vmas(S.strategy, none) > S.map_budget;
}

/* Puts a BUSY chunk, its range retired, into the quarantine (under S.lock);
 * returns whether the caller must enforce() the limits. */
static bool q_enter(uint32_t i, bool dropped) {
  block_t *b = B(i);
  if (dropped)
    b->dirty = 0;
  if (S.strategy != QM_STRATEGY_NONE)
    b->rw = 0;
  b->state = B_QUAR;
  b->seq = S.frees;
  b->mark = S.freed_bytes;
  set_vmas(b, S.strategy == QM_STRATEGY_NONE);
  q_append(i);
  return q_over();
}

/* Moves a BUSY chunk that left the user into the quarantine (or unmaps it
 * where the quarantine cannot hold it). */
static void retire_block(uint32_t i, bool unmap_now) {
  block_t *b = B(i);
  if (!unmap_now) {
    int strat = S.strategy;
    if (b->flags & F_NOREUSE && strat == QM_STRATEGY_PROTECT)
      strat = QM_STRATEGY_DISCARD; /* never reused: holding its pages is waste */
    bool dropped;
    if (qm__range_retire(strat, (void *)b->usable, b->rw << qm__page_shift, &dropped)) {
      discard_block(i);
      return;
    }
    qm_lock(&S.lock);
    bool over = q_enter(i, dropped);
    qm_unlock(&S.lock);
    if (over)
      enforce(0);
    return;
  }
  discard_block(i);
}

void qm__large_free(void *p) {
  if (!atomic_load_explicit(&S.ready, memory_order_acquire))
    qm__report_fatal("invalid free of", p, "not allocated by qmalloc");
  trace_t t;
  trace_capture(&t);
  uint32_t i = find_live_locked(p, "invalid free of");
  block_t *b = B(i);
  b->state = B_BUSY;
  b->flags |= F_FREED;
  S.ltail -= tail_pages(b);
  S.frees++;
  note_free(i, &t);
  S.freed_bytes += b->size;
  S.live--;
  S.live_bytes -= b->size;
  bool none = S.strategy == QM_STRATEGY_NONE, unmap_now = unmap_on_free(b);
  if (none && !unmap_now) { /* nothing to retire: straight in, one lock */
    bool over = q_enter(i, false);
    qm_unlock(&S.lock);
    if (over)
      enforce(0);
    return;
  }
  qm_unlock(&S.lock);
  retire_block(i, unmap_now);
}

size_t qm__large_usable(void *p, const char *op) {
  if (!atomic_load_explicit(&S.ready, memory_order_acquire))
    qm__report_fatal(op, p, "not allocated by qmalloc");
  uint32_t i = find_live_locked(p, op);
  size_t n = B(i)->rw << qm__page_shift;
  qm_unlock(&S.lock);
  return n;
}

size_t qm__large_size(void *p, const char *op) {
  if (!atomic_load_explicit(&S.ready, memory_order_acquire))
    qm__report_fatal(op, p, "not allocated by qmalloc");
  uint32_t i = find_live_locked(p, op);
  size_t n = B(i)->size;
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
  if (cap < need || S.no_dontunmap || !o->rw)
    return NULL;
  /* a chunk of several VMAs moves in one mremap() only on kernels that allow
   * it; elsewhere (5.10, 5.15) that mremap() fails, so it is copied */
  if ((o->flags & F_SPLIT) && !qm_os_move_spans_vmas())
    return NULL;
  /* the record first: once the pages have moved, the way back could fail */
  qm_lock(&S.lock);
  uint32_t i = tab_reserve() ? rec_alloc() : NIL;
  if (i != NIL)
    B(i)->state = B_BUSY;
  qm_unlock(&S.lock);
  if (i == NIL)
    return NULL;
  bool huge = want_thp(cap);
  qm_range_t r;
  int err = qm__range_map(S.strategy, cap << qm__page_shift, huge ? S.thp_size : 0, 0,
                          thp_advice(cap), &r);
  size_t moved = o->rw << qm__page_shift;
  if (!err) {
    err =
        qm__range_revive(S.strategy, (void *)(r.usable + moved), (need << qm__page_shift) - moved);
    if (!err)
      err = qm_os_move((void *)o->usable, moved, (void *)r.usable, true);
    if (err)
      qm_os_unmap((void *)r.base, r.span);
  }
  if (err) {
    if (err == EINVAL)
      S.no_dontunmap = true; /* before Linux 5.7: copy from now on */
    qm_lock(&S.lock);
    rec_free(i);
    qm_unlock(&S.lock);
    return NULL;
  }
  bool noreuse = cap << qm__page_shift >= qm__opt.unmap_threshold_mb << 20;
  qm_lock(&S.lock);
  block_t *b = B(i);
  *b = (block_t){.base = r.base,
                 .usable = r.usable,
                 .span = r.span,
                 .cap = cap,
                 .rw = need,
                 .dirty = need,
                 .size = size,
                 .state = B_LIVE,
                 .flags = (noreuse ? F_NOREUSE : 0) | F_SPLIT,
                 .qprev = NIL,
                 .qnext = NIL,
                 .bprev = NIL,
                 .bnext = NIL};
  set_vmas(b, true);
  note_alloc(i, t);
  tab_insert(r.usable, i);
  S.mapped_bytes += r.span;
  S.fresh++;
  S.moved++;
  S.allocs++;
  S.live++;
  S.live_bytes += size;
  /* the old chunk is freed; its range is mapped and empty now, save pages
   * past its RW part (a shrink's tail), which may still hold data: without
   * such a tail nothing is resident, so nothing counts against the
   * quarantine's budget or as a fault reuse would save */
  S.ltail -= tail_pages(o);
  if (o->dirty <= o->rw)
    o->dirty = 0;
  o->flags |= F_FREED;
  S.frees++;
  note_free(old, t);
  S.freed_bytes += o->size;
  S.live--;
  S.live_bytes -= o->size;
  bool unmap_now = unmap_on_free(o);
  qm_unlock(&S.lock);
  retire_block(old, unmap_now);
  return (void *)r.usable;
}

void *qm__large_realloc(void *p, size_t size) {
  if (size > QM_MAX_REQUEST)
    return fail_enomem();
  trace_t t;
  trace_capture(&t);
  uint32_t i = find_live_locked(p, "realloc of");
  block_t *b = B(i);
  size_t need = qm_pages(size);
  if (need <= b->cap) {
    size_t old_rw = b->rw;
    /* Growth by realloc tends to go on (a buffer appended to): open an
     * eighth more than asked, within the capacity, so that the next steps
     * move no guard; that slack counts in the usable size. A shrink within
     * it, or under strategy none, keeps the pages open too. */
    size_t open = need + need / 8 < b->cap ? need + need / 8 : b->cap;
    if ((need <= old_rw && old_rw <= open) || (need < old_rw && S.strategy == QM_STRATEGY_NONE)) {
      S.live_bytes = S.live_bytes - b->size + size;
      b->size = size;
      S.in_place++;
      qm_unlock(&S.lock);
      return p;
    }
    b->state = B_BUSY;
    qm_unlock(&S.lock);
    int err;
    bool dropped = false;
    size_t new_rw = need > old_rw ? open : need;
    if (need > old_rw)
      err = qm__range_revive(S.strategy, (void *)(b->usable + (old_rw << qm__page_shift)),
                             (new_rw - old_rw) << qm__page_shift);
    else
      err = qm__range_retire(S.strategy, (void *)(b->usable + (need << qm__page_shift)),
                             (old_rw - need) << qm__page_shift, &dropped);
    qm_lock(&S.lock);
    b->state = B_LIVE;
    if (!err) {
      S.ltail -= tail_pages(b);
      b->rw = new_rw;
      if (b->dirty < new_rw)
        b->dirty = new_rw;
      S.ltail += tail_pages(b); /* a shrink keeps its tail resident */
      S.live_bytes = S.live_bytes - b->size + size;
      b->size = size;
      S.in_place++;
      qm_unlock(&S.lock);
      return p;
    }
    if (need < old_rw) { /* could not protect the tail: still correct */
      S.live_bytes = S.live_bytes - b->size + size;
      b->size = size;
      qm_unlock(&S.lock);
      return p;
    }
  }
  b->state = B_BUSY;
  qm_unlock(&S.lock);
  void *q = move_grow(i, size, need, &t);
  if (q)
    return q;
  qm_lock(&S.lock);
  b->state = B_LIVE;
  /* every byte the program may have written, slack past the request too */
  size_t old_usable = b->rw << qm__page_shift;
  qm_unlock(&S.lock);
  q = qm__large_alloc(size, qm__page, false);
  if (!q)
    return NULL;
  memcpy(q, p, old_usable < size ? old_usable : size);
  qm_lock(&S.lock);
  S.moved++;
  qm_unlock(&S.lock);
  qm__large_free(p);
  return q;
}

/* ---- trim, flush, stats, fork ---- */

void qm__large_flush(void) {
  if (atomic_load_explicit(&S.ready, memory_order_acquire))
    unmap_quarantine(true);
}

size_t qm__large_trim(void) {
  if (!atomic_load_explicit(&S.ready, memory_order_acquire))
    return 0;
  size_t total = 0;
  for (;;) {
    victims_t v = {.nunmap = 0};
    qm_lock(&S.lock);
    for (uint32_t i = S.qhead; i != NIL && v.ndrop < VICTIMS; i = B(i)->qnext) {
      block_t *b = B(i);
      if (b->state != B_QUAR || !b->dirty)
        continue;
      bin_remove(i); /* binned again, cold, once its pages are gone */
      S.qresident -= b->dirty;
      total += b->dirty << qm__page_shift;
      b->state = B_BUSY;
      v.drop[v.ndrop++] = i;
    }
    qm_unlock(&S.lock);
    if (!v.ndrop)
      return total;
    process_victims(&v);
  }
}

void qm__large_stats(qm_stats_t *s) {
  if (!atomic_load_explicit(&S.ready, memory_order_acquire))
    return;
  qm_lock(&S.lock);
  s->large_live_chunks = S.live;
  s->large_live_bytes = S.live_bytes;
  s->large_mapped_bytes = S.mapped_bytes;
  s->quarantine_chunks = S.qcount;
  s->quarantine_bytes = S.qpages << qm__page_shift;
  s->quarantine_resident_bytes = S.qresident << qm__page_shift;
  s->large_allocs = S.allocs;
  s->large_frees = S.frees;
  s->reuses = S.reuses;
  s->fresh_maps = S.fresh;
  s->unmaps = S.unmaps;
  s->drops = S.drops;
  s->faults_avoided = S.avoided;
  s->realloc_in_place = S.in_place;
  s->realloc_moved = S.moved;
  s->mappings_estimate = S.maps;
  s->mappings_budget = S.map_budget;
  s->strategy = S.strategy;
  qm_unlock(&S.lock);
}

size_t qm__large_mappings_peak(void) {
  qm_lock(&S.lock);
  size_t n = S.maps_peak;
  qm_unlock(&S.lock);
  return n;
}

size_t qm__large_object_size(uintptr_t a) {
  if (!atomic_load_explicit(&S.ready, memory_order_acquire))
    return SIZE_MAX;
  size_t r = SIZE_MAX;
  qm_lock(&S.lock);
  for (size_t i = 0; i < S.nblk; i++) {
    const block_t *b = &S.blk[i];
    if (b->state == B_UNUSED || a < b->base || a >= b->base + b->span)
      continue;
    r = b->state == B_LIVE && a >= b->usable && a - b->usable < b->size ? b->size - (a - b->usable)
                                                                        : 0;
    break;
  }
  qm_unlock(&S.lock);
  return r;
}

size_t qm__large_metadata(uintptr_t (*out)[2], size_t cap) {
  size_t n = 0;
  qm_lock(&S.lock);
  if (S.blk && n < cap) {
    out[n][0] = (uintptr_t)S.blk;
    out[n++][1] = (uintptr_t)S.blk + qm_page_up(S.blk_max * sizeof(block_t));
  }
  if (S.tab && n < cap) {
    out[n][0] = (uintptr_t)S.tab;
    out[n++][1] = (uintptr_t)S.tab + qm_page_up(S.tab_cap * sizeof(slot_t));
  }
  for (size_t k = 0; k < S.stk_committed / STK_SEG && n < cap; k++) {
    out[n][0] = (uintptr_t)S.stk[k];
    out[n++][1] = (uintptr_t)S.stk[k] + stk_seg_bytes();
  }
  qm_unlock(&S.lock);
  return n;
}

/* The secondary's part of the fork lock order: its init lock, the probe
 * lock (taken inside it by ensure_ready), then its own lock. */
void qm__large_fork_prepare(void) {
  qm_lock(&S.init_lock);
  qm__probe_fork_prepare();
  qm_lock(&S.lock);
}
void qm__large_fork_parent(void) {
  qm_unlock(&S.lock);
  qm__probe_fork_parent();
  qm_unlock(&S.init_lock);
}
/* A chunk another thread had BUSY at fork stays BUSY in the child: its
 * owner does not exist there, so the chunk is simply never touched again. */
void qm__large_fork_child(void) {
  rnd_fork();
  qm__unwind_fork_child();
  qm_lock_reinit(&S.lock);
  qm__probe_fork_child();
  qm_lock_reinit(&S.init_lock);
}

/* ---- describing addresses, and the SIGSEGV report ---- */

bool qm__large_describe(uintptr_t a, const char **what, qm_buf_t *d) {
  if (!atomic_load_explicit(&S.ready, memory_order_acquire) || !S.blk)
    return false;
  size_t n = S.nblk;
  for (size_t i = 0; i < n; i++) {
    const block_t *b = &S.blk[i];
    if (b->state == B_UNUSED || a < b->base || a >= b->base + b->span)
      continue;
    /* a racy read of the record: the fault came from an access to it, so
     * at worst the words are those of a moment earlier */
    bool freed = b->state == B_QUAR || (b->state == B_BUSY && (b->flags & F_FREED));
    if (a < b->usable) {
      *what = "heap underflow";
      qm_buf_dec(d, b->usable - a);
      qm_buf_str(d, b->usable - a == 1 ? " byte before " : " bytes before ");
    } else if (freed) {
      *what = "use-after-free";
      qm_buf_str(d, "offset ");
      qm_buf_dec(d, a - b->usable);
      qm_buf_str(d, " in freed ");
    } else if (a - b->usable >= b->size) {
      *what = "heap overflow";
      size_t past = a - b->usable - b->size + 1;
      qm_buf_dec(d, past);
      qm_buf_str(d, past == 1 ? " byte past the end of " : " bytes past the end of ");
    } else {
      *what = "access";
      qm_buf_str(d, "offset ");
      qm_buf_dec(d, a - b->usable);
      qm_buf_str(d, " in ");
    }
    qm_buf_str(d, "large chunk of ");
    qm_buf_dec(d, b->size);
    qm_buf_str(d, " bytes at ");
    qm_buf_hex(d, b->usable);
    return true;
  }
  return false;
}

static void put_stack(const uintptr_t *pc, unsigned n) {
  qm_buf_t b;
  if (!n) {
    b.n = 0;
    qm_buf_str(&b, "    (no stack recorded)\n");
    qm__report_out(&b);
  }
  for (unsigned k = 0; k < n; k++) {
    b.n = 0;
    qm_buf_str(&b, "    ");
    qm__frame_format(&b, k, pc[k]);
    qm_buf_str(&b, "\n");
    qm__report_out(&b);
  }
}

void qm__large_report_stacks(const void *addr) {
  uintptr_t a = (uintptr_t)addr;
  if (!atomic_load_explicit(&S.ready, memory_order_acquire) || !S.blk || !S.frames)
    return;
  size_t n = S.nblk;
  for (size_t i = 0; i < n; i++) {
    const block_t *b = &S.blk[i];
    if (b->state == B_UNUSED || a < b->base || a >= b->base + b->span)
      continue;
    stk_t *e = stk_at((uint32_t)i);
    if (!e)
      return;
    /* racy reads, as in qm__large_describe: counts are clamped */
    const uintptr_t *pcs = stk_pcs(e);
    unsigned nf = e->nfree < S.frames ? e->nfree : S.frames;
    unsigned na = e->nalloc < S.frames ? e->nalloc : S.frames;
    bool freed = b->state == B_QUAR || (b->state == B_BUSY && (b->flags & F_FREED));
    qm_buf_t l;
    l.n = 0;
    if (freed) {
      uint64_t now = qm__clock_ms();
      qm_buf_str(&l, "  freed by thread ");
      qm_buf_dec(&l, e->free_tid);
      qm_buf_str(&l, ", ");
      qm_buf_dec(&l, S.frees - e->free_seq);
      qm_buf_str(&l, " large frees and ");
      qm_buf_dec(&l, now > e->free_ms ? now - e->free_ms : 0);
      qm_buf_str(&l, " ms ago, here:\n");
      qm__report_out(&l);
      put_stack(pcs + S.frames, nf);
      qm_buf_str(&l, "  previously allocated by thread ");
    } else {
      qm_buf_str(&l, "  allocated by thread ");
    }
    qm_buf_dec(&l, e->alloc_tid);
    qm_buf_str(&l, " here:\n");
    qm__report_out(&l);
    put_stack(pcs, na);
    return;
  }
}

/* Puts back the default action for SIGSEGV. SA_RESETHAND did so already
 * when this handler was called as installed; a handler installed later that
 * calls this one for faults it does not own has its own disposition in
 * place, and returning would retry the fault into it for ever. With the
 * default action, the retried access kills the process, as it would have
 * without qmalloc (a blocked SIGSEGV from a fault is forced through). */
static void default_action(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = SIG_DFL;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGSEGV, &sa, NULL);
}

/* The first line of a SIGSEGV explanation; whether addr is a large chunk's. */
static __attribute__((noinline)) bool segv_line(uintptr_t a, const void *ctx, bool *large) {
  qm_buf_t d;
  d.n = 0;
  const char *what = NULL;
  *large = qm__large_describe(a, &what, &d);
  if (!*large && !qm__small_describe(a, &what, &d))
    return false;
  char w[96];
  size_t n = 0;
  const char *parts[3] = {what, "", " at"};
#if defined(__x86_64__)
  const ucontext_t *uc = ctx;
  parts[1] = uc->uc_mcontext.gregs[REG_ERR] & 2 ? " (write)" : " (read)";
#else
  (void)ctx;
#endif
  for (unsigned k = 0; k < 3; k++)
    for (const char *c = parts[k]; *c && n < sizeof w - 1; c++)
      w[n++] = *c;
  w[n] = 0;
  qm__report_line(w, (const void *)a, d.s, d.n);
  return true;
}

/* The stack of the faulting access: unwound through the signal frame, and
 * printed from the interrupted instruction on. */
static __attribute__((noinline)) void segv_stack(const void *ctx) {
  uintptr_t pc[QM_STACK_MAX];
  unsigned n = qm__stack_capture(pc, QM_STACK_MAX), k = 0;
#if defined(__x86_64__)
  const ucontext_t *uc = ctx;
  uintptr_t ip = (uintptr_t)uc->uc_mcontext.gregs[REG_RIP];
  while (k < n && pc[k] != ip)
    k++;
  if (k == n)
    k = 0;
#else
  (void)ctx;
#endif
  qm_buf_t b;
  b.n = 0;
  qm_buf_str(&b, "  accessed by thread ");
  qm_buf_dec(&b, qm__thread_id());
  qm_buf_str(&b, " here:\n");
  qm__report_out(&b);
  put_stack(pc + k, n - k < S.frames ? n - k : S.frames);
}

static void on_segv(int sig, siginfo_t *si, void *ctx) {
  default_action();
  if (si->si_code <= 0) { /* sent by kill() or raise(): deliver it as sent */
    raise(sig);
    return;
  }
  /* print only: returning retries the access under the default action, so
   * the process dies of the SIGSEGV itself, as it would without qmalloc */
  uintptr_t a = (uintptr_t)si->si_addr;
  bool large;
  if (!segv_line(a, ctx, &large))
    return; /* the retried access kills */
  if (large && S.frames) {
    segv_stack(ctx);
    qm__large_report_stacks((const void *)a);
  }
}

/* Installed only over the default disposition, one-shot: a program that
 * handles SIGSEGV itself replaces it and sees no difference. */
void qm__fault_report_init(void) {
  if (qm__opt.fault_report)
    fault_handler_install();
}

static void fault_handler_install(void) {
  struct sigaction old;
  if (sigaction(SIGSEGV, NULL, &old) || old.sa_handler != SIG_DFL || (old.sa_flags & SA_SIGINFO))
    return;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_segv;
  sa.sa_flags = SA_SIGINFO | SA_RESETHAND | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGSEGV, &sa, NULL);
}
