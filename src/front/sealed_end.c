/* sealed_end.c: the page of padding (QM_RO_ALIGN bytes, a page of the
 * largest size) that ends the section qm_ro, so that the sealed globals of
 * seal.c and sealed.c share no page with what the linker puts next. It is
 * last because this file is linked right after them (the linker keeps
 * input order within a section), whatever order a compiler emits globals in.
 */
#include "seal.h"

__attribute__((section("qm_ro"), aligned(QM_RO_ALIGN))) char qm__ro_end[QM_RO_ALIGN];
