/* ro.c: the definitions of every global that is fixed after init, in the
 * section qm_ro, on pages of their own: the section starts on a page (one
 * member is page-aligned) and ro_end.c, linked after this file, ends it with
 * a page of padding so that nothing the linker puts next is on their pages.
 * The order within this file does not matter (clang, which has no
 * -fno-toplevel-reorder, emits the static bounds this file once held before
 * the variables), only the link order of the two files. The owners declare
 * them in their headers as before.
 */
#include "ro.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>

#include "boot.h"
#include "cache.h"
#include "init.h"
#include "options.h"
#include "primary.h"
#include "qm.h"

#define RO __attribute__((section("qm_ro")))

/* the section's start, from the linker; this member aligns it to
 * QM_RO_ALIGN, a page boundary on every page size.
 * Hidden: the linker would otherwise export it, and dlsym would find the
 * sealed keys */
extern char __start_qm_ro[] __attribute__((visibility("hidden")));
RO __attribute__((aligned(QM_RO_ALIGN), used)) static char ro_align[8];
RO qm_options_t qm__opt;
RO qm_option_strings_t qm__opt_str;
RO qm_class_info_t qm__class[QM_NCLASS + 1];
RO uint8_t qm__class_tab[QM_CLASS_TAB_MAX / 8 + 1];
RO uintptr_t qm__pbase;
RO size_t qm__pspan;
RO unsigned qm__rshift;
RO uintptr_t qm__rmask;
RO uintptr_t qm__gmask;
RO size_t qm__small_limit;
RO uint64_t qm__secret;
RO uintptr_t qm__boot_base;
RO size_t qm__page;
RO unsigned qm__page_shift;
RO bool qm__cache_checked;
RO uint8_t qm__vec;
RO struct qm_state_meta *qm__smeta;
/* The primary's steering state (committed bytes and central lists, see
 * primary.c): until init maps it, a zeroed array that nothing writes (no
 * small chunk exists, every small pointer is outside what is committed). */
static _Atomic size_t committed_none[QM_NCLASS + 1];
RO _Atomic size_t *qm__committed = committed_none;
RO struct central *qm__central;

/* zeroed read-only copies until init maps the real pages; writable
 * fallbacks, never sealed, where it cannot */
static const qm_large_fixed_t lfix_none;
static const qm_guarded_fixed_t gfix_none;
static qm_large_fixed_t lfix_fallback;
static qm_guarded_fixed_t gfix_fallback;
RO qm_large_fixed_t *qm__lfix = (qm_large_fixed_t *)&lfix_none;
RO qm_guarded_fixed_t *qm__gfix = (qm_guarded_fixed_t *)&gfix_none;

void qm__late_init(void) {
  size_t pg = qm__page;
  char *p = mmap(NULL, 4 * pg, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED || mprotect(p + pg, 2 * pg, PROT_READ | PROT_WRITE)) {
    if (p != MAP_FAILED)
      munmap(p, 4 * pg);
    qm__lfix = &lfix_fallback;
    qm__gfix = &gfix_fallback;
    return;
  }
  qm__lfix = (qm_large_fixed_t *)(p + pg);
  qm__gfix = (qm_guarded_fixed_t *)(p + 2 * pg);
}

void qm__late_seal(const void *fixed) {
  if (fixed == &lfix_fallback || fixed == &gfix_fallback)
    return;
  (void)mprotect((void *)((uintptr_t)fixed & ~(uintptr_t)(qm__page - 1)), qm__page, PROT_READ);
}

/* mprotect directly, not through os.c: this is the library's own data, not
 * memory the allocator manages, and the page size may not be known yet */
static int protect(int prot) {
  uintptr_t lo = (uintptr_t)__start_qm_ro, hi = (uintptr_t)qm__ro_end;
  return mprotect((void *)lo, hi - lo, prot);
}

void qm__ro_seal(void) { (void)protect(PROT_READ); }
#ifdef QM_TEST_HOOKS
void qm__ro_unseal(void) { (void)protect(PROT_READ | PROT_WRITE); }
void qm__ro_range(void **lo, void **hi) {
  *lo = __start_qm_ro;
  *hi = qm__ro_end;
}
#endif
