/* seed_loop.c: the seed experiment. One range is mapped and written once;
 * each iteration retires and revives it, then writes every page, no page or
 * one page (a different one each time). The step is a raw syscall pair here
 * (write: none; mprotect: NONE then RW; dontneed: MADV_DONTNEED;
 * mprotect-thp: the mprotect pair on a 2 MiB-aligned MADV_HUGEPAGE range,
 * so transparent huge pages can back it) or one of qmalloc's strategies
 * through qm_strategy_cost(). Prints the median ns of an iteration and the
 * exact minor faults per iteration.
 *
 * usage: seed_loop --method write|mprotect|mprotect-thp|dontneed|qm-protect|
 *                           qm-discard|qm-guard|qm-unmap
 *                  [--size-kb K] [--touch all|0|1] [--iters N] [--max-ms MS]
 */
#include <errno.h>
#include <sys/mman.h>

#include "bench.h"

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* The raw loop; returns 0 and fills *median_ns, *faults_x1000, *iters. */
static int raw_loop(const char *method, size_t len, long touch, uint64_t max_iters, uint64_t max_ns,
                    uint64_t *median_ns, uint64_t *faults_x1000, uint64_t *iters, long *huge_kb) {
  size_t pg = 4096, pages = len / pg, huge = (size_t)2 << 20;
  int thp = !strcmp(method, "mprotect-thp");
  int mprot = thp || !strcmp(method, "mprotect"), dontneed = !strcmp(method, "dontneed");
  if (!mprot && !dontneed && strcmp(method, "write"))
    return EINVAL;
  size_t maplen = thp ? len + huge : len;
  char *map = mmap(NULL, maplen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (map == MAP_FAILED)
    return errno;
  char *p = map;
  if (thp) {
    p = (char *)(((uintptr_t)map + huge - 1) & ~(uintptr_t)(huge - 1));
    madvise(p, len, MADV_HUGEPAGE);
  }
  uint64_t *ns = malloc((size_t)max_iters * sizeof *ns);
  if (!ns) {
    munmap(map, maplen);
    return ENOMEM;
  }
  memset(p, 1, len);
  long faults = 0;
  uint64_t n = 0, start = bench_now_ns();
  for (uint64_t i = 0; i <= max_iters; i++) { /* iteration 0 warms up */
    long f0 = bench_minflt();
    uint64_t t0 = bench_now_ns();
    if (mprot) {
      if (mprotect(p, len, PROT_NONE) || mprotect(p, len, PROT_READ | PROT_WRITE))
        return errno;
    } else if (dontneed) {
      if (madvise(p, len, MADV_DONTNEED))
        return errno;
    }
    if (touch < 0)
      for (size_t k = 0; k < pages; k++)
        p[k * pg] = (char)i;
    else if (touch == 1)
      p[(i % pages) * pg] = (char)i;
    bench_escape(p);
    uint64_t t = bench_now_ns() - t0;
    if (i) {
      ns[n++] = t;
      faults += bench_minflt() - f0;
      if (n >= 3 && bench_now_ns() - start > max_ns)
        break;
    }
  }
  qsort(ns, n, sizeof *ns, cmp_u64);
  *median_ns = ns[n / 2];
  *faults_x1000 = (uint64_t)faults * 1000 / n;
  *iters = n;
  *huge_kb = bench_proc_kb("/proc/self/smaps_rollup", "AnonHugePages");
  free(ns);
  munmap(map, maplen);
  return 0;
}

static int strategy_of(const char *m) {
  if (!strcmp(m, "qm-protect"))
    return QM_STRATEGY_PROTECT;
  if (!strcmp(m, "qm-discard"))
    return QM_STRATEGY_DISCARD;
  if (!strcmp(m, "qm-guard"))
    return QM_STRATEGY_GUARD;
  if (!strcmp(m, "qm-unmap"))
    return QM_STRATEGY_UNMAP;
  return 0;
}

int main(int argc, char **argv) {
  const char *method = bench_arg_str(argc, argv, "--method", "mprotect");
  size_t len = (size_t)bench_arg_u64(argc, argv, "--size-kb", 128) << 10;
  const char *t = bench_arg_str(argc, argv, "--touch", "all");
  long touch = !strcmp(t, "all") ? -1 : strtol(t, NULL, 10);
  uint64_t max_iters = bench_arg_u64(argc, argv, "--iters", 10000);
  uint64_t max_ns = bench_arg_u64(argc, argv, "--max-ms", 200) * 1000000u;
  if (len < 4096 || len % 4096 || touch > 1 || !max_iters) {
    fprintf(stderr, "seed_loop: bad --size-kb, --touch or --iters\n");
    return 2;
  }
  uint64_t median = 0, fx = 0, iters = 0;
  long huge_kb = 0;
  int strategy = strategy_of(method), err;
  if (strategy) {
    unsigned tp = touch < 0 ? (unsigned)(len / 4096) : (unsigned)touch;
    /* one short call estimates the cost of an iteration (mapping and the
     * first write included), then one call sized to the time budget */
    uint64_t t0 = bench_now_ns();
    err = qm_strategy_cost(strategy, len, tp, 1, &fx, &median);
    uint64_t one = (bench_now_ns() - t0) / 2 + 1;
    if (!err) {
      iters = max_ns / one;
      iters = iters < 3 ? 3 : iters > max_iters ? max_iters : iters;
      err = qm_strategy_cost(strategy, len, tp, (unsigned)iters, &fx, &median);
    }
  } else {
    err = raw_loop(method, len, touch, max_iters, max_ns, &median, &fx, &iters, &huge_kb);
  }
  if (err) {
    printf("result bench=seed_loop method=%s size_kb=%zu touch=%s error=%s\n", method, len >> 10, t,
           strerror(err));
    return err == EINVAL ? 3 : 1;
  }
  printf("result bench=seed_loop method=%s size_kb=%zu touch=%s iters=%llu ns_per_iter=%llu"
         " faults_per_iter=%.3f huge_kb=%ld\n",
         method, len >> 10, t, (unsigned long long)iters, (unsigned long long)median,
         (double)fx / 1000.0, huge_kb);
  return 0;
}
