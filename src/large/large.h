/* large.h: what the files of the secondary share: the record of a large
 * chunk (block_t), the hash slot, the lock and the ready flag (S), the
 * page classes. Each file keeps its own state private; its interface is
 * its header (large_record.h, quarantine.h, belt.h). Only the files of the
 * secondary include it; the rest of qmalloc sees secondary.h. The record
 * is in parts, each written by one owner: map and chunk by the secondary
 * (secondary.c, large_alloc.c, large_free.c, large_realloc.c), q by the
 * quarantine, rec by large_record.c (the few exceptions are stated
 * at block_t); any of them reads all. Invariants are stated where each
 * part is owned.
 */
#ifndef QM_LARGE_H
#define QM_LARGE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "age.h"
#include "lock.h"
#include "qm.h"
#include "random.h"
#include "seal.h"
#include "stack.h"

#define NIL UINT32_MAX
#define NBINS 160
#define MAX_RECORDS ((size_t)1 << 20) /* the most chunks the mapping cap allows, and more */
#define SCAN 32          /* chunks a request looks at: bounds the time under the lock */
#define DEMAND_HALF 4096 /* requests after which the demand counts are halved */

/* B_DEAD: freed, its pages gone (moved to another chunk or dropped), its
 * range in the belt's care: the record is kept only for reports and for
 * telling a double free from an invalid one, in a bounded ring
 * (qm__dead_push). */
enum { B_UNUSED, B_LIVE, B_QUAR, B_BUSY, B_DEAD };
_Static_assert(B_UNUSED == 0, "a zeroed record is unused");
/* The chunk's flags (chunk.flags, the secondary's).
 * F_FREED: the chunk left the user (freed, or the old range of a realloc
 * move) and has not been handed out since; a BUSY chunk with it is being
 * retired or dropped, one without it is being resized or revived. */
/* F_SPLIT: the RW pages may be several VMAs. A realloc move puts the old
 * pages in front of pages of the new mapping, and the two never merge (their
 * vm_pgoff differ), so a chunk that came from a move keeps two or more; and
 * the old chunk's range, the moved pages' place a VMA apart from the rest. */
/* F_HUGE: a fresh THP mapping, its capacity whole huge pages from a
 * huge-page boundary; any request it serves is opened in whole huge pages
 * (see extent() in large_alloc.c). Not set on a realloc move's chunk. */
/* F_BELT: its range was carved from the belt (belt.c): never unmapped,
 * given back to the belt once dead; its pages are reused by moving them to
 * a range carved afresh, never at this address. */
enum { F_NOREUSE = 1, F_FREED = 2, F_SPLIT = 4, F_HUGE = 8, F_BELT = 16 };

/* The record of a large chunk, in four parts, each written by one file:
 *  map    the secondary: the mapping and its page counts. But dirty: the
 *         quarantine lowers it by the pages it takes out of a pooled chunk
 *         for a gathering, and raises it again if they go back
 *         (qm__q_gather, qm__q_ungather): the pages leave its count and
 *         the chunk's in one step, while the chunk is QUAR, in its care.
 *  chunk  the secondary: what the chunk is and where it stands: its state
 *         (only the secondary changes it), its kind, the request it serves,
 *         and when it was freed.
 *  q      quarantine.c: its place in the FIFO and in a bin, and the bytes
 *         freed when it entered. large_record.c links free records through
 *         q.next (a free record is in no bin) and clears it as it hands
 *         one out: a link of its own would grow the record to 128 bytes,
 *         and rec.anext must stay 0 in a free record.
 *  rec    large_record.c: its links in the records' own structures (the
 *         address index, the ring of dead records) and the mappings it is
 *         counted as.
 * large_record.c zeroes every part of a record it frees (a zeroed record
 * is B_UNUSED, in no list, and ends a racy walk of the address index), so
 * a record is handed out all zero. All of it is written under S.lock, or
 * by the one thread that marked the chunk BUSY (map, chunk); the SIGSEGV
 * handler reads it without the lock. Each part holds its owner's small
 * fields at its end; pool and extra_vmas, facts of the mapping, are in
 * chunk, where padding had room for them (in map they cost 8 bytes). */
typedef struct blk_map {
  uintptr_t base, usable; /* the mapping, and its first usable page */
  size_t span;            /* mapping bytes (guards included) */
  size_t cap, rw, dirty;  /* pages from usable: capacity, RW now, possibly non-zero */
  /* pages from usable to the user pointer: 0, but for a THP chunk that
   * ends flush against its whole-huge-page RW part (see large_alloc.c) */
  size_t lead;
} blk_map_t;

typedef struct blk_chunk {
  size_t size;  /* requested bytes */
  uint64_t odo; /* the belt's odometer when it was freed */
  /* the large frees counted when it was freed, and again when it entered
   * the quarantine (enter_locked): the window of the quarantine (with
   * q.mark) and of the belt counts from there */
  uint64_t seq;
  uint8_t state, flags; /* B_*, F_* above */
  /* log2 of the alignment a live chunk was requested with (aligned_alloc
   * and the like), 0 for malloc's and after a realloc: what
   * free_aligned_sized checks */
  uint8_t ashift;
  uint8_t pool; /* P_* below: where a freed belt chunk's pages wait */
  /* mappings its resident pages may be, past the first (with F_SPLIT):
   * the pieces a gathered chunk was assembled from (qm__q_gather), and a
   * part opened past pages moved in. An upper bound for the mapping
   * count: taking a pooled chunk's tail leaves its count as it was. */
  uint8_t extra_vmas;
} blk_chunk_t;

