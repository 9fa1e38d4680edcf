/* unwind_cost.h: what unwind_cost.c and its two call chains (unwind_chain.c
 * compiled with and without frame pointers) share: the result of one
 * measure, the measure at the chain's bottom, and the chains. */
#ifndef QM_BENCH_UNWIND_COST_H
#define QM_BENCH_UNWIND_COST_H
#include <stdint.h>

typedef struct result {
  uint64_t ns[2];
  unsigned frames[2];
} result_t;

/* the two captures, at the bottom of a chain (frame pointers on) */
void uc_measure(result_t *r);
/* a chain of d frames calling uc_measure: with and without frame pointers */
void uc_chain_fp(int d, result_t *r);
void uc_chain_nofp(int d, result_t *r);
extern volatile uintptr_t uc_sink;

#endif
