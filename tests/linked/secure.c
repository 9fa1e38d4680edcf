/* secure.c: a program linked with libqmalloc.a whose own options turn
 * verbose on and set stack_frames=5 (and hardening=max when built with
 * -DPROFILE_MAX); run as a set-user-ID copy by
 * secure.sh, QMALLOC_OPTIONS must change nothing. Prints whether the kernel
 * put it in secure execution and the strategy in force.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>

#include "qmalloc.h"

const char *qmalloc_default_options(void);
#ifdef PROFILE_MAX
const char *qmalloc_default_options(void) { return "verbose=1:stack_frames=5:hardening=max"; }
#else
const char *qmalloc_default_options(void) { return "verbose=1:stack_frames=5:hardening=default"; }
#endif

int main(void) {
  char *volatile p = malloc(1 << 20); /* a large chunk fixes the strategy */
  memset(p, 1, 1 << 20);
  free(p);
  printf("secure=%lu strategy=%s\n", getauxval(AT_SECURE),
         qm_strategy_name(qm_probe_result()->strategy));
  return 0;
}
