/* large_record.c: the records of large chunks and all that is kept of
 * them: the record table (a span of the layout, os.h, claimed and committed
 * as it grows, so a record never moves and the SIGSEGV handler reads it
 * without the lock; the quarantine's FIFO ring is made with it, the
 * quarantine's),
 * the user pointer -> record hash, the address index, the stack table
 * beside the records, the ring of dead records, the count of mappings and
 * address space the records hold, and the clock of large frees they are
 * stamped on. All of it is R, private to this file (the others read its
 * counts, R.c, through large_record.h), changed under S.lock only (the
 * SIGSEGV handler's racy reads aside). Of a record it writes the rec part
 * (large.h), and no other but to free it: zeroed (B_UNUSED), linked into
 * the free list through q.next, handed out all zero. Calls go only down:
 * the OS layer, the strategies' mapping counts, the clock.
 */
#include "large_record.h"

#include <string.h>

#include "large.h"
#include "options.h"
#include "os.h"
#include "strategy.h"

qm_large_t qm__large = {.lock = QM_LOCK_INIT};

static struct {
  size_t blk_committed; /* records RW (those made: c.made) */
  uint32_t free_rec;    /* the free records, linked by q.next (large.h) */
  slot_t *tab;          /* the hash: user pointer -> record */
  size_t tab_cap, tab_used;
  /* the stack table: per record, frames allocating then frames freeing */
  uintptr_t *stk[MAX_RECORDS / STK_SEG];
  size_t stk_committed; /* records whose entries are mapped */
  /* dead records, oldest first: positions of dead_q, an aging queue of
   * DEAD_MAX; QM_AGE_EMPTY: forgotten early (left from within) */
  uint32_t dead[DEAD_MAX];
  qm_age_t dead_q;
  bool prefilled; /* the ring's storage made ready (qm__dead_push) */
  /* the address index: records by the 16 MiB granule of their base, the
   * few spanning more than ABIG on one list; heads, linked by anext */
  _Atomic uint32_t abucket[ABUCKETS], abig;
  /* the counts the others read (large_record.h): mappings, the clock */
  rec_counts_t c;
  /* the peak of c.maps, and the address space the chunks hold (guards
   * included) */
  size_t maps_peak, mapped_bytes;
  qm_os_grow_t space; /* the record table's address space */
} R = {.free_rec = NIL};

const rec_counts_t *const qm__rec_counts = &R.c;

_Static_assert(DEAD_MAX <= UINT16_MAX + 1, "a dead record's place in the ring fits its dpos");

/* ---- the record table and the address -> record hash (under S.lock) ---- */

/* Takes the record table's span, between guard pages (records hold chunk
 * addresses: a committed prefix that reaches the end must not touch a
 * neighbour), claimed as it is committed: as large as the address space
 * left would hold, down to 2048 records under a tight RLIMIT_AS. And the
 * quarantine's FIFO ring (LF.qring): an entry per record, since it holds
 * records, so it never needs more and can never fail to grow where the
 * table did not; RW at once (address space until the quarantine reaches
 * its pages). Retried on later allocations if it failed, so one ENOMEM
 * does not disable large chunks for good. */
static size_t blk_bytes(size_t n) { return qm_page_up(n * sizeof(block_t)); }

static size_t qring_bytes(size_t n) { return qm_page_up(n * sizeof(uint32_t)); }

bool qm__blk_reserve(void) {
  for (size_t n = MAX_RECORDS; n >= 2048; n /= 8) {
    void *ring;
    if ((n > 2048 && !qm_os_could_map(blk_bytes(n) + qring_bytes(n), 0, 0)) ||
        qm_os_map_guarded(qring_bytes(n), QM_PROT_RW, &ring))
      continue;
    if (qm_os_grow_span(&R.space, blk_bytes(n), 0, true)) {
      qm_os_unmap_guarded(ring, qring_bytes(n));
      return false;
    }
    LF.blk = (block_t *)R.space.base;
    LF.blk_max = n;
    LF.qring = ring;
    /* the retry of a later request: the rest is set, seal it now */
    if (atomic_load_explicit(&S.ready, memory_order_relaxed))
      qm__late_seal(qm__lfix);
    return true;
  }
  return false;
}

