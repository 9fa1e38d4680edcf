/* describe.h: the one description of an address (describe.c): each part of
 * qmalloc that owns memory registers how it describes an address of its
 * own (and the large side how it finds a chunk's kept stacks), and
 * the reports on a pointer passed in that need more than the part that
 * found it knows. Below every part it asks: it calls none of them by name.
 */
#ifndef QM_DESCRIBE_H
#define QM_DESCRIBE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "place.h"
#include "report.h"

/* A part's describer: whether a is its own, then pl filled (pl->words
 * appended to). Lock-free and allocation-free (the SIGSEGV handler calls
 * it). */
typedef bool (*qm_describe_fn)(uintptr_t a, qm_place_t *pl);
/* The kept stacks of the large chunk at a, in k: NULL where none is. */
typedef const qm_kept_t *(*qm_kept_fn)(uintptr_t a, qm_kept_t *k);

#define QM_DESCRIBERS 8
/* The registered describers, asked in turn (the first that owns an
 * address describes it), and the kept-stacks finder: one table, written
 * where the parts are wired together (sealed.c) and sealed with the rest,
 * so that the SIGSEGV handler follows no pointer a write primitive could
 * have changed. */
typedef struct qm_describers {
  qm_describe_fn fn[QM_DESCRIBERS];
  unsigned n;
  qm_kept_fn kept;
} qm_describers_t;
extern QM_HIDDEN qm_describers_t qm__describers;

/* Describes address a (pl->words appended to, from empty): whether it lies
 * in memory qmalloc manages, and what is there. Lock-free and
 * allocation-free (called from the SIGSEGV handler); racy reads of the
 * records at worst describe them a moment old. */
bool qm__describe(uintptr_t a, qm_place_t *pl);
/* The kept stacks of a large chunk at a (NULL elsewhere, and before init). */
const qm_kept_t *qm__describe_kept(uintptr_t a, qm_kept_t *k);
/* A pointer passed to op that is no live chunk's user pointer, described
 * by qm__describe() (qm__report_pointer), with the kept stacks of a large
 * chunk there. For the large side, where every pointer no other part owns
 * ends up: the other parts report their own with their own description. */
_Noreturn void qm__report_bad_pointer(qm_op_t op, const void *p) QM_COLD;
/* A freed chunk's user pointer passed to op, reported with its kept stacks
 * (a large chunk's) as qm__report_pointer() reports it. */
_Noreturn void qm__report_freed(qm_op_t op, const void *p, qm_chunk_kind_t kind,
                                size_t size) QM_COLD;

#endif
