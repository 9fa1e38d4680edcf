/* ro.c: the definitions of every global that is fixed after init, in this
 * order on pages of their own: a page-aligned start, the variables, and a
 * page of padding so that nothing the linker puts next is on their pages.
 * Built with -fno-toplevel-reorder so the order holds. The owners declare
 * them in their headers as before.
 */
#include "ro.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>

#include "cache.h"
#include "init.h"
#include "options.h"
#include "primary.h"
#include "qm.h"

#define RO __attribute__((section("qm_ro")))

RO __attribute__((aligned(4096))) static char ro_begin[8];
RO qm_options_t qm__opt;
RO qm_class_info_t qm__class[QM_NCLASS + 1];
RO uint8_t qm__class_tab[QM_CLASS_TAB_MAX / 16 + 1];
RO uintptr_t qm__pbase;
RO size_t qm__pspan;
RO unsigned qm__rshift;
RO uintptr_t qm__gmask;
RO size_t qm__small_limit;
RO uint64_t qm__secret;
RO size_t qm__page;
RO unsigned qm__page_shift;
RO bool qm__cache_checked;
RO uint64_t qm__cache_seed;
RO __attribute__((aligned(4096))) static char ro_end[4096];

/* mprotect directly, not through os.c: this is the library's own data, not
 * memory the allocator manages, and the page size may not be known yet */
static int protect(int prot) {
  uintptr_t lo = (uintptr_t)ro_begin, hi = (uintptr_t)ro_end;
  return mprotect((void *)lo, hi - lo, prot);
}

void qm__ro_seal(void) { (void)protect(PROT_READ); }
void qm__ro_unseal(void) { (void)protect(PROT_READ | PROT_WRITE); }
void qm__ro_range(void **lo, void **hi) {
  *lo = ro_begin;
  *hi = ro_end;
}
