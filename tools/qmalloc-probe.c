/* qmalloc-probe: tells, in plain words or as JSON, what the running kernel
 * does when qmalloc quarantines and reuses a large chunk: the mprotect fast
 * path for dirty, clean and THP pages, guard regions, the mapping budget,
 * the strategy qmalloc picks, and what each strategy costs here. Every
 * verdict comes from counting minor faults, none from the version number.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "os.h"
#include "qmalloc.h"

typedef struct cost {
  int strategy;
  size_t bytes;
  uint64_t faults_x1000, ns;
  int err;
} cost_t;

static const char *yesno(int v) { return v == 1 ? "yes" : v == 0 ? "no" : "n/a"; }

/* One JSON array of measured costs, "KEY": [{"FIELD": name, ...}, ...],
 * for the strategies and for the belt's ways alike. */
static void print_costs(const char *key, const char *field, const cost_t *cs, int n,
                        const char *(*name)(int)) {
  printf("  \"%s\": [", key);
  for (int i = 0; i < n; i++) {
    const cost_t *c = &cs[i];
    printf("%s\n    {\"%s\": \"%s\", \"bytes\": %zu, ", i ? "," : "", field, name(c->strategy),
           c->bytes);
    if (c->err)
      printf("\"available\": false}");
    else
      printf("\"available\": true, \"faults_per_cycle\": %.3f, \"us_per_cycle\": %.1f}",
             c->faults_x1000 / 1000.0, c->ns / 1000.0);
  }
  printf("%s]", n ? "\n  " : "");
}

static void usage(FILE *f) {
  fputs("usage: qmalloc-probe [--json] [--quick]\n"
        "  Probes the kernel's mprotect fast path by counting minor faults and\n"
        "  prints the verdicts and what each quarantine strategy costs here.\n"
        "  --json   machine-readable output\n"
        "  --quick  skip the per-strategy cost measurements\n",
        f);
}

