/* describe.c: the one description of an address (qm__describe), read by the
 * SIGSEGV report, the reports of bad pointers and qm_describe(): which part
 * of qmalloc owns it, asked in turn, fills a qm_place_t. Lock-free and
 * allocation-free, as the SIGSEGV handler needs. Also the reports on a
 * pointer that need it, or a large chunk's kept stacks: above every part it
 * asks, it hands report.c what to print.
 */
#include "describe.h"

#include "boot.h"
#include "guarded.h"
#include "large_report.h"
#include "place.h"
#include "primary.h"
#include "report.h"
#include "smallstate.h"

bool qm__describe(uintptr_t a, qm_place_t *pl) {
  qm_place_empty(pl);
  if (qm__large_describe(a, pl) || qm__guarded_describe(a, pl))
    return true;
  qm_buf_t *d = &pl->words;
  if (qm__boot_on_guard(a)) {
    pl->access = QM_ACC_GUARD;
    qm_buf_str(d, "guard page of qmalloc's start-up arena");
    return true;
  }
  if (a < qm__pbase && qm__pbase - a <= qm__page && qm__pspan) {
    qm_buf_str(d, "guard page below the small-chunk heap");
    return true;
  }
  return qm__small_describe(a, pl) || qm__boot_describe(a, pl);
}

/* The kept stacks at p, where a large chunk is: NULL elsewhere. */
static const qm_kept_t *kept_at(const void *p, bool large, qm_kept_t *k) {
  return large ? qm__large_kept((uintptr_t)p, k) : NULL;
}

_Noreturn void qm__report_bad_pointer(qm_op_t op, const void *p) {
  qm_place_t pl;
  qm_kept_t k;
  if (!qm__describe((uintptr_t)p, &pl))
    qm__report_pointer(op, p, NULL, NULL);
  qm__report_pointer(op, p, &pl, kept_at(p, pl.chunk && pl.kind == QM_CK_LARGE, &k));
}

_Noreturn void qm__report_freed(qm_op_t op, const void *p, qm_chunk_kind_t kind, size_t size) {
  qm_place_t pl;
  qm_place_empty(&pl);
  pl.access = QM_ACC_UAF;
  pl.chunk = true;
  pl.kind = kind;
  pl.user = (uintptr_t)p;
  pl.size = size;
  qm_kept_t k;
  qm__report_pointer(op, p, &pl, kept_at(p, kind == QM_CK_LARGE, &k));
}
