/* describe.h: the one description of an address (describe.c), and the
 * reports on a pointer passed in that need more than the part that found
 * it knows: what any part says of the address, a large chunk's kept stacks.
 */
#ifndef QM_DESCRIBE_H
#define QM_DESCRIBE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "place.h"
#include "report.h"

/* Describes address a (pl->words appended to, from empty): whether it lies
 * in memory qmalloc manages, and what is there. Lock-free and
 * allocation-free (called from the SIGSEGV handler); racy reads of the
 * records at worst describe them a moment old. */
bool qm__describe(uintptr_t a, qm_place_t *pl);

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
