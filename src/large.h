/* large.h: what the files of the secondary share: the record of a large
 * chunk (block_t), the hash slot, the lock and the ready flag (S), the
 * page classes. Each file keeps its own state private; its interface is
 * its header (large_record.h, quarantine.h, belt.h). Only the files of the
 * secondary include it; the rest of qmalloc sees secondary.h. Invariants
 * are stated where each part is owned.
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
#include "ro.h"
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
/* F_FREED: the chunk left the user (freed, or the old range of a realloc
 * move) and has not been handed out since; a BUSY chunk with it is being
 * retired or dropped, one without it is being resized or revived. */
/* F_SPLIT: the RW pages may be several VMAs. A realloc move puts the old
 * pages in front of pages of the new mapping, and the two never merge (their
 * vm_pgoff differ), so a chunk that came from a move keeps two or more; and
 * the old chunk's range, the moved pages' place a VMA apart from the rest. */
/* F_COLD: in a cold bin (no page resident), while F_INBIN. */
/* F_HUGE: a fresh THP mapping, its capacity whole huge pages from a
 * huge-page boundary; any request it serves is opened in whole huge pages
 * (see extent() in secondary.c). Not set on a realloc move's chunk. */
/* F_BELT: its range was carved from the belt (belt.c): never unmapped,
 * given back to the belt once dead; its pages are reused by moving them to
 * a range carved afresh, never at this address. */
enum {
  F_NOREUSE = 1,
  F_INBIN = 2,
  F_FREED = 4,
  F_SPLIT = 8,
  F_COLD = 16,
  F_HUGE = 32,
  F_BELT = 64,
  F_INDEXED = 128 /* in the address index (qm__rec_publish until qm__rec_free) */
};

typedef struct block {
  uintptr_t base, usable; /* the mapping, and its first usable page */
  size_t span, size;      /* mapping bytes (guards included); requested bytes */
  size_t cap, rw, dirty;  /* pages from usable: capacity, RW now, possibly non-zero */
  /* pages from usable to the user pointer: 0, but for a THP chunk that
   * ends flush against its whole-huge-page RW part (see secondary.c) */
  size_t lead;
  uint64_t seq, mark; /* large frees / bytes freed when it was quarantined */
  uint64_t odo;       /* the belt's odometer when it was freed */
  /* the quarantine's: its place in the FIFO (a position of LF.qring)
   * while it is in it; its bin's list (free records: the free list) */
  uint32_t qpos, bprev, bnext;
  uint32_t anext;                     /* the next record of its address index bucket */
  uint8_t state, flags, vmas, bclass; /* bclass: its bin while F_INBIN */
  /* log2 of the alignment a live chunk was requested with (aligned_alloc
   * and the like), 0 for malloc's and after a realloc: what
   * free_aligned_sized checks */
  uint8_t ashift;
  uint8_t pool; /* P_* below: where a freed belt chunk's pages wait */
  /* mappings its resident pages may be, past the first: the pieces a
   * gathered chunk was assembled from (qm__q_gather), and a part opened
   * past pages moved in. An upper bound for the mapping count: taking a
   * pooled chunk's tail leaves its count as it was. */
  uint8_t extra_vmas;
  uint16_t dpos; /* B_DEAD: its place in the ring of dead records (large_record.c) */
} block_t;

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
/* What is fixed once the secondary is ready, sealed (ro.h). */
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

/* A record by index: an index past the reserved table (a corrupted count
 * or link) is caught here, before it is used. */
static inline block_t *B(uint32_t i) {
  QM_CHECK_OP(i, <, LF.blk_max);
  return &LF.blk[i];
}

/* The RW pages that a request of `need` pages aligned to `align` takes in
 * chunk b: whole huge pages in a THP chunk (opening part of one would split
 * its PMD for good), but exact ones for over-aligned requests, as extent()
 * in secondary.c gives them (a lead would break their alignment). */
static inline size_t qm_need_in(const block_t *b, size_t need, size_t align) {
  size_t hp = LF.thp_size >> qm__page_shift;
  if (!(b->flags & F_HUGE) || !hp || align > qm__page)
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
  return b->dirty > b->rw ? b->dirty - b->rw : 0;
}

/* A chunk's user pointer: the key of the hash, where reports count from. */
static inline uintptr_t user_of(const block_t *b) {
  return b->usable + (b->lead << qm__page_shift);
}

#endif
