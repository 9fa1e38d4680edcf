/* seal.c: the sealing of section qm_ro (seal.h) and the pages fixed once
 * a lazily started part is set up (qm__lfix, qm__gfix). Linked first in the
 * section's own library, before sealed.c's definitions and sealed_end.c's
 * padding, so that the three files' parts of the section are contiguous.
 * Calls nothing of qmalloc's: the page size may not be known yet.
 */
#include "seal.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>

#include "qm.h"

#define RO QM_SEALED

/* the section's start, from the linker; this member aligns it to
 * QM_RO_ALIGN, a page boundary on every page size.
 * Hidden: the linker would otherwise export it, and dlsym would find the
 * sealed keys */
extern char __start_qm_ro[] __attribute__((visibility("hidden")));
RO __attribute__((aligned(QM_RO_ALIGN), used)) static char ro_align[8];

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
