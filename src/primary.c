/* primary.c: size classes, the one span of the layout (os.h) that holds
 * every class region, the spans of their state tables and per-class central
 * free sets: out of band, a bitmap over the class's chunk slots per group of
 * threads. Regions, their tables and bitmaps are claimed and committed
 * (PROT_NONE -> RW) as they are carved, so only classes in use hold address
 * space, and pages wholly covered by central free chunks go
 * back to the kernel at most once per release interval. A bit is set only
 * for a carved chunk that is in no cache and not in use, in one group's
 * bitmap. A class lock is taken under no other lock and takes none; no two
 * class locks are held at once except by fork.
 */
#include "primary.h"

#include <errno.h>
#include <string.h>
#include <time.h>

#include "age.h"
#include "entry.h"
#include "lock.h"
#include "meta.h"
#include "options.h"
#include "os.h"
#include "random.h"
#include "report.h"

/* The free sets' bitmaps: three levels, each level's words of the
 * QM_GROUPS groups in turns of BLOCK words (a 4 KiB page), so that a
 * group's bits take pages of their own (all side by side, 4 groups took 4
 * times the memory) and each level is committed as one range. Bit i of level 0 is chunk slot i; bit
 * j of level 1 says level-0 word j is not zero; bit k of level 2 says level-1 word k is not zero. A
 * take finds the lowest free chunks through levels 2 and 1 in a few loads however sparse the set
 * is (a refill starts at a random one of the lowest: WINDOW). Free chunk addresses in batches of 64
 * (8 bytes a chunk) had cost python3 2.5 MB at its exit, when all its 64-byte objects were freed at
 * once (peak RSS 34.9 MiB against jemalloc's 29.4); a bit a chunk costs 1/64 of that. */
#define LEVELS 3
#define BLOCK 512

typedef struct central {
  qm_lock_t lock;
  /* one free set per group of threads: a thread's cache gives to and takes
   * from its own group's first, so while few, the chunks one thread gave
   * back go back to it or to threads of its group, not to any thread.
   * Chunks that two threads hand back and forth end up side by side in the
   * same cache lines, each thread's stores pulling those lines from the
   * other's core: small churn with 2 threads ran at half the speed of 2
   * one-thread processes. */
  uint64_t *lev[LEVELS];      /* the bitmaps (NULL until init) */
  size_t lcom[LEVELS];        /* bytes of each level committed */
  size_t nfree_of[QM_GROUPS]; /* chunks in each group's set */
  size_t top[QM_GROUPS];      /* each group's lowest level-2 word that may be non-zero */
  size_t carved;              /* bytes carved from the region start */
  size_t dead;                /* of them, in dead slots (over a guard page) */
  size_t given_since_purge;
  uint64_t last_purge_ns;
  size_t purged_bytes, purges;
  /* the address space of the region, its table and its bitmaps' levels,
   * claimed as commit() reaches it */
  qm_os_grow_t rgrow, tgrow, lgrow[LEVELS];
  /* Delayed free (free_delay = D > 0): chunks freed where no thread's ring
   * can age them (its thread exited, the id was closed, the thread has no
   * cache) wait here, stamped on the class's clock: the mallocs of threads
   * without a cache, each counted under this lock as it takes its chunk.
   * A thread with a cache adopts them into its ring at a refill, with the
   * age they have (qm__central_adopt); a take without one releases those
   * older than D into the free set. Either way a chunk waits D mallocs.
   * limbo_cap(c) entries (NULL while D is 0). */
  qm_aged_t *limbo;
  qm_age_t lq;
  uint32_t clock;
  _Atomic uint32_t held; /* lq.n, stored under the lock, read without it */
} __attribute__((aligned(64))) central_t;

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
extern struct central *qm__central;
static central_t central_none[QM_NCLASS];
#define central (qm__central ? qm__central : central_none)
static _Atomic uint64_t pending;   /* classes with a purge due (bit c) */
static _Atomic size_t limbo_early; /* chunks that left a full limbo early */
/* Bytes of the chunks in every class's limbo (changed under the class's
 * lock, summed over classes): at most free_delay_kb, as a thread's rings.
 * Without it a program whose threads come and go (mstress under
 * hardening=max) kept 16 MiB of each large class here. */
static _Atomic size_t limbo_bytes;
static _Atomic size_t limbo_over; /* chunks that left early for it */

/* Per-class region: 8 GiB (424 GiB of the layout in all, os.h, claimed
 * only as the classes grow), halved while the layout has no room for it
 * (an address space of fewer than 47 bits). */
#define RSHIFT_MAX 33
#define RSHIFT_MIN 21
/* Commit at least this much at a time: each commit is an mprotect. */
#define COMMIT_STEP ((size_t)256 << 10)
/* A class is worth a purge scan once this much went back to its list. */
#define PURGE_MIN ((size_t)64 << 10)

