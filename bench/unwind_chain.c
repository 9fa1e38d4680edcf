/* unwind_chain.c: unwind_cost's call chain, compiled twice by
 * bench/meson.build: as uc_chain_fp with -fno-omit-frame-pointer and as
 * uc_chain_nofp with -fomit-frame-pointer (CHAIN names it). A local array
 * makes each frame use its stack as real code does. */
#include "unwind_cost.h"

__attribute__((noinline)) void CHAIN(int d, result_t *r) {
  volatile char pad[64];
  pad[0] = (char)d;
  if (d > 1)
    CHAIN(d - 1, r);
  else
    uc_measure(r);
  uc_sink += (uintptr_t)pad[0];
}
