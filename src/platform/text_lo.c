/* text_lo.c: the start of qmalloc's code in a program that links it in (a
 * static or whole-archive link), where no module boundary tells its frames
 * from the program's. First in the library's link order, text_hi.c last:
 * the linker keeps input order within .text and within .text.unlikely (cold
 * parts), so each pair of markers brackets the library's share of one.
 */
#include "stack.h"

__attribute__((noinline, used)) void qm__text_lo(void) { __asm__ volatile(""); }
__attribute__((noinline, used, cold)) void qm__text_lo_cold(void) { __asm__ volatile(""); }
