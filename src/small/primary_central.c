/* primary_central.c: the central free sets of each class (bitmaps over its
 * chunk slots, one set per group of threads), refills taken from them or
 * carved afresh, chunks given back, and the pages wholly covered by free
 * chunks given back to the kernel at most once per release interval. A bit
 * is set only for a carved chunk that is in no cache and not in use, in
 * one group's bitmap. A class lock is taken under no other lock and takes
 * none; no two class locks are held at once except by fork.
 */
#include "primary.h"

#include <time.h>

#include "entry.h"
#include "lock.h"
#include "options.h"
#include "os.h"
#include "primary_state.h"
#include "random.h"
#include "report.h"

static _Atomic uint64_t pending; /* classes with a purge due (bit c) */

/* A class is worth a purge scan once this much went back to its list. */
#define PURGE_MIN ((size_t)64 << 10)

#define region qm_region

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
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

/* Word w of group g's level l. */
QM_INLINE uint64_t *word_at(central_t *cl, unsigned l, size_t w, unsigned g) {
  return cl->lev[l] + ((w / BLOCK) * QM_GROUPS + g) * BLOCK + w % BLOCK;
}
#define W(l, w, g) (*word_at(cl, l, w, g))

/* Level-0 word k0 of group g is about to have its first bit: levels 1 and
 * 2 say so. */
