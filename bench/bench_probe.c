/* bench_probe.c: prints qmalloc's probe verdict and the strategy it chose
 * under the current QMALLOC_OPTIONS, one "key: value" per line, for the
 * head of the benchmark report. Linked with the prefix-only library.
 */
#include <stdio.h>

#include "qmalloc.h"

int main(void) {
  qm_stats_t s;
  qm_stats(&s); /* initialises the allocator: options read, probe run */
  const qm_probe_result_t *r = qm_probe_result();
  printf("kernel: %s\n", r->kernel);
  printf("measured: %d\n", r->measured);
  printf("fast_dirty: %d\n", r->fast_dirty);
  printf("fast_clean: %d\n", r->fast_clean);
  printf("guard_regions: %d\n", r->guard_regions);
  printf("pages: %u\n", r->pages);
  printf("faults_first: %ld\n", r->faults_first);
  printf("faults_dirty: %ld\n", r->faults_dirty);
  printf("faults_clean: %ld\n", r->faults_clean);
  printf("probe_ns: %llu\n", (unsigned long long)r->probe_ns);
  printf("strategy: %s\n", qm_strategy_name(r->strategy));
  printf("reason: %s\n", r->reason);
  return 0;
}