static size_t chunk_size_of(unsigned c) {
  if (c < 16)
    return (c + 1) * 16;
  unsigned k = c - 16, l = 8 + k / 4;
  return ((size_t)1 << l) + ((size_t)(k % 4 + 1) << (l - 2));
}

/* The state tables: each a span of the layout between PROT_NONE guard
 * pages (qm_os_grow_span), entries committed as the region is (under the
 * class lock). */
static size_t tcommitted[QM_NCLASS];

/* Bytes of class c's table for a region of 1 << shift bytes. */
static size_t table_bytes(unsigned c, unsigned shift) {
  size_t size = chunk_size_of(c);
  return qm_page_up((((size_t)1 << shift) + size - 1) / size * sizeof(uint64_t));
}

/* Words of one group's bitmap at level l for `slots` chunk slots. */
static size_t lev_words(unsigned l, size_t slots) {
  size_t w = slots;
  for (unsigned k = 0; k <= l; k++)
    w = (w + 63) / 64;
  return w;
}
/* Bytes of level l of class c's bitmaps (all groups) for `slots` slots. */
static size_t lev_bytes(unsigned l, size_t slots) {
  size_t blocks = (lev_words(l, slots) + BLOCK - 1) / BLOCK;
  return qm_page_up(blocks * QM_GROUPS * BLOCK * sizeof(uint64_t));
}
static size_t region_slots(unsigned c, unsigned shift) {
  return (((size_t)1 << shift) + chunk_size_of(c) - 1) / chunk_size_of(c);
}

#define region qm_region

/* splitmix64: independent keys per region from the one secret */
static uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* As a thread's delayed-free ring: 2D entries, at most QM_DELAY_BYTES of
 * chunks. From the sealed options and class sizes, not stored: a writable
 * cap would let corruption index past the array. */
static uint32_t limbo_cap(unsigned c) {
  size_t cap = 2 * (size_t)qm__opt.free_delay, fit = QM_DELAY_BYTES / chunk_size_of(c);
  return (uint32_t)(cap < fit ? cap : fit ? fit : 1);
}