typedef struct blk_q {
  uint64_t mark; /* the bytes of large frees counted when it entered */
  /* its place in the FIFO (a position of LF.qring) while it is in it; its
   * bin's list, read only while inbin (free records: the free list,
   * through next) */
  uint32_t pos, prev, next;
  uint8_t bin; /* its page class, while inbin */
  bool inbin;
  bool cold; /* in a cold bin (no page resident), while inbin */
} blk_q_t;

typedef struct blk_rec {
  uint32_t anext; /* the next record of its address index list, + 1 (0 ends it) */
  uint16_t dpos;  /* B_DEAD: its place in the ring of dead records */
  uint8_t vmas;   /* the mappings it is counted as (qm__set_vmas) */
  bool indexed;   /* in the address index (qm__rec_publish until qm__rec_free) */
} blk_rec_t;

typedef struct block {
  blk_map_t map;
  blk_chunk_t chunk;
  blk_q_t q;
  blk_rec_t rec;
} block_t;

/* Records are reserved by the million (MAX_RECORDS) and committed and
 * faulted in as they are used: the record must not grow (120 bytes on
 * 64-bit). */
_Static_assert(sizeof(block_t) <= 120, "the record of a large chunk grew");

/* P_POOLED: a QUAR (or BUSY, freed) belt chunk whose pages were moved away
 * at free (belt_way=move): they wait RW at qm__belt_shadow(usable), dirty
 * pages of them, out of the program's reach. P_CLEAN: its own range was
 * mapped afresh PROT_NONE then (it merged back into the belt); else it was
 * made PROT_NONE by mprotect and must be mapped afresh when it dies. */
enum { P_POOLED = 1, P_CLEAN = 2 };

typedef struct slot {
  uintptr_t key; /* a chunk's user pointer (user_of); 0 = empty */
  uint32_t idx;
} slot_t;

#define STK_SEG ((size_t)1 << 13) /* 2.25 MiB of stack entries at 16 frames */
#define DEAD_MAX 4096             /* dead records kept for reports */
#define ABUCKETS 4096             /* address index: buckets of 16 MiB granules */
#define AGRAN_SHIFT 24
#define ABIG ((size_t)64 << 20) /* records spanning more are on one list */

/* What the files of the secondary share of their state: the lock and
 * whether they are set up. The lock is a leaf (the belt's, its own, is
 * taken inside it, nothing else) and guards the state each file keeps
 * private: the records (large_record.c), the quarantine (quarantine.c)
 * and the secondary's counts (secondary.c); the SIGSEGV handler reads
 * records and the address index without it. ready: set once by the
 * secondary's set-up, LF sealed then. Defined in large_record.c. */
typedef struct qm_large {
  qm_lock_t lock;
  atomic_int ready;
} qm_large_t;

extern QM_HIDDEN qm_large_t qm__large;
#define S qm__large
/* What is fixed once the secondary is ready, sealed (seal.h). */
#define LF (*qm__lfix)

/* Page classes, four per doubling: bins of quarantined chunks by capacity,
 * and the capacity a fresh chunk is given, so that a chunk freed by one
 * request fits later ones of nearby sizes. Rounding up costs address space
 * only: pages past the request stay PROT_NONE and are never touched. */
static inline unsigned pclass(size_t n) {
  if (n <= 4)
    return n ? (unsigned)n - 1 : 0;
  unsigned l = 63u - (unsigned)__builtin_clzll((unsigned long long)(n - 1));
  unsigned c = 4 + (l - 2) * 4 + (unsigned)(((n - 1) >> (l - 2)) - 4);
  return c < NBINS ? c : NBINS - 1;
}
static inline size_t pclass_pages(unsigned c) {
  if (c < 4)
    return c + 1;
  unsigned k = c - 4, l = 2 + k / 4;
  return ((size_t)1 << l) + ((size_t)(k % 4 + 1) << (l - 2));
}

/* The RW pages that a request of `need` pages aligned to `align` takes in
 * chunk b: whole huge pages in a THP chunk (opening part of one would split
 * its PMD for good), but exact ones for over-aligned requests, as extent()
 * in large_alloc.c gives them (a lead would break their alignment). */
static inline size_t qm_need_in(const block_t *b, size_t need, size_t align) {
  size_t hp = LF.thp_size >> qm__page_shift;
  if (!(b->chunk.flags & F_HUGE) || !hp || align > qm__page)
    return need;
  return (need + hp - 1) / hp * hp;
}

/* Resident pages a live chunk holds past its RW part: left by an earlier,
 * larger use or by a shrink, inaccessible, and kept like quarantined pages
 * (the quarantine sums them over live chunks: qm__q_tail_add). A lead is
 * not among them: it is the chunk's own slack, RW like the rest of its
 * extent, as a size class's rounding is in other allocators. Counting leads against quarantine_mb
 * left the quarantine no room beside many live chunks of just over 2 MiB
 * (each holding nearly a huge page of lead), and every free then dropped. */
static inline size_t tail_pages(const block_t *b) {
  return b->map.dirty > b->map.rw ? b->map.dirty - b->map.rw : 0;
}

/* A chunk's user pointer: the key of the hash, where reports count from. */
static inline uintptr_t user_of(const block_t *b) {
  return b->map.usable + (b->map.lead << qm__page_shift);
}

#endif