/* ---- the stack table, beside the records and grown with them (under
 * S.lock): segments of STK_SEG records' entries, each mapped when the
 * records reach it and never moved (the SIGSEGV report reads them without
 * the lock), so its address space grows with use; records whose segment
 * could not be mapped simply carry no stacks ---- */

/* A record's entry is its stk_t, then LF.frames allocating frames and
 * LF.frames freeing ones. Kept here and not in block_t, so that the records'
 * reservation (1 Mi of them) does not grow with stacks, and stack_frames=0
 * costs no address space. */
static size_t stk_entry_bytes(void) {
  return (sizeof(stk_t) + 7) / 8 * 8 + LF.frames * 2 * sizeof(uintptr_t);
}

static size_t stk_seg_bytes(void) { return qm_page_up(STK_SEG * stk_entry_bytes()); }

static void stk_grow(void) {
  while (LF.frames && R.stk_committed < R.blk_committed) {
    size_t seg = R.stk_committed / STK_SEG;
    if (seg >= sizeof R.stk / sizeof R.stk[0])
      return;
    void *p;
    if (qm_os_map_guarded(stk_seg_bytes(), QM_PROT_RW, &p))
      return; /* tried again when the records grow */
    R.stk[seg] = p;
    R.stk_committed = (seg + 1) * STK_SEG;
  }
}

/* Record i's entry; NULL without one. */
stk_t *qm__stk_at(uint32_t i) {
  if (!LF.frames || i >= R.stk_committed)
    return NULL;
  return (stk_t *)((char *)R.stk[i / STK_SEG] + (i % STK_SEG) * stk_entry_bytes());
}

/* Its frames: the allocating ones, then (at LF.frames) the freeing ones. */
uintptr_t *qm__stk_pcs(stk_t *e) { return (uintptr_t *)((char *)e + (sizeof(stk_t) + 7) / 8 * 8); }

/* Records t as chunk i's allocating stack (the chunk is the caller's). */
void qm__note_alloc(uint32_t i, const trace_t *t) {
  stk_t *e = qm__stk_at(i);
  if (!e)
    return;
  e->nalloc = (uint8_t)t->n;
  e->alloc_tid = t->tid;
  memcpy(qm__stk_pcs(e), t->pc, t->n * sizeof(uintptr_t));
}

uint64_t qm__note_free(uint32_t i, const trace_t *t) {
  R.c.frees++;
  R.c.freed_bytes += B(i)->chunk.size;
  stk_t *e = qm__stk_at(i);
  if (!e)
    return R.c.frees;
  e->nfree = (uint8_t)t->n;
  e->free_tid = t->tid;
  e->free_seq = R.c.frees;
  e->free_ms = qm__clock_ms();
  memcpy(qm__stk_pcs(e) + LF.frames, t->pc, t->n * sizeof(uintptr_t));
  return R.c.frees;
}

/* Opens the records up to want (at most the table's), in whole pages, and
 * their stack entries, claiming their address space first. Capped at the
 * table's end: past it lies the upper guard page, which a step of 546
 * records would open in a 2048-record table. */
static bool blk_commit(size_t want) {
  if (want > LF.blk_max)
    want = LF.blk_max;
  if (want <= R.blk_committed)
    return true;
  size_t from = qm_page_up(R.blk_committed * sizeof(block_t)), to = blk_bytes(want);
  if (qm_os_grow(&R.space, to) ||
      qm_os_protect((char *)LF.blk + from, to - from, QM_PROT_NONE, QM_PROT_RW))
    return false;
  R.blk_committed = to / sizeof(block_t);
  if (R.blk_committed > LF.blk_max)
    R.blk_committed = LF.blk_max;
  stk_grow();
  return true;
}

