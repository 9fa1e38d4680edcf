/* realloc_growth.c: a buffer grown by realloc, the way a growing array or
 * string builder does: doubling from 1 KiB to 64 MiB, or +4 KiB steps from
 * 4 KiB to 8 MiB, writing the new bytes after every step, then freed. One
 * untimed warm-up sequence, then sequences until --reps or --max-ms; prints
 * the median time of a sequence, faults and moves (new address) per one.
 * A sequence that runs past --cap-ms stops growing; the result then says
 * capped=1 and the size it reached, and the warm-up is its only sequence.
 *
 * usage: realloc_growth [--mode double|step] [--reps N] [--max-ms MS]
 *                       [--cap-ms MS]
 */
#include "bench.h"

typedef struct seq {
  uint64_t ns;
  long faults, moves, reallocs;
  size_t reached; /* bytes the buffer reached: less than the end if capped */
} seq_t;

/* One sequence; stops early (capped) once it has run cap_ns: an allocator
 * that copies on every step can take minutes for one. */
static int grow(int dbl, uint64_t cap_ns, seq_t *out) {
  size_t start = dbl ? (size_t)1 << 10 : (size_t)4 << 10;
  size_t end = dbl ? (size_t)64 << 20 : (size_t)8 << 20;
  long f0 = bench_minflt();
  uint64_t t0 = bench_now_ns();
  char *p = malloc(start);
  if (!p)
    return -1;
  memset(p, 1, start);
  size_t size = start;
  long moves = 0, reallocs = 0;
  while (size < end) {
    size_t next = dbl ? size * 2 : size + ((size_t)4 << 10);
    char *q = realloc(p, next);
    if (!q) {
      free(p);
      return -1;
    }
    moves += q != p;
    reallocs++;
    memset(q + size, (int)reallocs, next - size);
    bench_escape(q);
    p = q;
    size = next;
    if (bench_now_ns() - t0 > cap_ns)
      break;
  }
  free(p);
  out->ns = bench_now_ns() - t0;
  out->faults = bench_minflt() - f0;
  out->moves = moves;
  out->reallocs = reallocs;
  out->reached = size;
  return 0;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  int dbl = strcmp(bench_arg_str(argc, argv, "--mode", "double"), "step") != 0;
  uint64_t reps = bench_arg_u64(argc, argv, "--reps", 20);
  uint64_t max_ns = bench_arg_u64(argc, argv, "--max-ms", 1000) * 1000000u;
  uint64_t cap_ns = bench_arg_u64(argc, argv, "--cap-ms", 5000) * 1000000u;
  if (!reps || reps > 10000) {
    fprintf(stderr, "realloc_growth: bad --reps\n");
    return 2;
  }
  bench_qm_stats_fn qs = bench_qm_stats_lookup();
  qm_stats_t s0, s1;
  seq_t warm, one;
  if (grow(dbl, cap_ns, &warm)) {
    fprintf(stderr, "realloc_growth: allocation failed\n");
    return 1;
  }
  size_t end = dbl ? (size_t)64 << 20 : (size_t)8 << 20;
  int capped = warm.reached < end;
  uint64_t ns[10000];
  long faults = 0, moves = 0, reallocs = 0;
  uint64_t n = 0, t0 = bench_now_ns();
  if (qs)
    qs(&s0);
  if (capped) { /* too slow to repeat: the warm-up is the measurement */
    ns[n++] = warm.ns;
    faults = warm.faults;
    moves = warm.moves;
    reallocs = warm.reallocs;
  }
  while (!capped && n < reps && (n == 0 || bench_now_ns() - t0 < max_ns)) {
    if (grow(dbl, cap_ns, &one)) {
      fprintf(stderr, "realloc_growth: allocation failed\n");
      return 1;
    }
    ns[n++] = one.ns;
    capped |= one.reached < end;
    faults += one.faults;
    moves += one.moves;
    reallocs += one.reallocs;
  }
  if (qs)
    qs(&s1);
  qsort(ns, n, sizeof ns[0], cmp_u64);
  printf("result bench=realloc_growth mode=%s seqs=%llu ns_per_seq=%llu ns_min=%llu"
         " faults_per_seq=%.1f moves_per_seq=%.1f reallocs_per_seq=%.0f warm_ns=%llu"
         " warm_faults=%ld warm_moves=%ld capped=%d reached_kb=%zu peak_rss_kb=%ld"
         " rss_after_kb=%ld",
         dbl ? "double" : "step", (unsigned long long)n, (unsigned long long)ns[n / 2],
         (unsigned long long)ns[0], (double)faults / (double)n, (double)moves / (double)n,
         (double)reallocs / (double)n, (unsigned long long)warm.ns, warm.faults, warm.moves, capped,
         warm.reached >> 10, bench_status_kb("VmHWM"), bench_status_kb("VmRSS"));
  if (qs)
    bench_print_qm_delta(&s0, &s1);
  printf("\n");
  return 0;
}
