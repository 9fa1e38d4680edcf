/* ro_end.c: the page of padding that ends the section qm_ro, so that the
 * sealed globals of ro.c share no page with what the linker puts next. It is
 * last because this file is linked right after ro.c (the linker keeps input
 * order within a section), whatever order a compiler emits globals in.
 */
#include "ro.h"

__attribute__((section("qm_ro"), aligned(4096))) char qm__ro_end[4096];