uint32_t qm__rec_alloc(void) {
  if (!LF.blk && !qm__blk_reserve())
    return NIL;
  if (R.free_rec != NIL) {
    uint32_t i = R.free_rec;
    R.free_rec = B(i)->q.next;
    B(i)->q.next = 0; /* handed out all zero, as a record never used is */
    return i;
  }
  size_t i = R.c.made;
  if (i == LF.blk_max)
    return NIL;
  if (i == R.blk_committed && !blk_commit(R.blk_committed + (64 << 10) / sizeof(block_t)))
    return NIL;
  __atomic_store_n(&R.c.made, i + 1, __ATOMIC_RELAXED); /* read by B() and qm__rec_find */
  return (uint32_t)i;
}

static void addr_remove(uint32_t i);

void qm__rec_free(uint32_t i) {
  block_t *b = B(i);
  if (b->rec.indexed)
    addr_remove(i);
  memset(b, 0, sizeof *b); /* B_UNUSED */
  b->q.next = R.free_rec;
  R.free_rec = i;
}

static size_t hash(uintptr_t k) { return (size_t)((k >> 12) * 0x9e3779b97f4a7c15ull); }

/* ---- the address index (changed under S.lock, read without it): what
 * holds an address, for reports and malloc_object_size, without a scan of
 * every record (dead ones included: 4096 and more) ---- */

static _Atomic uint32_t *addr_head(const block_t *b) {
  if (b->map.span > ABIG)
    return &R.abig;
  return &R.abucket[(b->map.base >> AGRAN_SHIFT) % ABUCKETS];
}

/* Links hold a record's index + 1: 0 ends a list, so zeroed heads are
 * empty lists and a zeroed (freed) record ends a racy walk. */
void qm__rec_publish(uint32_t i) {
  block_t *b = B(i);
  qm__tab_insert(user_of(b), i);
  _Atomic uint32_t *h = addr_head(b);
  b->rec.anext = atomic_load_explicit(h, memory_order_relaxed);
  b->rec.indexed = true;
  R.mapped_bytes += b->map.span;
  /* the record is whole before a reader can reach it */
  atomic_store_explicit(h, i + 1, memory_order_release);
}

static void addr_remove(uint32_t i) {
  block_t *b = B(i);
  _Atomic uint32_t *h = addr_head(b);
  uint32_t k = atomic_load_explicit(h, memory_order_relaxed);
  if (k == i + 1) {
    atomic_store_explicit(h, b->rec.anext, memory_order_release);
    return;
  }
  while (k && B(k - 1)->rec.anext != i + 1)
    k = B(k - 1)->rec.anext;
  QM_CHECK(k);
  B(k - 1)->rec.anext = b->rec.anext;
}

static bool holds(uint32_t i, uintptr_t a) {
  const block_t *b = &LF.blk[i];
  return b->chunk.state != B_UNUSED && a >= b->map.base && a - b->map.base < b->map.span;
}

/* A walk takes at most this many steps: a racy read may meet a record
 * being reused. */
#define AWALK 65536

/* The record on list h that holds a, or NIL. A link to no record made (a
 * corrupted anext) ends the walk: past the records made the table may be
 * uncommitted, and a fault here, in the SIGSEGV handler, would end the
 * report; the table's sealed size bounds it whatever the count. The count
 * is read after the head's acquire, so it covers every record on the list
 * then; a link to a record made since (one reused meanwhile) reads it
 * again. */
static uint32_t walk(_Atomic uint32_t *h, uintptr_t a, unsigned *steps) {
  uint32_t k = atomic_load_explicit(h, memory_order_acquire);
  size_t made = qm__rec_made();
  for (; k && *steps < AWALK; k = LF.blk[k - 1].rec.anext, (*steps)++) {
    if (k > LF.blk_max || (k > made && k > (made = qm__rec_made())))
      return NIL;
    if (holds(k - 1, a))
      return k - 1;
  }
  return NIL;
}

