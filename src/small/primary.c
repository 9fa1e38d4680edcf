/* primary.c: size classes, the one span of the layout (os.h) that holds
 * every class region, the spans of their state tables and of the central
 * free sets' bitmaps (primary_state.h), set up at init. Regions, their
 * tables and bitmaps are claimed and committed (PROT_NONE -> RW) as they
 * are carved, with guard pages among the chunks, so only classes in use
 * hold address space; what is committed only grows. Also the primary's
 * stats and its locks at fork.
 */
#include "primary.h"

#include <errno.h>
#include <string.h>

#include "entry.h"
#include "lock.h"
#include "meta.h"
#include "options.h"
#include "os.h"
#include "primary_state.h"
#include "random.h"
#include "report.h"

/* The committed counts and the central lists steer every allocation: they
 * live in a metadata mapping between guard pages, made at init, reached
 * through sealed pointers (qm__committed, qm__central: sealed.c), not in .bss
 * where a stray write past the library's data could redirect them. Until
 * init (or where its mapping failed) the central lists are these, which
 * nothing allocates from: fork and stats may still walk them. */
typedef struct primary_meta {
  central_t lists[QM_NCLASS];
  _Atomic size_t committed[QM_NCLASS + 1];
} primary_meta_t;

central_t qm__central_none[QM_NCLASS];

/* Per-class region: 8 GiB (424 GiB of the layout in all, os.h, claimed
 * only as the classes grow), halved while the layout has no room for it
 * (an address space of fewer than 47 bits). */
#define RSHIFT_MAX 33
#define RSHIFT_MIN 21
/* Commit at least this much at a time: each commit is an mprotect. */
#define COMMIT_STEP ((size_t)256 << 10)

/* The state tables: each a span of the layout between PROT_NONE guard
 * pages (qm_os_grow_span), entries committed as the region is (under the
 * class lock). */
static size_t tcommitted[QM_NCLASS];

/* Bytes of class c's table for a region of 1 << shift bytes. */
static size_t table_bytes(unsigned c, unsigned shift) {
  size_t size = qm_chunk_size_of(c);
  return qm_page_up((((size_t)1 << shift) + size - 1) / size * sizeof(uint64_t));
}

/* Bytes of level l of class c's bitmaps (all groups) for `slots` slots. */
static size_t lev_bytes(unsigned l, size_t slots) {
  size_t blocks = (qm_lev_words(l, slots) + BLOCK - 1) / BLOCK;
  return qm_page_up(blocks * QM_GROUPS * BLOCK * sizeof(uint64_t));
}
static size_t region_slots(unsigned c, unsigned shift) {
  return (((size_t)1 << shift) + qm_chunk_size_of(c) - 1) / qm_chunk_size_of(c);
}

#define region qm_region

/* splitmix64: independent keys per region from the one secret */
static uint64_t key_mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

