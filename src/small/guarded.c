/* guarded.c: guarded slots. One reservation, a region per slot class (1, 2,
 * 4, ... pages); in a region, slot i is its data pages followed by one
 * guard page, and the region opens with a guard page, so every slot has a
 * guard on both sides. A chunk ends flush against its trailing guard. Slot
 * metadata lives out of band. Invariants: a LIVE slot is RW on its data
 * pages, a QUAR slot inaccessible (save OPEN: its retire was refused), a
 * guard page never accessible; every state change and every syscall on a
 * slot is made under G.lock (mprotect and madvise take the mm's mmap lock
 * anyway, so a lock of our own serialises nothing more). The lock is a leaf.
 */
#include "guarded.h"

#include <stdatomic.h>
#include <string.h>

#include "age.h"
#include "cache.h"
#include "lock.h"
#include "options.h"
#include "os.h"
#include "primary.h"
#include "probe.h"
#include "report.h"

#define NGC QM_GUARDED_CLASSES
#define NONE32 UINT32_MAX

enum { G_FRESH, G_LIVE, G_QUAR, G_DEAD };
/* GF_DIRTY: quarantined with its pages (counted in qres). GF_MARKED: retired
 * with guard markers, which dropped its pages. GF_OPEN: its retire failed;
 * it is RW still and catches nothing until reused. */
enum { GF_DIRTY = 1, GF_MARKED = 2, GF_OPEN = 4 };

typedef struct gslot {
  uint32_t size, lead; /* requested bytes; user pointer - first data byte */
  uint8_t state, flags;
  uint8_t ashift; /* log2 of the alignment asked for; 0: malloc's */
} gslot_t;

/* A class's changing state; its shape (region, slot size, record and ring
 * tables) is fixed at set-up and sealed: FX(c), GF.cls[]. */
typedef struct gclass {
  uint32_t fresh; /* the first slot never used */
  qm_age_t q;     /* the quarantine: slot numbers in FX(c).ring, nslots positions */
  uint32_t dcur;  /* entries from the oldest known to hold no pages */
  /* its region's address space (a span of the layout, os.h), claimed
   * PROT_NONE as fresh slots reach it */
  qm_os_grow_t space;
} gclass_t;

static __thread bool armed __attribute__((tls_model("initial-exec")));
/* Fixed once set up, sealed (seal.h): base, span, strategy, budget, shape. */
#define GF (*qm__gfix)
#define FX(c) (GF.cls[(c)-G.cls])

static struct {
  qm_lock_t lock;
  atomic_int ready; /* 0 not yet, 1 serving, -1 no reservation could be had */
  gclass_t cls[NGC];
  size_t maps;          /* VMAs the slots add (an estimate); GF.map_budget: may add */
  size_t qres, qbudget; /* pages quarantined with their memory; budget */
  size_t live, live_bytes, qcount;
  uint64_t allocs, frees, skipped, reuses, drops, marked;
} G = {.lock = QM_LOCK_INIT};

/* ---- sampling ---- */

uint32_t qm__sample_next(void) {
  if (qm__opt.guard_all)
    return 1;
  if (!qm__opt.sample_rate)
    return UINT32_MAX;
  /* uniform in [1, 2N - 1]: mean N, and no period a program could hit */
  uint64_t span = 2 * qm__opt.sample_rate - 1;
  return 1 + (uint32_t)(qm_rand() % span);
}

bool qm__sample_due(void) {
  /* a thread's first malloc comes here to set the countdown: sample it with
   * the same odds as any other (always, for sample_rate=1), not never */
  qm_rand_thread_ready(); /* the thread's first draw: its cache may not exist yet */
  bool due =
      qm__opt.guard_all || (qm__opt.sample_rate && (armed || qm_rand() % qm__opt.sample_rate == 0));
  armed = true;
  qm__sample_left = qm__sample_next();
  return due;
}

/* ---- the reservation ---- */

static size_t maps_total(void) {
  if (qm__opt.max_mappings)
    return qm__opt.max_mappings;
  long long sys = qm_os_read_number("/proc/sys/vm/max_map_count");
  if (sys <= 0)
    sys = 65530;
  size_t headroom = (size_t)sys / 8 > 256 ? (size_t)sys / 8 : 256;
  return (size_t)sys > headroom ? (size_t)sys - headroom : 1;
}