int qm__primary_init(uint64_t secret) {
  size_t limbo = 0;
  for (unsigned c = 0; qm__opt.free_delay && c < QM_NCLASS; c++)
    limbo += limbo_cap(c);
  /* the limbo's pages are touched only as it fills */
  primary_meta_t *pm = qm__meta_alloc(sizeof *pm + limbo * sizeof(qm_aged_t));
  if (!pm)
    return -1;
  qm__central = pm->lists;
  qm__committed = pm->committed;
  qm_aged_t *lim = (qm_aged_t *)(pm + 1);
  for (unsigned c = 0; limbo && c < QM_NCLASS; c++) {
    pm->lists[c].limbo = lim;
    lim += limbo_cap(c);
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
    qm__class[c].key = mix(secret ^ ((uint64_t)c << 1));
    qm__class[c].ckey = mix(secret ^ ((uint64_t)c << 1 | 1)) | 1;
    qm_lock_reinit(&central[c].lock); /* before any thread can use it */
    size_t size = chunk_size_of(c);
    QM_CHECK_OP(qm_class_of_calc(size - QM_CANARY), ==, c);
    qm__class[c].size = (uint32_t)size;
    /* the smallest request of the class puts its canary here */
    qm__class[c].lo = c ? qm__class[c - 1].size - QM_CANARY + 1 : 0;
    qm__class[c].magic = UINT64_MAX / size + 1;
    size_t slots = 32768 / size;
    qm__class[c].cache_max = (uint32_t)(slots < 2 ? 2 : slots > 128 ? 128 : slots);
  }
  QM_CHECK_OP(chunk_size_of(QM_NCLASS - 1), ==, QM_CHUNK_MAX);
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

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
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
static bool commit(unsigned c, size_t upto) {
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

static void purge_pending(void);

/* Checks chunks about to go to a thread cache (or straight to malloc) and
 * shuffles them: a batch entry that is not a carved chunk of this class, or
 * whose table entry says ALLOC, is a forged entry or a corrupted list. Each
 * goes out as chunk | generation << 48, the generation read from its entry
 * (malloc writes the entry without reading it). Runs after the class lock
 * is released: only this thread holds these chunks now, and nothing writes
 * a FREE entry but the chunk's next malloc. carved is a snapshot; chunks
 * below it stay carved. */
static void arm(unsigned c, uintptr_t *out, unsigned n, size_t carved) {
  uintptr_t base = region(c);
  uint32_t size = qm__class[c].size;
  /* in shuffled order: chunks carved side by side are not handed out side
   * by side (Fisher-Yates, from the thread's stream so the order cannot be
   * foretold, nor repeated by two fork children of one parent) */
  qm_rand_thread_ready();
  for (unsigned i = n; i > 1; i--) {
    unsigned j = qm_rand_below(i);
    uintptr_t t = out[i - 1];
    out[i - 1] = out[j];
    out[j] = t;
  }
  for (unsigned i = 0; i < n; i++) {
    uintptr_t ch = out[i], roff = ch - base;
    uintptr_t index = qm_chunk_index(roff, c);
    if (roff >= carved || index * size != roff || qm_slot_dead(roff, size))
      qm__report_bad_entry(size, ch, "not a chunk of its class");
    uint64_t w = qm_entry_load(qm__class[c].table + index);
    if (qm_e_state(w) == QM_CHUNK_ALLOC || qm_e_state(w) == QM_CHUNK_SENT)
      qm__report_bad_entry(size, ch, "chunk in use");
    out[i] = qm_slot_make(ch, qm_e_gen(w));
  }
}

/* Chunks held in all groups' sets. Called with the class lock held. */
static size_t nfree(const central_t *cl) {
  size_t n = 0;
  for (unsigned g = 0; g < QM_GROUPS; g++)
    n += cl->nfree_of[g];
  return n;
}

/* Word w of group g's level l. */
QM_INLINE uint64_t *word_at(central_t *cl, unsigned l, size_t w, unsigned g) {
  return cl->lev[l] + ((w / BLOCK) * QM_GROUPS + g) * BLOCK + w % BLOCK;
}
#define W(l, w, g) (*word_at(cl, l, w, g))
/* The groups whose sets are not empty, bit g for group g: only their
 * bitmaps are read (a read of another's would map its pages). */
static unsigned groups_used(const central_t *cl) {
  unsigned m = 0;
  for (unsigned g = 0; g < QM_GROUPS; g++)
    m |= (cl->nfree_of[g] != 0) << g;
  return m;
}

/* Level-0 word k0 of group g is about to have its first bit: levels 1 and
 * 2 say so. */
static void mark_word(central_t *cl, size_t k0, unsigned g) {
  size_t k1 = k0 / 64;
  if (!W(1, k1, g)) {
    W(2, k1 / 64, g) |= (uint64_t)1 << (k1 % 64);
    if (k1 / 64 < cl->top[g])
      cl->top[g] = k1 / 64;
  }
  W(1, k1, g) |= (uint64_t)1 << (k0 % 64);
}

/* Writes level-0 word k0 of group g (bits taken out of it): where it is
 * now empty, levels 1 and 2 stop saying it has bits. */
static void set_word(central_t *cl, size_t k0, unsigned g, uint64_t bits) {
  W(0, k0, g) = bits;
  if (!bits && !(W(1, k0 / 64, g) &= ~((uint64_t)1 << (k0 % 64))))
    W(2, k0 / 4096, g) &= ~((uint64_t)1 << (k0 / 64 % 64));
}

/* The lowest non-empty level-0 word of group g at or above k0, or SIZE_MAX
 * if none: through levels 1 and 2, a few loads however sparse the set. n1,
 * n2: words of levels 1 and 2 committed per group. */
static size_t next_word(central_t *cl, unsigned g, size_t k0, size_t n1, size_t n2) {
  size_t k1 = k0 / 64, k2 = k1 / 64;
  if (k1 >= n1)
    return SIZE_MAX;
  uint64_t m = W(1, k1, g) & (~(uint64_t)0 << (k0 % 64));
  if (m)
    return k1 * 64 + (size_t)__builtin_ctzll(m);
  m = W(2, k2, g) & (~(uint64_t)1 << (k1 % 64)); /* level-1 words above k1 */
  while (!m) {
    if (++k2 >= n2)
      return SIZE_MAX;
    m = W(2, k2, g);
  }
  k1 = k2 * 64 + (size_t)__builtin_ctzll(m);
  return k1 * 64 + (size_t)__builtin_ctzll(W(1, k1, g));
}

/* A refill starts at a random free chunk of the lowest WINDOW non-empty
 * level-0 words of the set and takes chunks upward from there, the start
 * drawn low enough that the chunks above it fill the refill. Taken lowest
 * first, the lowest chunk of a thread that freed its chunks and exited was
 * in the next thread's first refill (its first 64 mallocs of 48 bytes) 200
 * of 200 times, and with thread_cache=0 (refills of one chunk) it was the
 * very next malloc: an attacker who frees a chunk it can name placed it
 * where the victim allocates next. A refill takes at most 64 chunks
 * (cache_max <= 128), one full word, so with 8 words of free chunks the
 * lowest is in a refill about 1 time in 512 and any one chunk about 1 in 8
 * (15 of 200 when the lists were stacks of addresses); a refill of one
 * picks among up to 512. 8 keeps the live chunks gathered at the low end
 * for the purge: a refill starts at most 8 words (512 chunks) above the
 * lowest free one, 32 KiB of 64-byte chunks; python3's peak RSS was the
 * same (32.5-32.7 MiB) with 8, 16 and 32. */
#define WINDOW 8

/* Moves up to want - n chunks of group g's set into out[n..] (arm shuffles
 * them): from a random one of the lowest (see WINDOW) up. Returns the new n.
 * Called with the class lock held. */
static unsigned pop_group(unsigned c, central_t *cl, unsigned g, uintptr_t *out, unsigned n,
                          unsigned want) {
  size_t left = cl->nfree_of[g], size = qm__class[c].size;
  if (!left || n >= want)
    return n;
  size_t n1 = cl->lcom[1] / (QM_GROUPS * sizeof(uint64_t));
  size_t n2 = cl->lcom[2] / (QM_GROUPS * sizeof(uint64_t));
  uintptr_t base = region(c);
  /* a set's count and its bits agree, or the state is corrupt */
  size_t lowest = next_word(cl, g, cl->top[g] * 64 * 64, n1, n2);
  QM_CHECK_OP(lowest, !=, SIZE_MAX);
  cl->top[g] = lowest / (64 * 64);
  size_t k0 = lowest;
  uint64_t from = ~(uint64_t)0; /* the bits of the first word taken */
  if (left > want - n) {        /* else every chunk goes: no start to draw */
    size_t win[WINDOW];
    unsigned nw = 0;
    uint32_t in = 0;
    for (size_t k = lowest; k != SIZE_MAX && nw < WINDOW; k = next_word(cl, g, k + 1, n1, n2)) {
      win[nw++] = k;
      in += (uint32_t)__builtin_popcountll(W(0, k, g));
    }
    /* at least want - n chunks at or above the start: no round from the
     * lowest, which took the lowest chunk whenever the start fell in the
     * set's top refill (28 of 200) */
    if (in > left - (want - n) + 1)
      in = (uint32_t)(left - (want - n) + 1);
    uint32_t r = qm_rand_below(in);
    unsigned i = 0;
    for (uint32_t p; r >= (p = (uint32_t)__builtin_popcountll(W(0, win[i], g))); i++)
      r -= p;
    k0 = win[i];
    uint64_t bits = W(0, k0, g);
    for (; r; r--)
      bits &= bits - 1;
    from = ~(uint64_t)0 << __builtin_ctzll(bits);
  }
  while (n < want && left) {
    uint64_t bits = W(0, k0, g), take = bits & from;
    for (; take && n < want; take &= take - 1, left--) {
      unsigned b = (unsigned)__builtin_ctzll(take);
      out[n++] = base + (k0 * 64 + b) * size;
      bits &= ~((uint64_t)1 << b);
    }
    set_word(cl, k0, g, bits);
    if (n < want && left) {
      from = ~(uint64_t)0;
      k0 = next_word(cl, g, k0 + 1, n1, n2);
      QM_CHECK_OP(k0, !=, SIZE_MAX);
    }
  }
  cl->nfree_of[g] = left;
  return n;
}

/* Table entries (8 bytes) in a 64-byte cache line: the bits of a byte of
 * a set's word. */
#define LINE_ENTRIES 8u
/* Words of another group's set a steal looks through for whole free lines:
 * bounds the time under the lock. */
#define STEAL_SCAN 256

/* Puts chunk index i of class c into group g's set (lock held). */
static void set_put(central_t *cl, size_t i, unsigned g) {
  uint64_t *w = word_at(cl, 0, i / 64, g);
  if (!*w)
    mark_word(cl, i / 64, g);
  *w |= (uint64_t)1 << (i % 64);
}

/* Takes whole table lines from group g's set into out[n..] (up to want;
 * the rest of the last line goes to group own's set); returns the new n.
 * A line (8 chunks whose entries share 64 bytes) moves to the thread
 * whole: a chunk taken alone leaves its line shared with g's thread, and
 * both then write it at every malloc and free of theirs. Lines with a
 * chunk out of g's set (in use, or another group's) stay. Lock held. */
static unsigned steal_lines(unsigned c, central_t *cl, unsigned g, unsigned own, uintptr_t *out,
                            unsigned n, unsigned want) {
  size_t size = qm__class[c].size, moved = 0, taken = 0;
  size_t n1 = cl->lcom[1] / (QM_GROUPS * sizeof(uint64_t));
  size_t n2 = cl->lcom[2] / (QM_GROUPS * sizeof(uint64_t));
  uintptr_t base = region(c);
  size_t k = next_word(cl, g, cl->top[g] * 64 * 64, n1, n2);
  for (unsigned scanned = 0; k != SIZE_MAX && n < want && scanned < STEAL_SCAN; scanned++) {
    uint64_t bits = W(0, k, g);
    for (unsigned b = 0; b < 64 && n < want; b += LINE_ENTRIES) {
      if ((bits >> b & 0xff) != 0xff)
        continue;
      bits &= ~((uint64_t)0xff << b);
      for (unsigned i = 0; i < LINE_ENTRIES; i++) {
        size_t index = k * 64 + b + i;
        if (n < want) {
          out[n++] = base + index * size;
          taken++;
        } else {
          set_put(cl, index, own);
          moved++;
        }
      }
    }
    set_word(cl, k, g, bits);
    k = next_word(cl, g, k + 1, n1, n2);
  }
  cl->nfree_of[g] -= taken + moved;
  cl->nfree_of[own] += moved;
  return n;
}

/* Carves up to want - n fresh chunks into out[n..], committing as needed;
 * returns the new n. Called with the class lock held. */
static unsigned carve(unsigned c, central_t *cl, unsigned g, uintptr_t *out, unsigned n,
                      unsigned want) {
  size_t size = qm__class[c].size;
  size_t limit = (size_t)1 << qm__rshift;
  /* slots for the chunks wanted, and for the dead ones among them */
  size_t k = 0, live = 0;
  for (size_t at = cl->carved; live < want - n && at + size <= limit; at += size, k++)
    live += !qm_slot_dead(at, size);
  /* and on to the end of a table line: the chunks past those wanted go to
   * group g's set, so that no line of entries holds two groups' chunks
   * (steal_lines keeps it so). Every malloc and free writes its chunk's
   * entry, so a line two threads' chunks share moves between their cores
   * at every op: with chunks taken singly from another group and carves
   * alternating within lines, 34-38% of the lines in use in two-thread
   * small churn held both threads' entries, and two threads ran no faster
   * than one. */
  while (k && (cl->carved / size + k) % LINE_ENTRIES && cl->carved + (k + 1) * size <= limit)
    k++;
  if (k && !commit(c, cl->carved + k * size)) {
    size_t have = atomic_load_explicit(&qm__committed[c], memory_order_relaxed);
    k = have >= cl->carved ? (have - cl->carved) / size : 0;
  }
  size_t extra = 0;
  for (; k; k--, cl->carved += size) {
    if (qm_slot_dead(cl->carved, size)) {
      cl->dead += size; /* never handed out: not in use either (stats) */
    } else if (n < want) {
      out[n++] = region(c) + cl->carved;
    } else {
      set_put(cl, cl->carved / size, g);
      extra++;
    }
  }
  cl->nfree_of[g] += extra;
  return n;
}

/* Puts the chunk of slot s into group g's set; others: the other groups
 * in use, whose bits a chunk given back twice may sit in. Called with the
 * class lock held. */
static void put_locked(unsigned c, central_t *cl, unsigned g, unsigned others, uintptr_t s) {
  uintptr_t base = region(c);
  size_t size = qm__class[c].size;
  /* the generation is in the table; the bit is the chunk's slot, so the
   * address must be one (the caches' arrays are guarded metadata, but a
   * bad address here would set a bit anywhere) */
  uintptr_t ch = qm_slot_chunk(s), roff = ch - base, index = qm_chunk_index(roff, c);
  if (QM_UNLIKELY(roff >= cl->carved || index * size != roff || qm_slot_dead(roff, size)))
    qm__report_bad_entry(size, ch, "not a chunk of its class");
  uint64_t bit = (uint64_t)1 << (index % 64), any = W(0, index / 64, g);
  for (unsigned k = 0; QM_UNLIKELY(others >> k); k++)
    if (others >> k & 1)
      any |= W(0, index / 64, k);
  if (QM_UNLIKELY(any & bit))
    qm__report_bad_entry(size, ch, "chunk given back twice");
  set_put(cl, index, g);
  cl->nfree_of[g]++;
}

/* n chunks left class c's limbo (lock held): its bytes and count after. */
static void limbo_left(unsigned c, central_t *cl, uint32_t n) {
  atomic_fetch_sub_explicit(&limbo_bytes, (size_t)n * chunk_size_of(c), memory_order_relaxed);
  atomic_store_explicit(&cl->held, cl->lq.n, memory_order_relaxed);
}

/* The oldest chunk of class c's limbo into group g's set (lock held). */
static void limbo_release_oldest(unsigned c, central_t *cl, unsigned g, unsigned others) {
  put_locked(c, cl, g, others, cl->limbo[qm_age_pop(&cl->lq, limbo_cap(c))].item);
  limbo_left(c, cl, 1);
}

/* A malloc of a thread without a cache, about to take its chunk: the
 * limbo's clock ticks, and its chunks that have waited out free_delay join
 * group g's set. Called with the class lock held. */
static void limbo_tick_locked(unsigned c, central_t *cl, unsigned g) {
  uint32_t now = ++cl->clock, cap = limbo_cap(c), n = cl->lq.n;
  unsigned others = groups_used(cl) & ~(1u << g);
  while (qm_age_due(&cl->lq, cl->limbo, now, (uint32_t)qm__opt.free_delay))
    put_locked(c, cl, g, others, cl->limbo[qm_age_pop(&cl->lq, cap)].item);
  limbo_left(c, cl, n - cl->lq.n);
}

unsigned qm__central_take(unsigned c, unsigned group, uintptr_t *out, unsigned want, bool ticks) {
  if (atomic_load_explicit(&pending, memory_order_relaxed))
    purge_pending();
  central_t *cl = &central[c];
  unsigned n = 0, own = group % QM_GROUPS;
  /* Another group's chunks are taken before carving only once it holds
   * more than QM_STEAL_MIN bytes of them (a thread that frees what others
   * allocate, say), and in whole table lines (steal_lines): below that,
   * carving keeps each group's chunks apart, and what a group leaves idle
   * stays bounded. Once the region cannot give more, any group's. */
  size_t steal_min = QM_STEAL_MIN / qm__class[c].size;
  qm_rand_thread_ready(); /* pop_group draws where to start */
  qm_lock(&cl->lock);
  if (QM_UNLIKELY(ticks && cl->limbo))
    limbo_tick_locked(c, cl, own);
  n = pop_group(c, cl, own, out, n, want);
  for (unsigned k = 1, g = (own + 1) % QM_GROUPS; k < QM_GROUPS && n < want;
       k++, g = (g + 1) % QM_GROUPS)
    if (cl->nfree_of[g] > steal_min)
      n = steal_lines(c, cl, g, own, out, n, want);
  if (n < want)
    n = carve(c, cl, own, out, n, want);
  for (unsigned g = 0; g < QM_GROUPS && n < want; g++)
    n = pop_group(c, cl, g, out, n, want);
  size_t carved = cl->carved;
  qm_unlock(&cl->lock);
  arm(c, out, n, carved);
  return n;
}

/* Gives back the pages inside free chunks [a, b) of class c (slot
 * indexes); b at the carved end takes the never-carved rest of the last
 * page too. */
static void purge_run(unsigned c, central_t *cl, size_t a, size_t b) {
  size_t size = qm__class[c].size, pg = qm__page;
  size_t lo = qm_page_up(a * size);
  size_t hi = b * size == cl->carved ? qm_page_up(cl->carved) : qm_align_down(b * size, pg);
  if (hi <= lo)
    return;
  void *at = (void *)(region(c) + lo);
  int r = qm__opt.purge == QM_PURGE_FREE ? qm_os_free_lazy(at, hi - lo, QM_PROT_RW)
                                         : qm_os_dontneed(at, hi - lo, QM_PROT_RW);
  if (!r)
    cl->purged_bytes += hi - lo;
}

/* Gives every page that class c's free chunks, in any group's set (and the
 * never-carved tail), cover completely back to the kernel: the pages inside
 * each run of free slots. A free chunk covers its own bytes: its state is
 * in the table, and a live chunk's canary lies inside the live chunk. Dead
 * slots (over a guard page) are never free, so no run holds a guard page.
 * Called with the class lock held. */
static void purge_locked(unsigned c) {
  central_t *cl = &central[c];
  size_t size = qm__class[c].size, pg = qm__page;
  cl->given_since_purge = 0;
  /* read without the lock by purge_pending: a stale value only delays it */
  __atomic_store_n(&cl->last_purge_ns, now_ns(), __ATOMIC_RELAXED);
  if (!cl->carved || nfree(cl) * size < 2 * pg)
    return;
  size_t slots = cl->carved / size, nw = (slots + 63) / 64, start = SIZE_MAX;
  unsigned used = groups_used(cl);
  for (size_t w = 0; w < nw; w++) {
    if (start == SIZE_MAX && !(w % 64)) {
      /* no run under way: skip 64 words no group has a bit in */
      uint64_t any = 0;
      for (unsigned g = 0; g < QM_GROUPS; g++)
        if (used >> g & 1)
          any |= W(1, w / 64, g);
      if (!any) {
        w += 63;
        continue;
      }
    }
    uint64_t x = 0;
    for (unsigned g = 0; g < QM_GROUPS; g++)
      if (used >> g & 1)
        x |= W(0, w, g);
    /* runs of ones in x, the one under way (from start) included */
    for (unsigned at = 0; at < 64;) {
      uint64_t m = start == SIZE_MAX ? x >> at : ~x >> at;
      if (!m)
        break;
      at += (unsigned)__builtin_ctzll(m);
      if (start == SIZE_MAX) {
        start = w * 64 + at;
      } else {
        /* a run shorter than a page covers none (python3's purges of its
         * 48-byte class met 10,000 runs each, nearly all short), unless it
         * ends at the carved end, where the rest of the last page goes too */
        size_t end = w * 64 + at;
        if ((end - start) * size >= pg || end == slots)
          purge_run(c, cl, start, end);
        start = SIZE_MAX;
      }
    }
  }
  if (start != SIZE_MAX)
    purge_run(c, cl, start, slots);
  cl->purges++;
}

void qm__central_group_bytes(size_t bytes[QM_GROUPS]) {
  for (unsigned g = 0; g < QM_GROUPS; g++)
    bytes[g] = 0;
  for (unsigned c = 0; c < QM_NCLASS; c++) {
    central_t *cl = &central[c];
    qm_lock(&cl->lock);
    for (unsigned g = 0; g < QM_GROUPS; g++)
      bytes[g] += cl->nfree_of[g] * (size_t)qm__class[c].size;
    qm_unlock(&cl->lock);
  }
}

#ifdef QM_TEST_HOOKS
size_t qm__central_group_free(unsigned c, unsigned group) {
  central_t *cl = &central[c];
  qm_lock(&cl->lock);
  size_t n = cl->nfree_of[group % QM_GROUPS];
  qm_unlock(&cl->lock);
  return n;
}
#endif

unsigned qm__central_adopt(unsigned c, uintptr_t *items, uint32_t *ages, unsigned room) {
  central_t *cl = &central[c];
  if (!cl->limbo || !atomic_load_explicit(&cl->held, memory_order_relaxed))
    return 0; /* read unlocked: a hint; one missed is adopted at the next refill */
  uint32_t cap = limbo_cap(c), d = (uint32_t)qm__opt.free_delay;
  unsigned n = 0;
  qm_lock(&cl->lock);
  for (; n < room && cl->lq.n; n++) {
    qm_aged_t e = cl->limbo[qm_age_pop(&cl->lq, cap)];
    uint32_t age = cl->clock - e.at;
    items[n] = e.item;
    ages[n] = age < d ? age : d;
  }
  limbo_left(c, cl, n);
  qm_unlock(&cl->lock);
  return n;
}

void qm__central_hold(unsigned c, unsigned group, uintptr_t s, uint32_t age) {
  central_t *cl = &central[c];
  if (!cl->limbo) { /* no delay, or before init */
    qm__central_give(c, group, &s, 1);
    return;
  }
  uint32_t cap = limbo_cap(c);
  unsigned g = group % QM_GROUPS;
  size_t size = chunk_size_of(c), budget = (size_t)qm__opt.free_delay_kb << 10, over = 0;
  qm_lock(&cl->lock);
  unsigned others = groups_used(cl) & ~(1u << g);
  if (qm_age_full(&cl->lq, cap)) {
    limbo_release_oldest(c, cl, g, others);
    atomic_fetch_add_explicit(&limbo_early, 1, memory_order_relaxed);
  }
  /* over the budget: this class's oldest go first; if that is not enough,
   * this chunk goes back into use now (the other classes' chunks are under
   * their own locks, which no class lock may wait for) */
  while (cl->lq.n && atomic_load_explicit(&limbo_bytes, memory_order_relaxed) + size > budget) {
    limbo_release_oldest(c, cl, g, others);
    over++;
  }
  if (atomic_load_explicit(&limbo_bytes, memory_order_relaxed) + size > budget) {
    put_locked(c, cl, g, others, s);
    over++;
  } else {
    cl->limbo[qm_age_push(&cl->lq, cap)] = (qm_aged_t){s, cl->clock - age};
    atomic_fetch_add_explicit(&limbo_bytes, size, memory_order_relaxed);
  }
  atomic_store_explicit(&cl->held, cl->lq.n, memory_order_relaxed);
  qm_unlock(&cl->lock);
  if (over)
    atomic_fetch_add_explicit(&limbo_over, over, memory_order_relaxed);
}

size_t qm__central_limbo_early(void) {
  return atomic_load_explicit(&limbo_early, memory_order_relaxed);
}
size_t qm__central_limbo_over(void) {
  return atomic_load_explicit(&limbo_over, memory_order_relaxed);
}
#ifdef QM_TEST_HOOKS
size_t qm__central_limbo_bytes(void) {
  return atomic_load_explicit(&limbo_bytes, memory_order_relaxed);
}
#endif

void qm__central_give(unsigned c, unsigned group, const uintptr_t *in, unsigned n) {
  central_t *cl = &central[c];
  unsigned g = group % QM_GROUPS;
  size_t size = qm__class[c].size;
  qm_lock(&cl->lock);
  unsigned others = groups_used(cl) & ~(1u << g);
  for (unsigned i = 0; i < n; i++)
    put_locked(c, cl, g, others, in[i]);
  /* a scan costs O(carved slots / 64) at most: run one only when a quarter
   * of the free set is new since the last, so its cost per freed chunk stays
   * bounded; too soon after the last one, leave it pending for the next slow
   * path of any class */
  cl->given_since_purge += (size_t)n * size;
  if (cl->given_since_purge >= PURGE_MIN && cl->given_since_purge >= nfree(cl) * size / 4) {
    if (now_ns() - cl->last_purge_ns >= qm__opt.release_interval_ms * 1000000u)
      purge_locked(c);
    else
      atomic_fetch_or_explicit(&pending, (uint64_t)1 << c, memory_order_relaxed);
  }
  qm_unlock(&cl->lock);
}

/* Purges the classes left pending whose interval has passed. Memory freed in
 * one class cannot serve another, so when a program moves from one size to
 * another, this is what keeps its RSS from holding both. Takes one class
 * lock at a time, none held by the caller. */
static void purge_pending(void) {
  uint64_t now = now_ns(), interval = qm__opt.release_interval_ms * 1000000u;
  uint64_t bits = atomic_load_explicit(&pending, memory_order_relaxed);
  while (bits) {
    unsigned c = (unsigned)__builtin_ctzll(bits);
    bits &= bits - 1;
    central_t *cl = &central[c];
    if (now - __atomic_load_n(&cl->last_purge_ns, __ATOMIC_RELAXED) < interval)
      continue;
    atomic_fetch_and_explicit(&pending, ~((uint64_t)1 << c), memory_order_relaxed);
    qm_lock(&cl->lock);
    purge_locked(c);
    qm_unlock(&cl->lock);
  }
}

size_t qm__primary_purge_all(void) {
  size_t before = 0, after = 0;
  for (unsigned c = 0; c < QM_NCLASS && qm__pspan; c++) {
    central_t *cl = &central[c];
    qm_lock(&cl->lock);
    before += cl->purged_bytes;
    purge_locked(c);
    after += cl->purged_bytes;
    qm_unlock(&cl->lock);
  }
  return after - before;
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
    s->central_free += (nfree(cl) + cl->lq.n) * qm__class[c].size;
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
/* In a fork child: every free chunk of class c (all in group own's set)
 * takes a fresh generation, so two children of one parent do not hand it
 * out with the same canary. Which they take first, and in which order,
 * follows from their own reseeded streams (arm's shuffle). */
static void fork_regen(unsigned c, central_t *cl, unsigned own, qm_regen_fn regen) {
  size_t nw = lev_words(0, cl->carved / qm__class[c].size);
  for (size_t w = 0; w < nw; w++)
    for (uint64_t bits = W(0, w, own); bits; bits &= bits - 1)
      regen(region(c) + (w * 64 + (size_t)__builtin_ctzll(bits)) * qm__class[c].size, c);
}

/* The forking thread is the child's only one: every group's set becomes
 * its group's, or chunks below QM_STEAL_MIN in the others would sit unused. */
void qm__primary_fork_locks(void) {
  for (unsigned c = 0; c < QM_NCLASS; c++)
    qm_lock_reinit(&central[c].lock);
}

void qm__primary_fork_child(unsigned group, qm_regen_fn regen) {
  unsigned own = group % QM_GROUPS;
  for (unsigned c = 0; c < QM_NCLASS; c++) {
    central_t *cl = &central[c];
    unsigned others = groups_used(cl) & ~(1u << own);
    if (!others)
      continue;
    for (unsigned l = 0; l < LEVELS; l++)
      for (size_t w = 0, nw = cl->lcom[l] / (QM_GROUPS * sizeof(uint64_t)); w < nw; w++)
        for (unsigned g = 0; g < QM_GROUPS; g++)
          if ((others >> g & 1) && W(l, w, g)) {
            W(l, w, own) |= W(l, w, g);
            W(l, w, g) = 0;
          }
    for (unsigned g = 0; g < QM_GROUPS; g++)
      if (g != own) {
        cl->nfree_of[own] += cl->nfree_of[g];
        cl->nfree_of[g] = 0;
      }
    cl->top[own] = 0;
  }
  for (unsigned c = 0; c < QM_NCLASS; c++) {
    central_t *cl = &central[c];
    if (cl->nfree_of[own])
      fork_regen(c, cl, own, regen);
    for (uint32_t i = 0, cap = limbo_cap(c); i < cl->lq.n; i++) {
      qm_aged_t *e = &cl->limbo[qm_age_at(&cl->lq, i, cap)];
      e->item = regen(e->item, c);
    }
  }
}
