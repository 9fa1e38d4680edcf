/* describe.c: the one description of an address (qm__describe), read by the
 * SIGSEGV report, the reports of bad pointers and qm_describe(): which part
 * of qmalloc owns it, asked in turn through the describers registered in
 * one sealed table (qm__describers, sealed.c), fills a qm_place_t. Lock-free and
 * allocation-free, as the SIGSEGV handler needs. Also the reports on a
 * pointer that need it, or a large chunk's kept stacks: it hands report.c
 * what to print. Calls no part by name: each registered itself.
 */
#include "describe.h"

#include "place.h"
#include "report.h"

bool qm__describe(uintptr_t a, qm_place_t *pl) {
  qm_place_empty(pl);
  for (unsigned i = 0; i < qm__describers.n; i++)
    if (qm__describers.fn[i](a, pl))
      return true;
  return false;
}

const qm_kept_t *qm__describe_kept(uintptr_t a, qm_kept_t *k) {
  return qm__describers.kept ? qm__describers.kept(a, k) : NULL;
}

/* The kept stacks at p, where a large chunk is: NULL elsewhere. */
static const qm_kept_t *kept_at(const void *p, bool large, qm_kept_t *k) {
  return large ? qm__describe_kept((uintptr_t)p, k) : NULL;
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