/* Half the budget under guard_all (slots are then most of the heap), a
 * sixteenth with sampling, none with both off. */
size_t qm__guarded_maps_reserved(size_t total) {
  if (qm__opt.guard_all)
    return total / 2;
  return qm__opt.sample_rate ? total / 16 : 0;
}

static uintptr_t slot_data(const gclass_t *c, uint32_t i) {
  return FX(c).base + qm__page + (uintptr_t)i * FX(c).stride;
}

static bool setup(void) {
  size_t pg = qm__page, limit = qm__small_limit ? qm__small_limit : (size_t)128 << 10;
  unsigned ncls = 1;
  while (ncls < NGC && ((size_t)1 << (ncls - 1)) * pg < limit)
    ncls++;
  /* guard_all: room for millions of live 1-page slots; sampling: a few
   * thousand. A span of the layout: each class's region is claimed as its
   * fresh slots reach it. */
  unsigned shift = qm__opt.guard_all ? 33 : 25;
  uintptr_t p = 0;
  for (; shift >= 22 && !p; shift--)
    p = qm_os_span((size_t)ncls << shift, 0);
  if (!p)
    return false;
  shift++;
  size_t reg = (size_t)1 << shift, meta = 0;
  for (unsigned k = 0; k < ncls; k++) {
    gclass_t *c = &G.cls[k];
    FX(c).base = (uintptr_t)p + k * reg;
    FX(c).pages = (size_t)1 << k;
    FX(c).stride = (FX(c).pages + 1) * pg;
    FX(c).nslots = (uint32_t)((reg - pg) / FX(c).stride);
    c->space = (qm_os_grow_t){.base = FX(c).base, .len = reg, .top = FX(c).base};
    meta += FX(c).nslots * (sizeof(gslot_t) + sizeof(uint32_t));
  }
  void *m;
  /* RW, but only the records of slots in use are ever touched */
  if (qm_os_grow(&G.cls[0].space, pg) || qm_os_map_guarded(qm_page_up(meta), QM_PROT_RW, &m))
    return false;
  char *q = m;
  for (unsigned k = 0; k < ncls; k++) {
    gclass_t *c = &G.cls[k];
    FX(c).slot = (gslot_t *)(void *)q;
    q += FX(c).nslots * sizeof(gslot_t);
    FX(c).ring = (uint32_t *)(void *)q;
    q += FX(c).nslots * sizeof(uint32_t);
  }
  /* markers where the kernel has them: try one on the leading guard page of
   * class 0, which never becomes accessible anyway */
  GF.markers = !qm_os_guard_install((void *)GF.cls[0].base, pg);
  const qm_probe_result_t *r = qm__probe();
  GF.strategy = r->strategy;
  /* protect without the fast path is the belt's (its pool moves pages,
   * secondary.c); a slot would refault every page it kept */
  if (GF.strategy == QM_STRATEGY_PROTECT && !r->fast_dirty && qm__opt.strategy == QM_STRAT_AUTO)
    GF.strategy = QM_STRATEGY_GUARD;
  if (GF.strategy == QM_STRATEGY_GUARD && !GF.markers)
    GF.strategy = QM_STRATEGY_DISCARD;
  if (GF.strategy != QM_STRATEGY_DISCARD && GF.strategy != QM_STRATEGY_GUARD)
    GF.strategy = QM_STRATEGY_PROTECT; /* none and unmap: guarding was asked for */
  GF.ncls = ncls;
  GF.reg_shift = shift;
  GF.map_budget = qm__guarded_maps_reserved(maps_total());
  if (!GF.map_budget)
    GF.map_budget = 64;
  /* guard_all: every live object holds a page already, so the quarantine's
   * pages come on top of a heap several times glibc's. Measured in small
   * churn (10,000 live): 24 MiB gives 67 MiB peak RSS (Electric Fence 41) at
   * 1 fault/op and 31k ops/s; 96 MiB 100 MiB at 0.17 faults/op, 47k ops/s */
  size_t qb =
      qm__opt.guard_all ? qm__opt.guard_quarantine_mb << 20 : qm__opt.guard_quarantine_mb << 16;
  G.qbudget = qb >> qm__page_shift;
  /* base first: a reader that sees the span sees the base too */
  __atomic_store_n(&GF.base, p, __ATOMIC_RELAXED);
  __atomic_store_n(&GF.span, (size_t)ncls << shift, __ATOMIC_RELEASE);
  qm__late_seal(qm__gfix);
  return true;
}