uint32_t qm__rec_find(uintptr_t a) {
  if (!LF.blk)
    return NIL;
  unsigned steps = 0;
  uint32_t i = walk(&R.abig, a, &steps);
  /* a record's base is in its own granule or up to ABIG before */
  for (uintptr_t g = 0; i == NIL && g <= (ABIG >> AGRAN_SHIFT) + 1 && g <= a >> AGRAN_SHIFT; g++)
    i = walk(&R.abucket[((a >> AGRAN_SHIFT) - g) % ABUCKETS], a, &steps);
  return i;
}

uint32_t qm__tab_find(uintptr_t k) {
  if (!R.tab_cap)
    return NIL;
  size_t m = R.tab_cap - 1;
  for (size_t i = hash(k) & m;; i = (i + 1) & m) {
    if (R.tab[i].key == k)
      return R.tab[i].idx;
    if (!R.tab[i].key)
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

/* Keeps the load at most 1/2 with n entries; false if there is no memory
 * to grow. */
static bool tab_hold(size_t n) {
  if (n * 2 <= R.tab_cap)
    return true;
  size_t cap = R.tab_cap ? R.tab_cap * 2 : 512;
  while (n * 2 > cap)
    cap *= 2;
  void *p;
  if (qm_os_map_guarded(qm_page_up(cap * sizeof(slot_t)), QM_PROT_RW, &p))
    return false;
  slot_t *t = p;
  for (size_t i = 0; i < R.tab_cap; i++)
    if (R.tab[i].key)
      tab_put(t, cap, R.tab[i].key, R.tab[i].idx);
  if (R.tab)
    qm_os_unmap_guarded(R.tab, qm_page_up(R.tab_cap * sizeof(slot_t)));
  R.tab = t;
  R.tab_cap = cap;
  return true;
}

bool qm__tab_reserve(void) { return tab_hold(R.tab_used + 1); }

void qm__tab_insert(uintptr_t k, uint32_t idx) {
  tab_put(R.tab, R.tab_cap, k, idx);
  R.tab_used++;
}

/* Linear-probing delete with backward shift: no tombstones. */
static void tab_remove(uintptr_t k) {
  size_t m = R.tab_cap - 1, i = hash(k) & m;
  while (R.tab[i].key != k) {
    QM_CHECK(R.tab[i].key);
    i = (i + 1) & m;
  }
  for (size_t j = (i + 1) & m; R.tab[j].key; j = (j + 1) & m) {
    size_t home = hash(R.tab[j].key) & m;
    /* move j into the hole at i unless its home lies cyclically in (i, j] */
    if ((j > i && (home <= i || home > j)) || (j < i && home <= i && home > j)) {
      R.tab[i] = R.tab[j];
      i = j;
    }
  }
  R.tab[i].key = 0;
  R.tab_used--;
}

size_t qm__set_vmas(block_t *b, bool live) {
  unsigned v = qm__range_vmas(LF.strategy, live) + b->chunk.extra_vmas;
  R.c.maps = R.c.maps - b->rec.vmas + v;
  b->rec.vmas = (uint8_t)v;
  if (R.c.maps > R.maps_peak)
    R.maps_peak = R.c.maps;
  return R.c.maps;
}

/* Takes a BUSY chunk's address out of the table before its mapping goes
 * (under S.lock): once munmap returns, mmap may hand the same address to
 * another thread, whose chunk must not meet this record. The record itself
 * is released after the munmap (unmapped()). */
void qm__forget(uint32_t i) {
  qm__rec_unmapped(i);
  tab_remove(user_of(B(i)));
}

void qm__rec_unmapped(uint32_t i) {
  block_t *b = B(i);
  R.c.maps -= b->rec.vmas;
  b->rec.vmas = 0;
  R.mapped_bytes -= b->map.span;
}

void qm__rec_stats(size_t *maps, size_t *maps_peak, size_t *mapped_bytes) {
  *maps = R.c.maps;
  *maps_peak = R.maps_peak;
  *mapped_bytes = R.mapped_bytes;
}

void qm__tab_rekey(uintptr_t from, uintptr_t to, uint32_t idx) {
  if (from == to)
    return;
  tab_remove(from);
  qm__tab_insert(to, idx);
}

/* Unmaps a forgotten chunk; where even that is refused (a VMA split at the
 * mapping cap), its pages at least are dropped: the address space stays
 * lost, the memory does not. Without the lock. */
void qm__unmap_forgotten(uint32_t i) {
  block_t *b = B(i);
  if (qm_os_unmap((void *)b->map.base, b->map.span))
    qm_os_dontneed((void *)b->map.usable, b->map.cap << qm__page_shift, QM_PROT_NONE);
}

/* ---- dead records (under S.lock): a ring, oldest first ---- */

static void dead_forget(uint32_t i) {
  tab_remove(user_of(B(i)));
  qm__rec_free(i);
}

/* Once PREFILL_AT belt chunks have been buried (the program churns large
 * chunks), what the ring will take as it fills is made ready in one go: the
 * records, their stack entries, and the hash's table for them, committed
 * and faulted in (MADV_POPULATE_WRITE), with the ring (the caller then does the same for the
 * belt's segment table): about 2.2 MiB at 16 frames. Left to grow with the ring, they faulted a
 * page in every few burials until it was full, some 4,100 large frees in: large churn W=8 took 0.24
 * faults/op in 600 ops after 1,508 (143 faults: record pages, stack entry pages and the hash's
 * rebuild past 2,048 entries), jemalloc 0.003-0.005. A program that frees few large chunks pays
 * none of it. Under S.lock, as the record table's growth is. */
#define PREFILL_AT 256
#define PREFILL_SLACK 64 /* records beyond the ring's: live and pooled chunks come and go */

static bool prefill(void) {
  if (!blk_commit(R.c.made + (DEAD_MAX - R.dead_q.n) + PREFILL_SLACK))
    return false;
  uintptr_t lo = qm_align_down((uintptr_t)&LF.blk[R.c.made], qm__page);
  qm_os_populate((void *)lo, qm_page_up((uintptr_t)&LF.blk[R.blk_committed]) - lo);
  /* the stack entries of the records to come, segment by segment */
  for (size_t r = R.c.made; r < R.blk_committed && r < R.stk_committed;) {
    size_t seg = r / STK_SEG, end = (seg + 1) * STK_SEG;
    if (end > R.blk_committed)
      end = R.blk_committed;
    uintptr_t a = qm_align_down((uintptr_t)qm__stk_at((uint32_t)r), qm__page);
    uintptr_t z = qm_page_up((uintptr_t)R.stk[seg] + (end - seg * STK_SEG) * stk_entry_bytes());
    qm_os_populate((void *)a, z - a);
    r = end;
  }
  if (tab_hold(R.tab_used + (DEAD_MAX - R.dead_q.n) + PREFILL_SLACK))
    qm_os_populate(R.tab, qm_page_up(R.tab_cap * sizeof(slot_t)));
  /* the ring itself, and the address index after it (in this file's
   * data: a granule the belt reaches first wrote, and a carve's eviction
   * first read, a page of it there, 1 fault in 1024 reuses in about one
   * run of eight of unit-belt-steady) */
  uintptr_t r0 = qm_align_down((uintptr_t)R.dead, qm__page);
  qm_os_populate((void *)r0, qm_page_up((uintptr_t)(R.abucket + ABUCKETS)) - r0);
  return true;
}

bool qm__dead_push(uint32_t i) {
  bool first = R.dead_q.n >= PREFILL_AT && !R.prefilled;
  if (first) {
    R.prefilled = true;
    first = prefill();
  }
  if (qm_age_full(&R.dead_q, DEAD_MAX)) {
    uint32_t old = R.dead[qm_age_pop(&R.dead_q, DEAD_MAX)];
    if (old != QM_AGE_EMPTY)
      dead_forget(old);
  }
  uint32_t at = qm_age_push(&R.dead_q, DEAD_MAX);
  R.dead[at] = i;
  B(i)->rec.dpos = (uint16_t)at;
  return first;
}

/* Forgets the dead records on list k.. of the address index whose range
 * meets [lo, hi); their places in the ring are emptied. */
static void evict_list(uint32_t k, uintptr_t lo, uintptr_t hi) {
  while (k) {
    block_t *b = B(k - 1);
    uint32_t next = b->rec.anext; /* forgetting unlinks it */
    if (b->chunk.state == B_DEAD && b->map.base < hi && b->map.base + b->map.span > lo) {
      /* a place a corrupted record gives is caught, not written through */
      QM_CHECK_OP(b->rec.dpos, <, DEAD_MAX);
      QM_CHECK_OP(R.dead[b->rec.dpos], ==, k - 1);
      R.dead[b->rec.dpos] = QM_AGE_EMPTY;
      dead_forget(k - 1);
    }
    k = next;
  }
}

/* Once per segment the belt enters (16 MiB carved): through the address
 * index, every record of which is on the list of its base's granule (or on
 * the big list), and one that meets [lo, hi) starts at most ABIG before
 * lo. Every dead record is in the ring, and every record in the ring dead.
 * A scan of the whole ring (4096 records, most of them elsewhere) did the
 * same before. */
void qm__dead_evict(uintptr_t lo, uintptr_t hi) {
  if (lo >= hi)
    return;
  evict_list(atomic_load_explicit(&R.abig, memory_order_relaxed), lo, hi);
  uintptr_t g = (lo > ABIG ? lo - ABIG : 0) >> AGRAN_SHIFT, last = (hi - 1) >> AGRAN_SHIFT;
  if (last - g >= ABUCKETS) /* each bucket once */
    g = last - ABUCKETS + 1;
  for (; g <= last; g++)
    evict_list(atomic_load_explicit(&R.abucket[g % ABUCKETS], memory_order_relaxed), lo, hi);
  qm_age_skip(&R.dead_q, R.dead, DEAD_MAX, NULL);
}

#ifdef QM_TEST_HOOKS
/* The end of the table's span. */
static uintptr_t table_end(void) { return (uintptr_t)LF.blk + blk_bytes(LF.blk_max); }

size_t qm__large_table(uintptr_t *lo, uintptr_t *hi) {
  qm_lock(&S.lock);
  size_t max = LF.blk ? LF.blk_max : 0;
  *lo = (uintptr_t)LF.blk;
  *hi = LF.blk ? table_end() : 0;
  qm_unlock(&S.lock);
  return max;
}

void qm__large_records(size_t *made, size_t *committed) {
  qm_lock(&S.lock);
  *made = R.c.made;
  *committed = R.blk_committed;
  qm_unlock(&S.lock);
}

size_t qm__large_metadata(uintptr_t (*out)[2], size_t cap) {
  size_t n = 0;
  qm_lock(&S.lock);
  if (LF.blk && n < cap) {
    out[n][0] = (uintptr_t)LF.blk;
    out[n++][1] = table_end();
  }
  if (LF.qring && n < cap) {
    out[n][0] = (uintptr_t)LF.qring;
    out[n++][1] = (uintptr_t)LF.qring + qring_bytes(LF.blk_max);
  }
  if (R.tab && n < cap) {
    out[n][0] = (uintptr_t)R.tab;
    out[n++][1] = (uintptr_t)R.tab + qm_page_up(R.tab_cap * sizeof(slot_t));
  }
  for (size_t k = 0; k < R.stk_committed / STK_SEG && n < cap; k++) {
    out[n][0] = (uintptr_t)R.stk[k];
    out[n++][1] = (uintptr_t)R.stk[k] + stk_seg_bytes();
  }
  qm_unlock(&S.lock);
  return n;
}
#endif
