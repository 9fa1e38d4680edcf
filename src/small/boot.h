/* boot.h: the start-up arena (boot.c): the requests made while init reads
 * the options, served from a mapping of its own and never reused.
 */
#ifndef QM_BOOT_H
#define QM_BOOT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "place.h"
#include "report.h"

/* Its base, 0 until its first chunk; sealed after init (sealed.c). */
extern __attribute__((visibility("hidden"))) uintptr_t qm__boot_base;
void *qm__boot_alloc(size_t n);
/* Whether p is in the arena; then size and free take only a live chunk's
 * start and report anything else as `op` (free: invalid or double free). */
bool qm__boot_owns(const void *p);
/* Whether a is on one of the arena's guard pages (for the SIGSEGV report). */
bool qm__boot_on_guard(uintptr_t a);
/* The same as a describer (describe.h), asked before the heaps'. */
bool qm__boot_describe_guard(uintptr_t a, qm_place_t *pl);
size_t qm__boot_size(const void *p, qm_op_t op);
/* qm_describe()'s words for an address in the start-up arena. */
bool qm__boot_describe(uintptr_t a, qm_place_t *pl);
void qm__boot_free(void *p);

#endif