static bool ready_locked(void) {
  int r = atomic_load_explicit(&G.ready, memory_order_relaxed);
  if (!r) {
    r = setup() ? 1 : -1;
    atomic_store_explicit(&G.ready, r, memory_order_release);
  }
  return r > 0;
}

/* ---- the quarantine (under G.lock) ---- */

/* The ring's capacity is the sealed slot count, so a class's queue never
 * fills: each slot is in it at most once. The ring and its counts are
 * writable: an entry or a position past the class's slots is corruption,
 * caught before it indexes anything. */
static void quar_push(gclass_t *c, uint32_t i) {
  QM_CHECK_OP(c->q.n, <, FX(c).nslots);
  FX(c).ring[qm_age_push(&c->q, FX(c).nslots)] = i;
  G.qcount++;
}

static uint32_t quar_pop(gclass_t *c) {
  QM_CHECK_OP(c->q.head, <, FX(c).nslots);
  uint32_t i = FX(c).ring[qm_age_pop(&c->q, FX(c).nslots)];
  QM_CHECK_OP(i, <, FX(c).nslots);
  if (c->dcur)
    c->dcur--;
  G.qcount--;
  return i;
}

/* Drops the pages of the oldest quarantined slots that hold some, the
 * freeing class's first, until the quarantine is within its budget. The
 * slots stay inaccessible: a dangling access still faults. */
static void enforce(unsigned first) {
  for (unsigned n = 0; n < GF.ncls && G.qres > G.qbudget; n++) {
    gclass_t *c = &G.cls[(first + n) % GF.ncls];
    while (G.qres > G.qbudget && c->dcur < c->q.n) {
      uint32_t i = FX(c).ring[qm_age_at(&c->q, c->dcur++, FX(c).nslots)];
      gslot_t *s = &FX(c).slot[i];
      if (!(s->flags & GF_DIRTY))
        continue;
      qm_os_dontneed((void *)slot_data(c, i), FX(c).pages << qm__page_shift, QM_PROT_NONE);
      s->flags &= (uint8_t)~GF_DIRTY;
      G.qres -= FX(c).pages;
      G.drops++;
    }
  }
}

/* ---- allocation and free ---- */

/* The alignment of a plain malloc's chunk: guard_align, or with 0 the
 * alignment a type of n bytes can have (its size is a multiple of it: the
 * largest power of two dividing n, at most 16), which puts every chunk flush
 * against its guard. Real programs assume 16 (CPython 3.11 cannot start
 * without it), hence the default; the slack it leaves is checked at free. */
static size_t plain_align(size_t n) {
  if (qm__opt.guard_align) /* a power of two: its highest bit */
    return (size_t)1 << (63 - __builtin_clzll(qm__opt.guard_align));
  size_t a = n & (~n + 1);
  return !a || a > QM_MIN_ALIGN ? QM_MIN_ALIGN : a;
}

/* The slack pattern in the bytes between a chunk and its guard (left only by
 * alignment): checked at free, as small chunks' canaries are. */
static unsigned char slack_byte(uintptr_t x) { return (unsigned char)(0x80 | ((x * 0x9d) >> 3)); }

