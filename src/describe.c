/* describe.c: the one description of an address (qm__describe), read by the
 * SIGSEGV report, the reports of bad pointers and qm_describe(): which part
 * of qmalloc owns it, asked in turn, fills a qm_place_t. Lock-free and
 * allocation-free, as the SIGSEGV handler needs.
 */
#include "boot.h"
#include "guarded.h"
#include "init.h"
#include "large_report.h"
#include "place.h"
#include "primary.h"
#include "smallstate.h"

bool qm__describe(uintptr_t a, qm_place_t *pl) {
  pl->access = QM_ACC_WILD;
  pl->chunk = pl->plain = false;
  pl->kind = QM_CK_SMALL;
  pl->user = 0;
  pl->size = 0;
  pl->words.n = 0;
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
