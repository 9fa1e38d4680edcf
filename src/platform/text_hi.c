/* text_hi.c: the end of qmalloc's code in a program that links it in; last
 * in the library's link order (see text_lo.c).
 */
#include "stack.h"

__attribute__((noinline, used)) void qm__text_hi(void) { __asm__ volatile(""); }
__attribute__((noinline, used, cold)) void qm__text_hi_cold(void) { __asm__ volatile(""); }
