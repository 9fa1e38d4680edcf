/* large_churn.c: large-chunk churn through plain malloc/free. Each thread
 * keeps a FIFO window of W live blocks with fixed-seed log-uniform sizes,
 * touches each new block (one byte per page, or all of it), and prints one
 * result line: ops/s, minor faults per op, peak RSS, RSS after free, maps.
 *
 * usage: large_churn [--window W] [--threads T] [--touch page|full]
 *                    [--ops N] [--max-ms MS] [--warm N] [--warm-ms MS]
 *                    [--min-kb K] [--max-kb K] [--seed S]
 * --ops and --warm are per thread; the untimed warm-up also stops at
 * --warm-ms (once the window is full), the timed phase at --max-ms (each
 * thread checks its clock after every op); the ops done are reported.
 */
#include <math.h>

#include "bench.h"

typedef struct worker {
  unsigned id;
  uint64_t ops_done, warm_done;
  int failed;
} worker_t;

static struct {
  unsigned window, threads;
  int full;
  uint64_t ops, warm, max_ns, warm_ns, seed;
  double lmin, lmax;
  bench_crew_t crew;
  uint64_t t_start;
  long maps_peak;
} G;

static size_t pick_size(uint64_t *rng) {
  double l = G.lmin + (G.lmax - G.lmin) * bench_unit(rng);
  return (size_t)exp(l);
}

static void touch(char *p, size_t n, uint64_t op) {
  if (G.full) {
    memset(p, (int)op, n);
  } else {
    for (size_t off = 0; off < n; off += 4096)
      p[off] = (char)op;
    p[n - 1] = (char)op;
  }
  bench_escape(p);
}

static void note_maps(void) {
  long m = bench_count_maps();
  if (m > G.maps_peak)
    G.maps_peak = m;
}

static void *run(void *arg) {
  worker_t *w = arg;
  uint64_t rng = bench_thread_seed(G.seed, w->id);
  char **win = calloc(G.window, sizeof *win);
  if (!win) {
    w->failed = 1;
    return NULL;
  }
  unsigned head = 0, live = 0;
  uint64_t op = 0, warm_start = bench_now_ns(), last_maps = 0;
  /* warm-up (untimed), then the timed phase, each a run of the same loop;
   * between them the main thread takes its first readings */
  for (int phase = 0; phase < 2; phase++) {
    uint64_t limit = w->failed ? 0 : phase ? G.ops : G.warm;
    if (phase) {
      w->warm_done = op;
      pthread_barrier_wait(&G.crew.warmed);
      pthread_barrier_wait(&G.crew.go);
    }
    for (uint64_t k = 0; k < limit; k++) {
      if (live == G.window) {
        free(win[head]);
        live--;
      }
      size_t n = pick_size(&rng);
      char *p = malloc(n);
      if (!p) {
        fprintf(stderr, "large_churn: malloc(%zu) failed\n", n);
        w->failed = 1;
        break;
      }
      touch(p, n, op++);
      win[head] = p;
      head = (head + 1) % G.window;
      live++;
      if (phase) {
        w->ops_done++;
        uint64_t now = bench_now_ns();
        if (w->id == 0 && now - last_maps > 20000000u) { /* every 20 ms: reading costs */
          note_maps();
          last_maps = now;
        }
        if (now - G.t_start > G.max_ns)
          break;
      } else if (k >= G.window && bench_now_ns() - warm_start > G.warm_ns) {
        break;
      }
    }
  }
  pthread_barrier_wait(&G.crew.stop);
  /* the main thread reads the peak figures here, then everything is freed */
  pthread_barrier_wait(&G.crew.freed);
  for (unsigned k = 0; k < G.window; k++)
    free(win[k]);
  free(win);
  return NULL;
}

int main(int argc, char **argv) {
  G.window = (unsigned)bench_arg_u64(argc, argv, "--window", 8);
  G.threads = (unsigned)bench_arg_u64(argc, argv, "--threads", 1);
  G.full = !strcmp(bench_arg_str(argc, argv, "--touch", "page"), "full");
  G.ops = bench_arg_u64(argc, argv, "--ops", 2000);
  G.warm = bench_arg_u64(argc, argv, "--warm", G.window + 64);
  G.max_ns = bench_arg_u64(argc, argv, "--max-ms", 1000) * 1000000u;
  G.warm_ns = bench_arg_u64(argc, argv, "--warm-ms", 1000000) * 1000000u;
  G.seed = bench_arg_u64(argc, argv, "--seed", 42);
  G.lmin = log((double)(bench_arg_u64(argc, argv, "--min-kb", 128) << 10));
  G.lmax = log((double)(bench_arg_u64(argc, argv, "--max-kb", 4096) << 10));
  if (!G.window || !G.threads || G.threads > BENCH_MAX_THREADS) {
    fprintf(stderr, "large_churn: bad --window or --threads\n");
    return 2;
  }
  worker_t w[BENCH_MAX_THREADS];
  memset(w, 0, sizeof w);
  for (unsigned i = 0; i < G.threads; i++)
    w[i].id = i;
  if (bench_crew_start(&G.crew, G.threads, run, w, sizeof *w, "large_churn"))
    return 1;
  bench_qm_stats_fn qs = bench_qm_stats_lookup();
  qm_stats_t s0, s1;
  pthread_barrier_wait(&G.crew.warmed);
  note_maps();
  if (qs)
    qs(&s0);
  long f0 = bench_minflt();
  uint64_t t0 = bench_now_ns();
  G.t_start = t0;
  pthread_barrier_wait(&G.crew.go);
  pthread_barrier_wait(&G.crew.stop);
  uint64_t ns = bench_now_ns() - t0;
  long faults = bench_minflt() - f0;
  if (qs)
    qs(&s1);
  note_maps();
  long hwm = bench_status_kb("VmHWM");
  pthread_barrier_wait(&G.crew.freed);
  uint64_t ops = 0, warm_ops = 0;
  int failed = 0;
  bench_crew_join(&G.crew);
  for (unsigned i = 0; i < G.threads; i++) {
    ops += w[i].ops_done;
    warm_ops += w[i].warm_done;
    failed |= w[i].failed;
  }
  long rss_after = bench_status_kb("VmRSS");
  long maps_after = bench_count_maps();
  if (failed || !ops)
    return 1;
  printf("result bench=large_churn window=%u threads=%u touch=%s ops=%llu ns=%llu"
         " ops_per_s=%.1f minflt=%ld faults_per_op=%.3f peak_rss_kb=%ld rss_after_kb=%ld"
         " maps_peak=%ld maps_after=%ld warm_ops=%llu",
         G.window, G.threads, G.full ? "full" : "page", (unsigned long long)ops,
         (unsigned long long)ns, (double)ops * 1e9 / (double)ns, faults,
         (double)faults / (double)ops, hwm, rss_after, G.maps_peak, maps_after,
         (unsigned long long)warm_ops);
  if (qs)
    bench_print_qm_delta(&s0, &s1);
  printf("\n");
  return 0;
}
