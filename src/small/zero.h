/* zero.h: the pointers malloc(0) returns. Each is a distinct address in the
 * zero-size region (QM_ZCLASS), which is never made accessible: any read or
 * write through one faults, and free() of one is checked like any other.
 */
#ifndef QM_ZERO_H
#define QM_ZERO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fmt.h"
#include "qm.h"
#include "report.h"

/* A fresh zero-size pointer, unique among the live ones; NULL + ENOMEM when
 * the region's slots or the bitmap's memory run out. */
void *qm__zero_alloc(void);
/* Frees a live zero-size pointer; reports (as op) anything else. */
void qm__zero_free(void *p, qm_op_t op);
/* 0 if p is a live zero-size pointer; reports (as op) otherwise. */
size_t qm__zero_check(qm_op_t op, void *p);
/* For the SIGSEGV report: what an access at a in the region hit. */
bool qm__zero_describe(uintptr_t a, qm_place_t *pl);
#ifdef QM_TEST_HOOKS
/* Test hook: the region's slots are capped at slots (SIZE_MAX: none; never
 * below those the bump handed out); returns those. */
size_t qm__zero_cap(size_t slots);
#endif
void qm__zero_fork_prepare(void);
void qm__zero_fork_parent(void);
void qm__zero_fork_child(void);

#endif
