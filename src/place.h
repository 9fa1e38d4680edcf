/* place.h: what lies at an address, as the parts of qmalloc that own
 * memory describe it (qm__describe, describe.c, asks each in turn) and as
 * the reports read it: the kind of access, the kind of chunk, the place.
 * Types only, below the reports (report.c) and the parts they ask.
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

/* Describes address a (pl->words appended to, from empty): whether it lies
 * in memory qmalloc manages, and what is there. Lock-free and
 * allocation-free (called from the SIGSEGV handler); racy reads of the
 * records at worst describe them a moment old. */
bool qm__describe(uintptr_t a, qm_place_t *pl);

#endif