void *qm__guarded_alloc(size_t n, size_t align) {
  size_t a = align ? align : plain_align(n);
  if (n > ((size_t)1 << 30) || a > ((size_t)1 << 30))
    return NULL;
  size_t pg = qm__page;
  /* the bytes from the aligned pointer to the slot's end: the slot ends on a
   * page boundary, so with a page or less exactly what n's misalignment
   * adds, and with more up to a - 1 */
  size_t need = n + (a > pg ? a - 1 : ((~n + 1) & (a - 1)));
  size_t pages = need ? qm_pages(need) : 1;
  unsigned k = 0;
  while (k < NGC && ((size_t)1 << k) < pages)
    k++;
  qm_lock(&G.lock);
  if (!ready_locked() || k >= GF.ncls) {
    qm_unlock(&G.lock);
    return NULL;
  }
  gclass_t *c = &G.cls[k];
  /* a fresh slot costs a fault per page touched, a reused one (protect)
   * none: fresh ones while the quarantine is within its budget, so freed
   * slots age as long as the budget allows */
  bool can_fresh = c->fresh < FX(c).nslots && (GF.markers || G.maps + 2 <= GF.map_budget);
  /* and while the address space for it can be had */
  if (can_fresh && qm_os_grow(&c->space, pg + (size_t)(c->fresh + 1) * FX(c).stride))
    can_fresh = false;
  /* and while the mapping budget lets the next free split a VMA: past it a
   * free would retire with markers, a page zap (a TLB flush, expensive on
   * a VM) now and a zero-fill fault at reuse; the oldest slot costs one
   * mprotect and no fault */
  bool tight = GF.markers && G.maps + 2 > GF.map_budget;
  uint32_t i;
  bool reused = c->q.n && (!can_fresh || tight || G.qres > G.qbudget);
  if (reused) {
    i = quar_pop(c);
  } else if (can_fresh) {
    i = c->fresh++;
  } else {
    G.skipped++;
    qm_unlock(&G.lock);
    return NULL;
  }
  gslot_t *s = &FX(c).slot[i];
  uintptr_t data = slot_data(c, i);
  size_t len = FX(c).pages << qm__page_shift;
  int err = 0;
  if (!reused) {
    if (GF.markers) {
      /* the marker first, then one protection change over data and guard,
       * so that the slots in use stay one VMA (markers split nothing and
       * survive mprotect) */
      err = qm_os_guard_install((void *)(data + len), pg);
      if (!err)
        err = qm_os_protect((void *)data, len + pg, QM_PROT_NONE, QM_PROT_RW);
    } else {
      err = qm_os_protect((void *)data, len, QM_PROT_NONE, QM_PROT_RW);
      if (!err)
        G.maps += 2; /* made writable it never merges with its guards again */
    }
  } else if (s->flags & GF_MARKED) {
    err = qm_os_guard_remove((void *)data, len);
  } else if (!(s->flags & GF_OPEN)) {
    err = qm_os_protect((void *)data, len, QM_PROT_NONE, QM_PROT_RW);
    if (!err && GF.markers)
      G.maps -= 2; /* merged back into its neighbours */
  }
  if (s->flags & GF_DIRTY)
    G.qres -= FX(c).pages;
  if (err) { /* out of mappings or memory: the slot is lost, not the request */
    s->state = G_DEAD;
    s->flags = 0;
    G.skipped++;
    qm_unlock(&G.lock);
    return NULL;
  }
  uintptr_t end = data + len;
  /* a chunk of 0 bytes still gets one aligned position below the guard, its
   * slack checked like any other (a pointer on the guard would not free) */
  uintptr_t u = qm_align_down(end - (n ? n : 1), a);
  bool dirty = reused && !(s->flags & GF_MARKED);
  s->state = G_LIVE;
  s->flags = 0;
  s->size = (uint32_t)n;
  s->lead = (uint32_t)(u - data);
  s->ashift = align > QM_MIN_ALIGN ? (uint8_t)__builtin_ctzll(align) : 0;
  G.live++;
  G.live_bytes += n;
  G.allocs++;
  G.reuses += reused;
  qm_unlock(&G.lock);
  /* the chunk is the caller's alone from here */
  for (uintptr_t x = u + n; x < end; x++)
    *(unsigned char *)x = slack_byte(x);
  if (dirty && qm__cache_checked && qm__opt.zero_on_free)
    memset((void *)u, 0, n); /* calloc skips its memset in that mode */
  return (void *)u;
}

/* Where address a lies: its class, and the slot whose data pages or
 * trailing guard hold it (NONE32 on a region's leading guard, nslots or
 * more past the last slot). Returns whether a is in the data pages. */