int main(int argc, char **argv) {
  int json = 0, quick = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--json")) {
      json = 1;
    } else if (!strcmp(argv[i], "--quick")) {
      quick = 1;
    } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      usage(stdout);
      return 0;
    } else {
      fprintf(stderr, "qmalloc-probe: unknown argument '%s'\n", argv[i]);
      usage(stderr);
      return 2;
    }
  }
  qm_probe_result_t r;
  int err = qm_probe_run(&r, 1);
  if (err) {
    fprintf(stderr, "qmalloc-probe: the probe could not map memory (errno %d)\n", err);
    return 1;
  }
  const qm_probe_result_t *v = qm_probe_result(); /* the verdict the allocator uses */
  /* the belt in force: reserved (or not) at the first large malloc */
  qm_free(qm_malloc((size_t)1 << 20));
  qm_stats_t st;
  qm_stats(&st);
  long long max_maps = qm_os_read_number("/proc/sys/vm/max_map_count");
  long maps = qm_os_count_mappings();

  static const int strategies[] = {QM_STRATEGY_PROTECT, QM_STRATEGY_DISCARD, QM_STRATEGY_GUARD,
                                   QM_STRATEGY_UNMAP};
  static const size_t sizes[] = {128 << 10, 1 << 20};
  cost_t costs[8], ways[4];
  int ncost = 0, nway = 0;
  if (!quick) {
    for (size_t s = 0; s < 2; s++)
      for (int w = QM_BELT_PROTECT; w <= QM_BELT_MOVE; w++) {
        cost_t *c = &ways[nway++];
        c->strategy = w;
        c->bytes = sizes[s];
        c->err = qm_belt_way_cost(w, c->bytes, sizes[s] > (128 << 10) ? 30 : 100, &c->faults_x1000,
                                  &c->ns);
      }
    for (size_t s = 0; s < 2; s++)
      for (size_t k = 0; k < 4; k++) {
        cost_t *c = &costs[ncost++];
        c->strategy = strategies[k];
        c->bytes = sizes[s];
        c->err =
            (c->strategy == QM_STRATEGY_GUARD && !r.guard_regions)
                ? -1
                : qm_strategy_cost(c->strategy, c->bytes, (unsigned)(c->bytes / 4096),
                                   sizes[s] > (128 << 10) ? 30 : 100, &c->faults_x1000, &c->ns);
      }
  }

  if (json) {
    printf("{\n  \"kernel\": \"%s\",\n", r.kernel);
    printf("  \"fast_path_dirty\": %s,\n", r.fast_dirty ? "true" : "false");
    printf("  \"fast_path_clean\": %s,\n", r.fast_clean < 0 ? "null"
                                           : r.fast_clean   ? "true"
                                                            : "false");
    printf("  \"fast_path_thp\": %s,\n", r.fast_thp < 0 ? "null" : r.fast_thp ? "true" : "false");
    printf("  \"guard_regions\": %s,\n", r.guard_regions ? "true" : "false");
    printf("  \"probe_pages\": %u,\n  \"faults_first_write\": %ld,\n", r.pages, r.faults_first);
    printf("  \"faults_dirty\": %ld,\n  \"faults_clean\": %ld,\n  \"faults_thp\": %ld,\n",
           r.faults_dirty, r.faults_clean, r.faults_thp);
    printf("  \"faults_move_protect\": %ld,\n  \"faults_move_rw\": %ld,\n", r.faults_move_protect,
           r.faults_move_rw);
    printf("  \"belt_way\": \"%s\",\n  \"belt_reason\": \"%s\",\n", qm_belt_way_name(v->belt_way),
           v->belt_reason);
    printf("  \"belt_on\": %s,\n  \"belt_way_in_force\": \"%s\",\n",
           st.belt_reserved_bytes ? "true" : "false", qm_belt_way_name(st.belt_way));
    printf("  \"probe_us\": %.1f,\n", r.probe_ns / 1000.0);
    printf("  \"max_map_count\": %lld,\n  \"mappings_held\": %ld,\n", max_maps, maps);
    printf("  \"strategy\": \"%s\",\n  \"strategy_forced\": %s,\n  \"reason\": \"%s\",\n",
           qm_strategy_name(v->strategy), v->measured ? "false" : "true", v->reason);
    print_costs("costs", "strategy", costs, ncost, qm_strategy_name);
    printf(",\n");
    print_costs("belt_costs", "way", ways, nway, qm_belt_way_name);
    printf("\n}\n");
    return 0;
  }

  printf("kernel                        %s\n", r.kernel);
  printf("fast path, dirty pages        %s  (%ld faults rewriting %u pages after "
         "mprotect NONE -> RW; Linux 6.0+)\n",
         yesno(r.fast_dirty), r.faults_dirty, r.pages);
  if (r.fast_clean < 0)
    printf("fast path, clean pages        n/a (the MADV_FREE'd probe pages were reclaimed)\n");
  else
    printf("fast path, clean pages        %s  (%ld faults after MADV_FREE cleaned them; "
           "Linux 6.2+)\n",
           yesno(r.fast_clean), r.faults_clean);
  if (r.fast_thp < 0)
    printf("fast path, THP (PMD-mapped)   n/a (no transparent huge page could be had)\n");
  else
    printf("fast path, THP (PMD-mapped)   %s  (%ld faults rewriting a 2 MiB THP; Linux 6.2+)\n",
           yesno(r.fast_thp), r.faults_thp);
  printf("guard regions                 %s  (MADV_GUARD_INSTALL; Linux 6.13+)\n",
         yesno(r.guard_regions));
  if (r.faults_move_protect < 0)
    printf("pages moved (mremap)          n/a (no MREMAP_DONTUNMAP: Linux 5.7+)\n");
  else
    printf("pages moved (mremap)          %ld faults rewriting %u pages moved PROT_NONE then "
           "opened, %ld moved RW away and back (the belt's reuse)\n",
           r.faults_move_protect, r.pages, r.faults_move_rw);
  printf("belt way                      %s  (%s)\n", qm_belt_way_name(v->belt_way), v->belt_reason);
  if (st.belt_reserved_bytes)
    printf("belt                          on, way %s: %llu GiB reserved, window %llu GiB\n",
           qm_belt_way_name(st.belt_way), (unsigned long long)(st.belt_reserved_bytes >> 30),
           (unsigned long long)(st.belt_window_bytes >> 30));
  else
    printf("belt                          off (window_gb=0, a sanitizer build, or no room): "
           "large chunks reused in place\n");
  printf("vm.max_map_count              %lld (this process holds %ld mappings)\n", max_maps, maps);
  printf("probe cost                    %.0f us\n", r.probe_ns / 1000.0);
  printf("strategy                      %s%s\n", qm_strategy_name(v->strategy),
         v->measured ? "" : " (forced by QMALLOC_OPTIONS)");
  printf("why                           %s\n", v->reason);
  if (ncost) {
    printf("\nretire + reuse of a chunk, every page rewritten (median per cycle):\n");
    printf("  %-9s %10s %14s %10s\n", "strategy", "size", "faults/cycle", "us/cycle");
    for (int i = 0; i < ncost; i++) {
      cost_t *c = &costs[i];
      if (c->err) {
        printf("  %-9s %7zu KiB %14s %10s\n", qm_strategy_name(c->strategy), c->bytes >> 10, "n/a",
               "n/a");
        continue;
      }
      printf("  %-9s %7zu KiB %14.1f %10.1f\n", qm_strategy_name(c->strategy), c->bytes >> 10,
             c->faults_x1000 / 1000.0, c->ns / 1000.0);
    }
    printf(
        "\nthe belt's ways, free + reuse of a chunk, every page rewritten (median per cycle):\n");
    printf("  %-9s %10s %14s %10s\n", "way", "size", "faults/cycle", "us/cycle");
    for (int i = 0; i < nway; i++) {
      cost_t *c = &ways[i];
      if (c->err)
        printf("  %-9s %7zu KiB %14s %10s\n", qm_belt_way_name(c->strategy), c->bytes >> 10, "n/a",
               "n/a");
      else
        printf("  %-9s %7zu KiB %14.1f %10.1f\n", qm_belt_way_name(c->strategy), c->bytes >> 10,
               c->faults_x1000 / 1000.0, c->ns / 1000.0);
    }
  }
  return 0;
}
