/* small_churn.c: small-chunk churn through plain malloc/free. Each thread
 * keeps L live blocks of fixed-seed uniform sizes in [min, max] bytes and
 * replaces a random one per op (free, then malloc, then write its first and
 * last byte); prints one result line: ops/s, faults per op, peak RSS. With
 * --record 1 it also times every malloc and free of the timed phase (p50,
 * p99, p99.9; the clock's own floor is printed beside them).
 *
 * usage: small_churn [--threads T] [--live L] [--ops N] [--max-ms MS]
 *                    [--warm N] [--min B] [--max B] [--seed S] [--record 0|1]
 * --ops and --warm are per thread; the timed phase also stops at --max-ms.
 */
#include <stdbool.h>

#include "bench.h"

typedef struct worker {
  unsigned id;
  uint64_t ops_done;
  int failed;
  uint32_t *lat_malloc, *lat_free; /* record mode: ns per call, --ops each */
} worker_t;

static struct {
  unsigned threads;
  size_t live, min, max;
  uint64_t ops, warm, max_ns, seed;
  bench_crew_t crew;
  uint64_t t_start;
  int record;
} G;

static char *take(uint64_t *rng, uint64_t op, uint32_t *lat) {
  size_t n = G.min + (size_t)(bench_rand(rng) % (G.max - G.min + 1));
  char *p;
  if (lat) {
    uint64_t t0 = bench_now_ns();
    p = malloc(n);
    *lat = bench_since(t0);
  } else {
    p = malloc(n);
  }
  if (p) {
    p[0] = (char)op;
    p[n - 1] = (char)op;
    bench_escape(p);
  }
  return p;
}

static void *run(void *arg) {
  worker_t *w = arg;
  uint64_t rng = bench_thread_seed(G.seed, w->id);
  char **slot = calloc(G.live, sizeof *slot);
  if (!slot)
    w->failed = 1;
  for (size_t i = 0; !w->failed && i < G.live; i++)
    if (!(slot[i] = take(&rng, i, NULL)))
      w->failed = 1;
  uint64_t op = 0;
  for (int phase = 0; phase < 2; phase++) {
    uint64_t limit = w->failed ? 0 : phase ? G.ops : G.warm;
    if (phase) {
      pthread_barrier_wait(&G.crew.warmed);
      pthread_barrier_wait(&G.crew.go);
    }
    bool rec = phase && G.record;
    for (uint64_t k = 0; k < limit; k++, op++) {
      size_t i = (size_t)(bench_rand(&rng) % G.live);
      if (rec) {
        uint64_t t0 = bench_now_ns();
        free(slot[i]);
        w->lat_free[k] = bench_since(t0);
      } else {
        free(slot[i]);
      }
      if (!(slot[i] = take(&rng, op, rec ? &w->lat_malloc[k] : NULL))) {
        w->failed = 1;
        break;
      }
      if (phase) {
        w->ops_done++;
        if ((k & 1023) == 1023 && bench_now_ns() - G.t_start > G.max_ns)
          break;
      }
    }
  }
  pthread_barrier_wait(&G.crew.stop);
  pthread_barrier_wait(&G.crew.freed);
  for (size_t i = 0; slot && i < G.live; i++)
    free(slot[i]);
  free(slot);
  return NULL;
}

int main(int argc, char **argv) {
  G.threads = (unsigned)bench_arg_u64(argc, argv, "--threads", 1);
  G.live = bench_arg_u64(argc, argv, "--live", 10000);
  G.ops = bench_arg_u64(argc, argv, "--ops", 4000000);
  G.warm = bench_arg_u64(argc, argv, "--warm", 200000);
  G.max_ns = bench_arg_u64(argc, argv, "--max-ms", 1000) * 1000000u;
  G.min = bench_arg_u64(argc, argv, "--min", 8);
  G.max = bench_arg_u64(argc, argv, "--max", 1024);
  G.seed = bench_arg_u64(argc, argv, "--seed", 42);
  G.record = (int)bench_arg_u64(argc, argv, "--record", 0);
  if (!G.threads || G.threads > BENCH_MAX_THREADS || !G.live || !G.min || G.max < G.min) {
    fprintf(stderr, "small_churn: bad arguments\n");
    return 2;
  }
  worker_t w[BENCH_MAX_THREADS];
  memset(w, 0, sizeof w);
  for (unsigned i = 0; i < G.threads; i++)
    w[i].id = i;
  uint64_t clock_floor = 0;
  uint32_t *lm = NULL, *lf = NULL;
  if (G.record) { /* one slice per thread, written before the timed phase */
    lm = bench_map_touched(G.ops * G.threads * sizeof *lm);
    lf = bench_map_touched(G.ops * G.threads * sizeof *lf);
    if (!lm || !lf) {
      fprintf(stderr, "small_churn: no memory for the record of %llu ops\n",
              (unsigned long long)G.ops);
      return 1;
    }
    for (unsigned i = 0; i < G.threads; i++) {
      w[i].lat_malloc = lm + i * G.ops;
      w[i].lat_free = lf + i * G.ops;
    }
    clock_floor = bench_clock_floor_ns();
  }
  if (bench_crew_start(&G.crew, G.threads, run, w, sizeof *w, "small_churn"))
    return 1;
  pthread_barrier_wait(&G.crew.warmed);
  long f0 = bench_minflt();
  uint64_t t0 = bench_now_ns();
  G.t_start = t0;
  pthread_barrier_wait(&G.crew.go);
  pthread_barrier_wait(&G.crew.stop);
  uint64_t ns = bench_now_ns() - t0;
  long faults = bench_minflt() - f0;
  long hwm = bench_status_kb("VmHWM");
  long maps = bench_count_maps();
  pthread_barrier_wait(&G.crew.freed);
  uint64_t ops = 0;
  int failed = 0;
  bench_crew_join(&G.crew);
  for (unsigned i = 0; i < G.threads; i++) {
    ops += w[i].ops_done;
    failed |= w[i].failed;
  }
  long rss_after = bench_status_kb("VmRSS");
  if (failed || !ops) {
    fprintf(stderr, "small_churn: allocation failed\n");
    return 1;
  }
  printf("result bench=small_churn threads=%u live=%zu ops=%llu ns=%llu ops_per_s=%.1f"
         " minflt=%ld faults_per_op=%.6f peak_rss_kb=%ld rss_after_kb=%ld maps_peak=%ld",
         G.threads, G.live, (unsigned long long)ops, (unsigned long long)ns,
         (double)ops * 1e9 / (double)ns, faults, (double)faults / (double)ops, hwm, rss_after,
         maps);
  if (G.record) {
    size_t n = 0; /* the slices moved together; each moves down, never over a later one */
    for (unsigned i = 0; i < G.threads; i++) {
      memmove(lm + n, w[i].lat_malloc, w[i].ops_done * sizeof *lm);
      memmove(lf + n, w[i].lat_free, w[i].ops_done * sizeof *lf);
      n += w[i].ops_done;
    }
    printf(" clock_floor_ns=%llu", (unsigned long long)clock_floor);
    bench_print_latency("malloc", lm, n);
    bench_print_latency("free", lf, n);
  }
  printf("\n");
  return 0;
}
