/* large_record.h: the records of large chunks (large_record.c), asked by
 * the secondary, the quarantine and the reports: a record by index, by
 * user pointer (the hash) or by address (the index), the stacks kept with
 * it, the dead records kept for reports, the mappings counted, the clock
 * of large frees. Calls into it run under S.lock, but qm__rec_find's and
 * the stack table's readers in the SIGSEGV handler.
 */
#ifndef QM_LARGE_RECORD_H
#define QM_LARGE_RECORD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "large.h"

/* A stack captured on the way in, before any lock (unwinding takes none of
 * qmalloc's, but may take the loader's). */
typedef struct trace {
  uintptr_t pc[QM_STACK_MAX];
  unsigned n;
  uint32_t tid;
} trace_t;

/* One record's stack entry: who allocated and freed its chunk, and when it
 * was freed; its frames follow (qm__stk_pcs). */
typedef struct stk {
  uint64_t free_seq, free_ms; /* large frees counted, and the clock, when freed */
  uint32_t alloc_tid, free_tid;
  uint8_t nalloc, nfree;
} stk_t;

bool qm__blk_reserve(void);
/* A record, all zero (NIL where none can be had): the caller writes its
 * map and chunk parts. qm__rec_free zeroes one again (out of the address
 * index first). */
uint32_t qm__rec_alloc(void);
void qm__rec_free(uint32_t i);
uint32_t qm__tab_find(uintptr_t k);
bool qm__tab_reserve(void);
void qm__tab_insert(uintptr_t k, uint32_t idx);
/* Makes a record whose mapping is set known: by its user pointer (the hash)
 * and by address (the index qm__rec_find reads); its span counts as
 * address space held. */
void qm__rec_publish(uint32_t i);
/* The record whose mapping (guards included) holds a, or NIL. Lock-free
 * and allocation-free (the SIGSEGV handler's): records never move, links
 * are read racily, and a walk is bounded. */
uint32_t qm__rec_find(uintptr_t a);
/* Moves a chunk's entry to its new user pointer (a reuse with another lead). */
void qm__tab_rekey(uintptr_t from, uintptr_t to, uint32_t idx);
/* Counts the mappings chunk b is now, live or quarantined (the
 * strategy's, and its extra ones); returns the records' total. */
size_t qm__set_vmas(block_t *b, bool live);
/* Its mappings and address space are no longer counted (it was buried, or
 * is about to be unmapped); qm__forget also takes its user pointer out of
 * the hash. */
void qm__rec_unmapped(uint32_t i);
void qm__forget(uint32_t i);
/* The mappings the records' chunks are (qm__set_vmas's estimate), the peak
 * of it, and the address space they hold. */
void qm__rec_stats(size_t *maps, size_t *maps_peak, size_t *mapped_bytes);
void qm__unmap_forgotten(uint32_t i);
/* Keeps a dead record for reports; the oldest goes past DEAD_MAX. Returns
 * true once, when enough chunks died that the program churns large chunks
 * and the ring's storage was made ready in one go (unless the record table
 * could not grow): the caller does the same for the belt
 * (qm__belt_prefill). */
bool qm__dead_push(uint32_t i);
/* Forgets the dead records whose range is in [lo, hi): the belt is about to
 * carve it again. */
void qm__dead_evict(uintptr_t lo, uintptr_t hi);
void qm__note_alloc(uint32_t i, const trace_t *t);
/* Counts a large free of chunk i on the clocks (frees, their bytes) and
 * records t as its freeing stack; returns the frees counted, this one
 * included. */
uint64_t qm__note_free(uint32_t i, const trace_t *t);
/* What the records count that the others read, without a call: written
 * only in large_record.c, under S.lock (reports read frees without it). */
typedef struct rec_counts {
  size_t maps;                 /* mappings the records' chunks are (qm__set_vmas) */
  uint64_t frees, freed_bytes; /* the clock: large frees counted, and their bytes */
  /* records made so far, the high water (free ones included): an index
   * below it holds a record that was made, in the committed part of the
   * table. It only grows; written with __atomic stores, as the SIGSEGV
   * handler's walk of the address index reads it without the lock. */
  size_t made;
} rec_counts_t;
extern QM_HIDDEN const rec_counts_t *const qm__rec_counts;
static inline size_t qm__rec_made(void) {
  return __atomic_load_n(&qm__rec_counts->made, __ATOMIC_RELAXED);
}

/* A record by index; an index no record was made at (a corrupted count,
 * link or ring entry) is caught here, before it is used. Checked against
 * the records made, not only the table's sealed size (which still bounds
 * it where the count itself is corrupted): past them lie records never
 * made, all zero (a walk of the FIFO or a bin takes one for a chunk no
 * longer there and goes on, the chunk whose link it replaced lost without
 * a word) and, past the committed part, PROT_NONE pages (a read faults: a
 * crash, not a report). A thread holding an index got it under the lock,
 * after the record was made, so it reads a count past it. */
static inline block_t *B(uint32_t i) {
  QM_CHECK_OP(i, <, LF.blk_max);
  QM_CHECK_OP(i, <, qm__rec_made());
  return &LF.blk[i];
}
static inline size_t qm__rec_maps(void) { return qm__rec_counts->maps; }
static inline uint64_t qm__rec_frees(void) { return qm__rec_counts->frees; }
/* The clock: the large frees counted; their bytes in *freed_bytes. */
static inline uint64_t qm__rec_clock(uint64_t *freed_bytes) {
  *freed_bytes = qm__rec_counts->freed_bytes;
  return qm__rec_counts->frees;
}
stk_t *qm__stk_at(uint32_t i);
uintptr_t *qm__stk_pcs(stk_t *e);

#ifdef QM_TEST_HOOKS
/* Test hook: the record table's, the hash table's and the stack table's
 * mappings, as [lo, hi) pairs, for the tests that check no chunk overlaps
 * them. */
size_t qm__large_metadata(uintptr_t (*out)[2], size_t cap);
/* The record table's mapping [lo, hi) (its records, then the FIFO's ring;
 * guard pages either side) and its records: 0 before it is reserved. */
size_t qm__large_table(uintptr_t *lo, uintptr_t *hi);
/* The records made so far and those committed (RW). */
void qm__large_records(size_t *made, size_t *committed);
#endif

#endif
