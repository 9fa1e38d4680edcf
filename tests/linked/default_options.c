/* default_options.c: a program that sets qmalloc's options by defining
 * qmalloc_default_options(), and allocates while doing it (strdup): start-up
 * must neither hang nor crash, and the options must take effect.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qmalloc.h"

const char *qmalloc_default_options(void);
const char *qmalloc_default_options(void) {
  static char *opts;
  if (!opts)
    opts = strdup("quarantine_max_chunks=0:strategy=unmap"); /* served while qmalloc starts */
  return opts;
}

int main(void) {
  qm_stats_t before, after;
  qm_stats(&before);
  char *volatile p = malloc(1 << 20); /* volatile: kept, not optimized out */
  memset(p, 1, 1 << 20);
  free(p);
  qm_stats(&after);
  /* no quarantine: the freed chunk was unmapped at once */
  int ok = after.unmaps == before.unmaps + 1 && after.quarantine_chunks == 0;
  /* the strategy too, which is fixed once, the first time a large chunk
   * is needed: the strdup above must not have been that time */
  ok = ok && qm_probe_result()->strategy == QM_STRATEGY_UNMAP;
  printf("default options applied: %s\n", ok ? "yes" : "NO");
  return ok ? 0 : 1;
}