int qm__primary_init(uint64_t secret) {
  size_t limbo = 0;
  for (unsigned c = 0; qm__opt.free_delay && c < QM_NCLASS; c++)
    limbo += qm_limbo_cap(c);
  /* the limbo's pages are touched only as it fills */
  primary_meta_t *pm = qm__meta_alloc(sizeof *pm + limbo * sizeof(qm_aged_t));
  if (!pm)
    return -1;
  qm__central = pm->lists;
  qm__committed = pm->committed;
  qm_aged_t *lim = (qm_aged_t *)(pm + 1);
  for (unsigned c = 0; limbo && c < QM_NCLASS; c++) {
    pm->lists[c].limbo = lim;
    lim += qm_limbo_cap(c);
  }
  /* a power of two, at least 256 KiB: the largest class's chunk then fits
   * between two guards */
  size_t g = (size_t)qm__opt.guard_interval_kb << 10;
  if (g) {
    size_t p2 = (size_t)256 << 10;
    while (p2 < g)
      p2 <<= 1;
    qm__gmask = p2 - 1;
  }
  /* classes are multiples of 16 up to the table's end: one entry per granule */
  for (size_t i = 0; i <= QM_CLASS_TAB_MAX / 8; i++)
    qm__class_tab[i] = (uint8_t)qm_class_of_calc(i * 8);
  qm__class_tab[0] = QM_ZCLASS;
  for (unsigned c = 0; c < QM_NCLASS; c++) {
    qm__class[c].key = key_mix(secret ^ ((uint64_t)c << 1));
    qm__class[c].ckey = key_mix(secret ^ ((uint64_t)c << 1 | 1)) | 1;
    qm_lock_reinit(&central[c].lock); /* before any thread can use it */
    size_t size = qm_chunk_size_of(c);
    QM_CHECK_OP(qm_class_of_calc(size - QM_CANARY), ==, c);
    qm__class[c].size = (uint32_t)size;
    /* the smallest request of the class puts its canary here */
    qm__class[c].lo = c ? qm__class[c - 1].size - QM_CANARY + 1 : 0;
    qm__class[c].magic = UINT64_MAX / size + 1;
    size_t slots = 32768 / size;
    qm__class[c].cache_max = (uint32_t)(slots < 2 ? 2 : slots > 128 ? 128 : slots);
  }
  QM_CHECK_OP(qm_chunk_size_of(QM_NCLASS - 1), ==, QM_CHUNK_MAX);
  /* the classes, the zero-size region, and a guard page below them all:
   * a span of the layout, claimed as each class grows (the guard page at
   * once); where something is in the way of the guard page, another span */
  /* at most a quarter of the layout: the spans a failed try took stay
   * taken, and in a small address space (39-bit VA: a 252 GiB layout) the
   * largest regions (53 << 33: 424 GiB) never fit, and tries at shifts that
   * fit only from a low base used up the layout; in about 1 process in 12
   * under qemu-user, which puts the aarch64 guest below 2^39, no shift was
   * left with room and there was no small heap */
  unsigned first = RSHIFT_MAX;
  while (first > RSHIFT_MIN && ((size_t)(QM_NCLASS + 1) << first) > qm_os_layout_bytes() / 4)
    first--;
  for (unsigned shift = first, tries = 0; shift >= RSHIFT_MIN; tries++) {
    size_t span = (size_t)(QM_NCLASS + 1) << shift;
    uintptr_t p = qm_os_span(span + qm__page, qm__page);
    int err = p ? qm_os_claim((void *)p, qm__page, QM_PROT_NONE) : ENOMEM;
    if (err) {
      if (!p || tries >= 4) {
        shift--;
        tries = 0;
      }
      continue;
    }
    bool ok = true;
    for (unsigned c = 0; c < QM_NCLASS && ok; c++) {
      central_t *cl = &central[c];
      ok = !qm_os_grow_span(&cl->tgrow, table_bytes(c, shift), 0, true);
      for (unsigned l = 0; l < LEVELS && ok; l++)
        ok = !qm_os_grow_span(&cl->lgrow[l], lev_bytes(l, region_slots(c, shift)), 0, true);
    }
    if (!ok) { /* the layout is full: a smaller one */
      qm_os_unmap((void *)p, qm__page);
      shift--;
      continue;
    }
    qm__pbase = p + qm__page;
    qm__rshift = shift;
    qm__rmask = ((uintptr_t)1 << shift) - 1;
    qm__pspan = span;
    for (unsigned c = 0; c <= QM_NCLASS; c++)
      qm__class[c].base = qm_region(c);
    for (unsigned c = 0; c < QM_NCLASS; c++) {
      central_t *cl = &central[c];
      cl->rgrow =
          (qm_os_grow_t){.base = qm_region(c), .len = (size_t)1 << shift, .top = qm_region(c)};
      qm__class[c].table = (uint64_t *)cl->tgrow.base;
      for (unsigned l = 0; l < LEVELS; l++)
        cl->lev[l] = (uint64_t *)cl->lgrow[l].base;
    }
    /* bin slots carry a generation in the top 16 bits of an address */
    QM_CHECK_OP(qm__pbase + span, <=, QM_SLOT_ADDR);
    return 0;
  }
  return ENOMEM;
}

/* How guard pages are made: guard markers (MADV_GUARD_INSTALL, Linux 6.13+,
 * commit 662df3e5c376), which split no mapping, or, where the kernel lacks
 * them, mprotect(PROT_NONE), which splits the region's mapping in two per
 * guard. When the kernel refuses one (vm.max_map_count reached), that page
 * stays RW: one guard fewer, and its dead slots stay unused all the same. */
enum { GUARD_UNKNOWN, GUARD_MARKER, GUARD_PROTECT };
static _Atomic int guard_kind;
static _Atomic size_t guards_made, guards_missed;

static void make_guard(uintptr_t page) {
  int kind = atomic_load_explicit(&guard_kind, memory_order_relaxed);
  if (kind != GUARD_PROTECT) {
    int r = qm_os_guard_install((void *)page, qm__page);
    if (!r) {
      atomic_store_explicit(&guard_kind, GUARD_MARKER, memory_order_relaxed);
      atomic_fetch_add_explicit(&guards_made, 1, memory_order_relaxed);
      return;
    }
    if (r != EINVAL) {
      atomic_fetch_add_explicit(&guards_missed, 1, memory_order_relaxed);
      return;
    }
    atomic_store_explicit(&guard_kind, GUARD_PROTECT, memory_order_relaxed);
  }
  if (qm_os_protect((void *)page, qm__page, QM_PROT_RW, QM_PROT_NONE))
    atomic_fetch_add_explicit(&guards_missed, 1, memory_order_relaxed);
  else
    atomic_fetch_add_explicit(&guards_made, 1, memory_order_relaxed);
}