static bool locate(uintptr_t a, gclass_t **cp, uint32_t *ip) {
  uintptr_t off = a - GF.base;
  QM_CHECK_OP(off >> GF.reg_shift, <, GF.ncls);
  gclass_t *c = &G.cls[off >> GF.reg_shift];
  uintptr_t r = off & (((uintptr_t)1 << GF.reg_shift) - 1);
  *cp = c;
  if (r < qm__page) {
    *ip = NONE32;
    return false;
  }
  r -= qm__page;
  uintptr_t i = r / FX(c).stride;
  *ip = i < FX(c).nslots ? (uint32_t)i : FX(c).nslots;
  return i < FX(c).nslots && r % FX(c).stride < FX(c).pages << qm__page_shift;
}

static void describe_chunk(qm_buf_t *d, const gslot_t *s, uintptr_t user) {
  qm_buf_str(d, "sampled small chunk of ");
  qm_buf_dec(d, s->size);
  qm_buf_str(d, " bytes at ");
  qm_buf_hex(d, user);
}

/* Checks that p is a live chunk's pointer and its slack intact (under
 * G.lock); unlocks and reports otherwise. */
static gslot_t *slot_live_locked(uintptr_t a, qm_op_t op, gclass_t **cp, uint32_t *ip) {
  bool in_data = locate(a, cp, ip);
  gclass_t *c = *cp;
  uint32_t i = *ip;
  if (!in_data || FX(c).slot[i].state != G_LIVE || a != slot_data(c, i) + FX(c).slot[i].lead) {
    qm_unlock(&G.lock);
    /* described by the slots alone: the reservation is theirs */
    qm_place_t pl;
    qm__report_pointer(op, (void *)a, qm__guarded_describe(a, qm_place_empty(&pl)) ? &pl : NULL,
                       NULL);
  }
  gslot_t *s = &FX(c).slot[i];
  uintptr_t end = slot_data(c, i) + (FX(c).pages << qm__page_shift);
  for (uintptr_t x = a + s->size; x < end; x++) {
    if (*(unsigned char *)x == slack_byte(x))
      continue;
    qm_unlock(&G.lock);
    qm__report_small_overflow((void *)a, QM_CK_SAMPLED, s->size, x - a, 0, 0, 0);
  }
  return s;
}

void qm__guarded_free(void *p, qm_op_t op) {
  uintptr_t a = (uintptr_t)p;
  gclass_t *c;
  uint32_t i;
  qm_lock(&G.lock);
  gslot_t *s = slot_live_locked(a, op, &c, &i);
  qm_mark_released(a);
  uintptr_t data = slot_data(c, i);
  size_t len = FX(c).pages << qm__page_shift;
  uint8_t flags = 0;
  /* guard markers where the strategy says so, or where another split VMA
   * would pass the budget: they drop the pages (a zero-fill fault per page
   * on reuse) but split nothing. Where they are refused (on locked pages:
   * mlockall after start-up), PROT_NONE, over the budget if need be: a slot
   * left open would catch nothing. */
  bool tried = false;
  if (GF.markers && (GF.strategy == QM_STRATEGY_GUARD || G.maps + 2 > GF.map_budget) &&
      (tried = true, !qm_os_guard_install((void *)data, len))) {
    flags = GF_MARKED;
  } else if (!qm_os_protect((void *)data, len, QM_PROT_RW, QM_PROT_NONE)) {
    if (GF.markers)
      G.maps += 2;
    flags = GF_DIRTY;
    if (GF.strategy == QM_STRATEGY_DISCARD && !qm_os_dontneed((void *)data, len, QM_PROT_NONE))
      flags = 0;
  } else if (GF.markers && !tried && !qm_os_guard_install((void *)data, len)) {
    flags = GF_MARKED; /* no VMA to split: markers need none */
  } else {
    flags = GF_OPEN;
  }
  G.marked += flags == GF_MARKED;
  if (flags & GF_DIRTY)
    G.qres += FX(c).pages;
  s->state = G_QUAR;
  s->flags = flags;
  G.live--;
  G.live_bytes -= s->size;
  G.frees++;
  quar_push(c, i);
  enforce((unsigned)(c - G.cls));
  qm_unlock(&G.lock);
}

