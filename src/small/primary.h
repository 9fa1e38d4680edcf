/* primary.h: the small-chunk allocator's classes and regions. All classes
 * live in one span of the layout (os.h), claimed as each grows: class c owns [pbase + c<<rshift,
 * +1<<rshift), so "is this pointer small, and of which class" is a subtraction and a shift. Region
 * QM_ZCLASS, after the last class, is never made accessible: it holds the pointers malloc(0)
 * returns. A PROT_NONE page below the first region keeps whatever is mapped there from touching
 * class 0. Chunks of class c sit at region + i*size and hold no allocator state: their state is
 * entry i of the class's table (entry.h, smallstate.h), in a span of its own. The central free sets
 * are bitmaps out of band (a bit a chunk slot, per group of threads, beside the tables), and every
 * chunk taken from them is checked against its region and its table entry before it is handed out.
 */
#ifndef QM_PRIMARY_H
#define QM_PRIMARY_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "fmt.h"
#include "qm.h"
#include "thread.h"

#define QM_ZCLASS QM_NCLASS /* the zero-size region */
/* A chunk of class size S serves requests n with n + 8 <= S: the 8 canary
 * bytes after the request always lie inside the chunk. */
#define QM_CANARY 8u
#define QM_CHUNK_MAX ((size_t)131072)           /* the largest class size */
#define QM_SMALL_MAX (QM_CHUNK_MAX - QM_CANARY) /* largest user size of a class */

/* Fixed at init: what the fast paths read of a class. */
typedef struct qm_class_info {
  uint32_t size;      /* chunk bytes (a multiple of 16) */
  uint32_t cache_max; /* slots in a thread cache's bin */
  uint32_t lo;        /* chunk offset of the smallest request's canary */
  uint64_t magic;     /* ceil(2^64 / size): chunk index by multiply-high */
  uint64_t key, ckey; /* this region's canary keys */
  uint64_t *table;    /* this region's state table: entry i is chunk i's */
  uintptr_t base;     /* this region's first byte (qm_region) */
} __attribute__((aligned(64))) qm_class_info_t; /* a shift indexes the array */

extern QM_HIDDEN qm_class_info_t qm__class[QM_NCLASS + 1];
/* Bytes of each region that are RW; only grows (0 for QM_ZCLASS). */
/* (In the primary's metadata mapping between guard pages, reached through
 * a sealed pointer: zeroed, never-written counts until init.) */
/* Requests below it are small: 0 until init is done (every request then
 * takes the slow path, which initialises), then the large threshold in
 * bytes (init.c sets it). */
extern QM_HIDDEN size_t qm__small_limit;
extern QM_HIDDEN _Atomic size_t *qm__committed;
/* The bytes of class c's region committed so far (racy, relaxed: a chunk
 * below it has a table entry to read). */
QM_INLINE size_t qm_committed(unsigned c) {
  return atomic_load_explicit(&qm__committed[c], memory_order_relaxed);
}
extern QM_HIDDEN uintptr_t qm__pbase;
extern QM_HIDDEN size_t qm__pspan; /* 0 until init: every pointer then looks large */
extern QM_HIDDEN unsigned qm__rshift;
extern QM_HIDDEN uintptr_t qm__rmask; /* (1 << qm__rshift) - 1: a byte's offset in its region */
/* Guard pages inside class regions: the last page of every aligned span of
 * qm__gmask + 1 bytes of a region is inaccessible (0: no guards). A chunk
 * slot that would overlap it (its canary's 8 spare bytes included) is dead:
 * never carved, never a valid chunk. Chunk positions stay multiples of the
 * class size, so the index arithmetic is unchanged. */
extern QM_HIDDEN uintptr_t qm__gmask;
QM_INLINE bool qm_slot_dead(uintptr_t roff, size_t size) {
  return qm__gmask && roff + size > (roff | qm__gmask) + 1 - qm__page;
}
/* Whether byte roff of a region is on one of its guard pages. */
QM_INLINE bool qm_on_guard(uintptr_t roff) {
  return qm__gmask && (roff & qm__gmask) >= qm__gmask + 1 - qm__page;
}

/* Class of a chunk of s bytes (s <= QM_CHUNK_MAX): 16-byte steps to 256,
 * then four classes per doubling. */
QM_INLINE unsigned qm_class_of_chunk(size_t s) {
  if (s <= 256)
    return s ? (unsigned)((s + 15) >> 4) - 1 : 0;
  unsigned l = 63u - (unsigned)__builtin_clzll((unsigned long long)(s - 1));
  return 16 + (l - 8) * 4 + (unsigned)(((s - 1) >> (l - 2)) - 4);
}
/* Class of a request of n user bytes (n <= QM_SMALL_MAX): its chunk holds
 * the canary too; 0 bytes share class 0 here. */
QM_INLINE unsigned qm_class_of_calc(size_t n) { return qm_class_of_chunk(n + QM_CANARY); }

/* The same from a table for the common sizes (filled by primary init),
 * except that 0 maps to QM_ZCLASS, whose thread-cache bin stays empty: the
 * malloc fast path then leaves malloc(0) to the slow path at no cost. One
 * entry per 8 bytes: with the canary's 8 added, the requests of one entry
 * (8i - 7 .. 8i) never straddle a class boundary (classes are multiples of
 * 16). */
