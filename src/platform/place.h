/* place.h: what lies at an address, as the parts of qmalloc that own
 * memory describe it (describe.c asks each in turn) and as the reports read
 * it: the kind of access, the kind of chunk, the place, and the stacks kept
 * with a large chunk. Types only, below the reports and the parts they ask.
 */
#ifndef QM_PLACE_H
#define QM_PLACE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fmt.h"

/* What an access at an address hit, as the one description of addresses
 * (qm__describe) gives it: the SIGSEGV report's kind and qm_describe()'s
 * first words. QM_ACC_LIVE is no error of qmalloc's: inside a live chunk
 * (a fault there is the program's own protection). */
typedef enum qm_access {
  QM_ACC_UAF,
  QM_ACC_OVERFLOW,
  QM_ACC_UNDERFLOW,
  QM_ACC_GUARD, /* a guard between runs of small chunks: either way */
  QM_ACC_WILD,
  QM_ACC_LIVE,
} qm_access_t;

/* The kinds of chunk, as reports name them ("<kind> chunk"). */
typedef enum qm_chunk_kind {
  QM_CK_SMALL,
  QM_CK_SAMPLED, /* a small chunk in a guarded slot of its own */
  QM_CK_LARGE,
  QM_CK_ZERO,
  QM_CK_BOOT, /* the start-up arena's */
} qm_chunk_kind_t;

/* What lies at an address: filled by qm__describe() (describe.c) from the
 * part of qmalloc that owns it, and read by the SIGSEGV report, the reports
 * of bad pointers and qm_describe(). Decisions are taken on these fields,
 * never on the words. */
typedef struct qm_place {
  qm_access_t access; /* what an access there hits */
  bool chunk;         /* in or by a chunk: kind, user and size hold */
  bool plain;         /* memory qmalloc never protects: a fault there is
                       * none of its guards */
  qm_chunk_kind_t kind;
  uintptr_t user; /* the chunk's user pointer */
  size_t size;    /* its requested bytes */
  qm_buf_t words; /* "offset 8 in freed small chunk of 24 bytes ..." */
} qm_place_t;

/* An empty place: a wild address, no chunk, no words; what each part's
 * describer fills in. */
static inline qm_place_t *qm_place_empty(qm_place_t *pl) {
  pl->access = QM_ACC_WILD;
  pl->chunk = pl->plain = false;
  pl->kind = QM_CK_SMALL;
  pl->user = 0;
  pl->size = 0;
  pl->words.n = 0;
  return pl;
}

/* The stacks kept with a large chunk (qm__large_kept, large_report.c):
 * who allocated it and, once freed, who freed it and how long ago. The
 * frames point into the record's stack entry (never moved), read racily
 * (counts clamped), as the report that prints them runs. */
typedef struct qm_kept {
  bool freed;
  uint32_t alloc_tid, free_tid;
  uint64_t frees_ago, ms_ago; /* large frees, and ms, since its free */
  const uintptr_t *alloc_pc, *free_pc;
  unsigned nalloc, nfree;
} qm_kept_t;

#endif