static void mark_word(central_t *cl, size_t k0, unsigned g) {
  size_t k1 = k0 / 64;
  if (!W(1, k1, g)) {
    W(2, k1 / 64, g) |= (uint64_t)1 << (k1 % 64);
    if (k1 / 64 < cl->top[g])
      cl->top[g] = k1 / 64;
    if (k1 / 64 >= cl->end[g])
      cl->end[g] = k1 / 64 + 1;
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
 * n2: words of levels 1 and 2 committed per group. The level-2 scan ends at
 * the group's highest word that ever had a bit (end): every refill ends by
 * asking past its set's last word, and the scan to n2 through a page of
 * empty level-2 words (512, each 262,144 chunks) cost 1,700 instructions a
 * refill, 20 an op in the hand-off benchmark. */
static size_t next_word(central_t *cl, unsigned g, size_t k0, size_t n1, size_t n2) {
  size_t k1 = k0 / 64, k2 = k1 / 64;
  if (k1 >= n1)
    return SIZE_MAX;
  if (cl->end[g] < n2)
    n2 = cl->end[g];
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
QM_INLINE void set_put(central_t *cl, size_t i, unsigned g) {
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
  if (k && !qm__primary_commit(c, cl->carved + k * size)) {
    size_t have = atomic_load_explicit(&qm__committed[c], memory_order_relaxed);
    k = have >= cl->carved ? (have - cl->carved) / size : 0;
  }
  size_t extra = 0;
  uint64_t r = 0;
  for (unsigned i = 0; k; k--, cl->carved += size) {
    if (qm_slot_dead(cl->carved, size)) {
      cl->dead += size; /* never handed out: not in use either (stats) */
      continue;
    }
    /* a fresh chunk's first generation is drawn, not 0: two fork children
     * that carve the same slots after the fork would hand them out with
     * one canary, and one child's leaked canary would be its sibling's
     * (2,866 of 2,994 slots in two children had one generation) */
    if (!(i++ % 4))
      r = qm_rand();
    qm_entry_store(qm__class[c].table + cl->carved / size,
                   (r & 0xffff) << QM_E_GEN_SHIFT | (uint64_t)QM_CHUNK_NONE << QM_E_STATE_SHIFT);
    r >>= 16;
    if (n < want) {
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
QM_INLINE void central_put_locked(unsigned c, central_t *cl, unsigned g, unsigned others,
                                  uintptr_t s) {
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

static void limbo_tick_locked(unsigned c, central_t *cl, unsigned g); /* the limbo's, below */

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
  if (!cl->carved || qm_central_nfree(cl) * size < 2 * pg)
    return;
  size_t slots = cl->carved / size, nw = (slots + 63) / 64, start = SIZE_MAX;
  unsigned used = qm_groups_used(cl);
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

void qm__central_give(unsigned c, unsigned group, const uintptr_t *in, unsigned n) {
  central_t *cl = &central[c];
  unsigned g = group % QM_GROUPS;
  size_t size = qm__class[c].size;
  qm_lock(&cl->lock);
  unsigned others = qm_groups_used(cl) & ~(1u << g);
  for (unsigned i = 0; i < n; i++)
    central_put_locked(c, cl, g, others, in[i]);
  /* a scan costs O(carved slots / 64) at most: run one only when a quarter
   * of the free set is new since the last, so its cost per freed chunk stays
   * bounded; too soon after the last one, leave it pending for the next slow
   * path of any class */
  cl->given_since_purge += (size_t)n * size;
  if (cl->given_since_purge >= PURGE_MIN &&
      cl->given_since_purge >= qm_central_nfree(cl) * size / 4) {
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

/* In a fork child: every free chunk of class c (all in group own's set)
 * takes a fresh generation, so two children of one parent do not hand it
 * out with the same canary. Which they take first, and in which order,
 * follows from their own reseeded streams (arm's shuffle). */
static void fork_regen(unsigned c, central_t *cl, unsigned own, qm_regen_fn regen) {
  size_t nw = qm_lev_words(0, cl->carved / qm__class[c].size);
  for (size_t w = 0; w < nw; w++)
    for (uint64_t bits = W(0, w, own); bits; bits &= bits - 1)
      regen(region(c) + (w * 64 + (size_t)__builtin_ctzll(bits)) * qm__class[c].size, c);
}

/* The forking thread is the child's only one: every group's set becomes
 * its group's, or chunks below QM_STEAL_MIN in the others would sit unused. */
void qm__primary_fork_child(unsigned group, qm_regen_fn regen) {
  unsigned own = group % QM_GROUPS;
  for (unsigned c = 0; c < QM_NCLASS; c++) {
    central_t *cl = &central[c];
    unsigned others = qm_groups_used(cl) & ~(1u << own);
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
        if (cl->end[g] > cl->end[own])
          cl->end[own] = cl->end[g];
      }
    cl->top[own] = 0;
  }
  for (unsigned c = 0; c < QM_NCLASS; c++) {
    central_t *cl = &central[c];
    if (cl->nfree_of[own])
      fork_regen(c, cl, own, regen);
    for (uint32_t i = 0, cap = qm_limbo_cap(c); i < cl->lq.n; i++) {
      qm_aged_t *e = &cl->limbo[qm_age_at(&cl->lq, i, cap)];
      e->item = regen(e->item, c);
    }
  }
}

/* ---- the limbo: delayed free where no thread's ring can age a chunk ----
 * Each class's limbo (central_t.limbo, primary_state.h) holds chunks
 * stamped on the class's clock, adopted into a cache's ring or released
 * into the free set after free_delay mallocs, its bytes in all classes at
 * most free_delay_kb. Changed under the class's lock; its counts are
 * atomics of its own. */

static _Atomic size_t limbo_early; /* chunks that left a full limbo early */
/* Bytes of the chunks in every class's limbo (changed under the class's
 * lock, summed over classes): at most free_delay_kb, as a thread's rings.
 * Without it a program whose threads come and go (mstress under
 * hardening=max) kept 16 MiB of each large class here. */
static _Atomic size_t limbo_bytes;
static _Atomic size_t limbo_over; /* chunks that left early for it */

/* n chunks left class c's limbo (lock held): its bytes and count after. */
static void limbo_left(unsigned c, central_t *cl, uint32_t n) {
  atomic_fetch_sub_explicit(&limbo_bytes, (size_t)n * qm_chunk_size_of(c), memory_order_relaxed);
  atomic_store_explicit(&cl->held, cl->lq.n, memory_order_relaxed);
}

/* The oldest chunk of class c's limbo into group g's set (lock held). */
static void limbo_release_oldest(unsigned c, central_t *cl, unsigned g, unsigned others) {
  central_put_locked(c, cl, g, others, cl->limbo[qm_age_pop(&cl->lq, qm_limbo_cap(c))].item);
  limbo_left(c, cl, 1);
}

/* A malloc of a thread without a cache, about to take its chunk: the
 * limbo's clock ticks, and its chunks that have waited out free_delay join
 * group g's set. Called with the class lock held. */
static void limbo_tick_locked(unsigned c, central_t *cl, unsigned g) {
  uint32_t now = ++cl->clock, cap = qm_limbo_cap(c), n = cl->lq.n;
  unsigned others = qm_groups_used(cl) & ~(1u << g);
  while (qm_age_due(&cl->lq, cl->limbo, now, (uint32_t)qm__opt.free_delay))
    central_put_locked(c, cl, g, others, cl->limbo[qm_age_pop(&cl->lq, cap)].item);
  limbo_left(c, cl, n - cl->lq.n);
}

unsigned qm__central_adopt(unsigned c, uintptr_t *items, uint32_t *ages, unsigned room) {
  central_t *cl = &central[c];
  if (!cl->limbo || !atomic_load_explicit(&cl->held, memory_order_relaxed))
    return 0; /* read unlocked: a hint; one missed is adopted at the next refill */
  uint32_t cap = qm_limbo_cap(c), d = (uint32_t)qm__opt.free_delay;
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

/* Room for size more bytes in the limbo, taken from the classes that hold
 * the most (their oldest into group g's sets early, counted in over) until
 * c holds the most, one class lock at a time and none held on entry: a
 * class lock never waits for another. The held counts read unlocked are a
 * hint; each class is looked at once. */
static size_t limbo_room_elsewhere(unsigned c, unsigned g, size_t size, size_t budget) {
  size_t over = 0;
  for (unsigned looked = 0; looked < QM_NCLASS; looked++) {
    if (atomic_load_explicit(&limbo_bytes, memory_order_relaxed) + size <= budget)
      break;
    unsigned big = QM_NCLASS;
    size_t most = 0;
    for (unsigned k = 0; k < QM_NCLASS; k++) {
      size_t b = atomic_load_explicit(&central[k].held, memory_order_relaxed) * qm_chunk_size_of(k);
      if (central[k].limbo && b > most) {
        most = b;
        big = k;
      }
    }
    if (big == QM_NCLASS || big == c) /* c's own go under its lock, below */
      break;
    central_t *bl = &central[big];
    qm_lock(&bl->lock);
    unsigned others = qm_groups_used(bl) & ~(1u << g);
    while (bl->lq.n && atomic_load_explicit(&limbo_bytes, memory_order_relaxed) + size > budget) {
      limbo_release_oldest(big, bl, g, others);
      over++;
    }
    atomic_store_explicit(&bl->held, bl->lq.n, memory_order_relaxed);
    qm_unlock(&bl->lock);
  }
  return over;
}

void qm__central_hold(unsigned c, unsigned group, uintptr_t s, uint32_t age) {
  central_t *cl = &central[c];
  if (!cl->limbo) { /* no delay, or before init */
    qm__central_give(c, group, &s, 1);
    return;
  }
  uint32_t cap = qm_limbo_cap(c);
  unsigned g = group % QM_GROUPS;
  size_t size = qm_chunk_size_of(c), budget = (size_t)qm__opt.free_delay_kb << 10, over = 0;
  /* over the budget: the classes holding the most make room, each under
   * its own lock, so that a limbo one class filled (exited threads' frees
   * of its size, which no malloc then adopts) does not put every other
   * class's frees into use at once. It did: after a test filled it with
   * 16,000- and 24,000-byte chunks, the 48-byte chunk of a thread that
   * exited came back 52 mallocs on */
  if (atomic_load_explicit(&limbo_bytes, memory_order_relaxed) + size > budget)
    over += limbo_room_elsewhere(c, g, size, budget);
  qm_lock(&cl->lock);
  unsigned others = qm_groups_used(cl) & ~(1u << g);
  if (qm_age_full(&cl->lq, cap)) {
    limbo_release_oldest(c, cl, g, others);
    atomic_fetch_add_explicit(&limbo_early, 1, memory_order_relaxed);
  }
  /* over the budget: this class's oldest go first; if that is not enough,
   * this chunk goes back into use now (the room made elsewhere was taken
   * meanwhile) */
  while (cl->lq.n && atomic_load_explicit(&limbo_bytes, memory_order_relaxed) + size > budget) {
    limbo_release_oldest(c, cl, g, others);
    over++;
  }
  if (atomic_load_explicit(&limbo_bytes, memory_order_relaxed) + size > budget) {
    central_put_locked(c, cl, g, others, s);
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