#define QM_CLASS_TAB_MAX 4096
extern QM_HIDDEN uint8_t qm__class_tab[QM_CLASS_TAB_MAX / 8 + 1];
QM_INLINE unsigned qm_class_of(size_t n) {
  if (QM_LIKELY(n <= QM_CLASS_TAB_MAX))
    return qm__class_tab[(n + 7) >> 3];
  return qm_class_of_calc(n);
}

QM_INLINE uintptr_t qm_region(unsigned c) { return qm__pbase + ((uintptr_t)c << qm__rshift); }

/* Start of the chunk holding byte `roff` of region c. */
QM_INLINE uintptr_t qm_chunk_index(uintptr_t roff, unsigned c) {
  return (uintptr_t)(((unsigned __int128)roff * qm__class[c].magic) >> 64);
}

/* Thread groups of the central lists: a thread's cache joins the one with
 * the fewest live caches. */
#define QM_GROUPS 4u
/* Another group takes a group's chunks of a class before carving only
 * while that group holds more than this many bytes of them (see
 * qm__central_take): what a group leaves idle per class stays below it.
 * 32 KiB: at 128 KiB, threads that hand their blocks to successors left up
 * to 6.5 MB idle per group (hand-off bench, 2 chains: peak RSS 23.4 MB at
 * 128 KiB, 22.0 at 64, 21.1 at 32; jemalloc 19.3); small churn with 2
 * threads was no slower (7 interleaved runs, within noise). */
#define QM_STEAL_MIN ((size_t)32 << 10)

/* secret: the per-process secret the region keys are derived from */
int qm__primary_init(uint64_t secret);
/* Moves up to want free chunks of class c into out (chunk addresses): from
 * group's set (from a random one of its lowest up), then from other groups' that hold more than
 * QM_STEAL_MIN, then carved fresh, then (when no more can be carved) from any group's; each checked
 * (in its region, on a chunk boundary, carved, its table entry not ALLOC), as chunk | generation <<
 * 48 (see entry.h). 0 when every set is empty and nothing more can be carved or committed.
 * ticks: the take serves one malloc of a thread without a cache, which ages the class's limbo
 * (qm__central_hold). */
unsigned qm__central_take(unsigned c, unsigned group, uintptr_t *out, unsigned want, bool ticks);
#ifdef QM_TEST_HOOKS
/* Test hook: chunks of class c in group's set. */
size_t qm__central_group_free(unsigned c, unsigned group);
#endif
/* Bytes of free chunks in each group's sets, all classes (each class read
 * under its lock, the sums not at one instant: for the choice of a new
 * thread cache's group). */
void qm__central_group_bytes(size_t bytes[QM_GROUPS]);
/* Gives n free chunks back to the central list of class c, as group's. */
void qm__central_give(unsigned c, unsigned group, const uintptr_t *in, unsigned n);
/* Delayed free (free_delay = D > 0): the most bytes of chunks one class's
 * delay queue holds (a thread's ring, the central limbo); past it the
 * oldest leaves early. */
#define QM_DELAY_BYTES ((size_t)16 << 20)
/* A free chunk (slot s) that has waited `age` of its D mallocs where no
 * thread's ring can age it any more (an exiting thread's ring, a closed
 * id's frees, a thread without a cache): held in class c's limbo, until a
 * thread with a cache adopts it into its ring or D takes of threads without
 * one (ticks) have passed since its free. Without a delay, given at once. */
void qm__central_hold(unsigned c, unsigned group, uintptr_t s, uint32_t age);
/* Moves up to room of class c's limbo chunks out, oldest first, each with
 * the age it has (at most D); returns how many: the caller's ring ages them
 * on. */
unsigned qm__central_adopt(unsigned c, uintptr_t *items, uint32_t *ages, unsigned room);
/* Chunks that left the limbo before their time: a class's limbo was full
 * (early), or the limbo of all classes held free_delay_kb (over). */
size_t qm__central_limbo_early(void);
size_t qm__central_limbo_over(void);
#ifdef QM_TEST_HOOKS
/* Test hook: bytes of the chunks in every class's limbo. */
size_t qm__central_limbo_bytes(void);
#endif
/* Returns fully free pages of every class to the kernel now. */
size_t qm__primary_purge_all(void);
#ifdef QM_TEST_HOOKS
/* Test hook: guard pages made inside class regions, and refused (the page
 * stayed RW); markers: they are guard markers, not PROT_NONE mappings. */
void qm__primary_guards(size_t *made, size_t *missed, bool *markers);
#endif

#ifdef QM_TEST_HOOKS
/* The committed part of each class's state table, as [lo, hi) pairs (for
 * the tests' maps check); returns how many. */
size_t qm__primary_tables(uintptr_t (*out)[2], size_t cap);
#endif

/* carved: bytes of the chunks carved, dead slots left out */
typedef struct qm_primary_stats {
  size_t reserved, committed, carved, central_free, purged_bytes, purges;
} qm_primary_stats_t;
void qm__primary_stats(qm_primary_stats_t *s);

void qm__primary_lock_all(void);
void qm__primary_unlock_all(void);
/* In a fork child: fresh class locks (first: the other fork handlers give
 * chunks back); then, once every free in flight is applied, every central
 * chunk given to group's, each with the fresh generation regen gives it
 * (qm__small_regen: the state's owner picks it, the primary only holds the
 * chunks). */
typedef uintptr_t (*qm_regen_fn)(uintptr_t chunk, unsigned c);
void qm__primary_fork_locks(void);
void qm__primary_fork_child(unsigned group, qm_regen_fn regen);

#endif