size_t qm__guarded_size(void *p, qm_op_t op, size_t *align) {
  gclass_t *c;
  uint32_t i;
  qm_lock(&G.lock);
  const gslot_t *s = slot_live_locked((uintptr_t)p, op, &c, &i);
  size_t n = s->size;
  *align = s->ashift ? (size_t)1 << s->ashift : QM_MIN_ALIGN;
  qm_unlock(&G.lock);
  return n;
}

size_t qm__guarded_object_size(uintptr_t a) {
  gclass_t *c;
  uint32_t i;
  size_t r = 0;
  qm_lock(&G.lock);
  if (locate(a, &c, &i) && FX(c).slot[i].state == G_LIVE) {
    uintptr_t user = slot_data(c, i) + FX(c).slot[i].lead;
    if (a >= user && a - user < FX(c).slot[i].size)
      r = FX(c).slot[i].size - (a - user);
  }
  qm_unlock(&G.lock);
  return r;
}

/* ---- describing addresses ---- */

bool qm__guarded_describe(uintptr_t a, qm_place_t *pl) {
  qm_buf_t *d = &pl->words;
  if (!qm_guarded_owns((void *)a) || atomic_load_explicit(&G.ready, memory_order_acquire) <= 0)
    return false;
  gclass_t *c;
  uint32_t i;
  /* racy reads of the records: the fault came from an access to the slot,
   * so at worst they are a moment old */
  bool in_data = locate(a, &c, &i);
  if (i == NONE32 || i >= FX(c).nslots || (!in_data && FX(c).slot[i].state == G_FRESH)) {
    pl->access = i == NONE32 ? QM_ACC_UNDERFLOW : QM_ACC_WILD;
    qm_buf_str(d, i == NONE32 ? "guard page before the first sampled small-chunk slot"
                              : "unused part of the sampled small-chunk slots");
    return true;
  }
  const gslot_t *s = &FX(c).slot[i];
  uintptr_t user = slot_data(c, i) + s->lead, end = user + s->size;
  bool freed = s->state == G_QUAR;
  if (freed || s->state == G_LIVE) {
    pl->chunk = true;
    pl->kind = QM_CK_SAMPLED;
    pl->user = user;
    pl->size = s->size;
  }
  if (!in_data) {
    /* the guard after slot i: an overflow out of it */
    pl->access = QM_ACC_OVERFLOW;
    size_t past = a - end + 1;
    qm_buf_dec(d, past);
    qm_buf_str(d, past == 1 ? " byte past the end of " : " bytes past the end of ");
    if (freed)
      qm_buf_str(d, "freed ");
  } else if (freed) {
    pl->access = QM_ACC_UAF;
    qm_buf_offset(d, a, user);
    qm_buf_str(d, " in freed ");
  } else if (s->state == G_LIVE) {
    pl->access = QM_ACC_LIVE;
    qm_buf_offset(d, a, user);
    qm_buf_str(d, " in ");
  } else {
    pl->access = QM_ACC_WILD;
    qm_buf_str(d, "sampled small-chunk slot not in use");
    return true;
  }
  describe_chunk(d, s, user);
  return true;
}

/* ---- stats, fork ---- */

void qm__guarded_stats(qm_stats_t *s) {
  qm_lock(&G.lock);
  s->guarded_live_chunks = G.live;
  s->guarded_live_bytes = G.live_bytes;
  s->guarded_quarantine_chunks = G.qcount;
  s->guarded_quarantine_resident_bytes = G.qres << qm__page_shift;
  s->guarded_allocs = G.allocs;
  s->guarded_frees = G.frees;
  s->guarded_reuses = G.reuses;
  s->guarded_skipped = G.skipped;
  s->guarded_mappings_estimate = G.maps;
  s->guarded_mappings_budget = GF.map_budget;
  s->guarded_markers = GF.markers;
  qm_unlock(&G.lock);
}

void qm__guarded_fork_prepare(void) { qm_fork_lock(&G.lock); }
void qm__guarded_fork_parent(void) { qm_unlock(&G.lock); }
/* The forking thread's countdown is drawn afresh from its reseeded stream:
 * two children of one parent do not sample the same allocations. */
void qm__guarded_fork_child(void) {
  qm_lock_reinit(&G.lock);
  if (armed)
    qm__sample_left = qm__sample_next();
}