#ifdef QM_TEST_HOOKS
void qm__primary_guards(size_t *made, size_t *missed, bool *markers) {
  *made = atomic_load_explicit(&guards_made, memory_order_relaxed);
  *missed = atomic_load_explicit(&guards_missed, memory_order_relaxed);
  *markers = atomic_load_explicit(&guard_kind, memory_order_relaxed) == GUARD_MARKER;
}
#endif

/* Makes [0, upto) of region c RW, but for its guard pages; false if the
 * kernel refused. */
bool qm__primary_commit(unsigned c, size_t upto) {
  size_t have = atomic_load_explicit(&qm__committed[c], memory_order_relaxed);
  if (upto <= have)
    return true;
  size_t limit = (size_t)1 << qm__rshift;
  size_t want = qm_page_up(upto - have > COMMIT_STEP ? upto : have + COMMIT_STEP);
  if (want > limit)
    want = limit;
  /* the table first: a committed chunk always has a committed entry */
  size_t tneed = qm_page_up((want + qm__class[c].size - 1) / qm__class[c].size * sizeof(uint64_t));
  central_t *cl = &central[c];
  if (tneed > tcommitted[c]) {
    if (qm_os_grow(&cl->tgrow, tneed) ||
        qm_os_protect((void *)((uintptr_t)qm__class[c].table + tcommitted[c]),
                      tneed - tcommitted[c], QM_PROT_NONE, QM_PROT_RW))
      return false;
    tcommitted[c] = tneed;
  }
  /* and the free sets' bits of every slot of it */
  for (unsigned l = 0; l < LEVELS; l++) {
    size_t need = lev_bytes(l, (want + qm__class[c].size - 1) / qm__class[c].size);
    if (need <= cl->lcom[l])
      continue;
    if (qm_os_grow(&cl->lgrow[l], need) ||
        qm_os_protect((char *)cl->lev[l] + cl->lcom[l], need - cl->lcom[l], QM_PROT_NONE,
                      QM_PROT_RW))
      return false;
    cl->lcom[l] = need;
  }
  if (qm_os_grow(&cl->rgrow, want) ||
      qm_os_protect((void *)(region(c) + have), want - have, QM_PROT_NONE, QM_PROT_RW))
    return false;
  if (qm__gmask)
    for (size_t e = (have | qm__gmask) + 1; e <= want; e += qm__gmask + 1)
      make_guard(region(c) + e - qm__page);
  atomic_store_explicit(&qm__committed[c], want, memory_order_release);
  return true;
}

#ifdef QM_TEST_HOOKS
size_t qm__primary_tables(uintptr_t (*out)[2], size_t cap) {
  size_t n = 0;
  for (unsigned c = 0; c < QM_NCLASS && n < cap && qm__pspan; c++) {
    central_t *cl = &central[c];
    qm_lock(&cl->lock);
    if (tcommitted[c]) {
      out[n][0] = (uintptr_t)qm__class[c].table;
      out[n++][1] = (uintptr_t)qm__class[c].table + tcommitted[c];
    }
    for (unsigned l = 0; l < LEVELS && n < cap; l++)
      if (cl->lcom[l]) {
        out[n][0] = (uintptr_t)cl->lev[l];
        out[n++][1] = (uintptr_t)cl->lev[l] + cl->lcom[l];
      }
    qm_unlock(&cl->lock);
  }
  return n;
}
#endif

void qm__primary_stats(qm_primary_stats_t *s) {
  memset(s, 0, sizeof *s);
  for (unsigned c = 0; c < QM_NCLASS && qm__pspan; c++) {
    central_t *cl = &central[c];
    qm_lock(&cl->lock);
    s->reserved += qm_os_grown(&cl->rgrow);
    s->committed += atomic_load_explicit(&qm__committed[c], memory_order_relaxed);
    s->carved += cl->carved - cl->dead;
    /* the limbo's chunks are free, waiting out their delay */
    s->central_free += (qm_central_nfree(cl) + cl->lq.n) * qm__class[c].size;
    s->purged_bytes += cl->purged_bytes;
    s->purges += cl->purges;
    qm_unlock(&cl->lock);
  }
}

void qm__primary_lock_all(void) {
  for (unsigned c = 0; c < QM_NCLASS; c++)
    qm_fork_lock(&central[c].lock);
}
void qm__primary_unlock_all(void) {
  for (unsigned c = QM_NCLASS; c--;)
    qm_unlock(&central[c].lock);
}

void qm__primary_fork_locks(void) {
  for (unsigned c = 0; c < QM_NCLASS; c++)
    qm_lock_reinit(&central[c].lock);
}
