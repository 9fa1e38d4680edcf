/* large_churn.c: large-chunk churn through plain malloc/free. Each thread
 * keeps a FIFO window of W live blocks with fixed-seed log-uniform sizes,
 * touches each new block (one byte per page, or all of it), and prints one
 * result line: ops/s, minor faults per op, peak RSS, RSS after free, maps.
 * With --record 1 it also times every malloc and free of the timed phase
 * and logs the addresses they hand out and take back, for the reuse
 * distance: how many large frees, and how many MiB of them, passed between
 * a block's free and the next malloc that returned any part of its range
 * (the use-after-free detection window the allocator really gives).
 *
 * usage: large_churn [--window W] [--threads T] [--touch page|full]
 *                    [--ops N] [--max-ms MS] [--warm N] [--warm-ms MS]
 *                    [--min-kb K] [--max-kb K] [--seed S] [--record 0|1]
 * --ops and --warm are per thread; the untimed warm-up also stops at
 * --warm-ms (once the window is full), the timed phase at --max-ms (each
 * thread checks its clock after every op); the ops done are reported.
 * --warm 0 measures a cold start: the first --ops ops of the process.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "bench.h"

typedef struct worker {
  unsigned id;
  uint64_t ops_done, warm_done;
  int failed;
  uint32_t *lat_malloc, *lat_free; /* record mode: ns per call */
  size_t n_malloc, n_free;
} worker_t;

/* One logged call of the timed phase (record mode). A free takes its ticket
 * before the call and a malloc after it returns, so a free always precedes,
 * in ticket order, any malloc that hands its range out again, whichever
 * threads made them. */
enum { EV_NONE, EV_FREE, EV_MALLOC };
typedef struct event {
  uintptr_t addr;
  size_t size;
  unsigned kind;
} event_t;

static struct {
  unsigned window, threads;
  int full;
  uint64_t ops, warm, max_ns, warm_ns, seed;
  double lmin, lmax;
  bench_crew_t crew;
  uint64_t t_start;
  long maps_peak;
  int record;
  event_t *ev;
  size_t ev_cap;
  _Atomic size_t ev_next;
} G;

static void note(unsigned kind, const void *p, size_t n) {
  size_t t = atomic_fetch_add_explicit(&G.ev_next, 1, memory_order_relaxed);
  if (t < G.ev_cap)
    G.ev[t] = (event_t){.addr = (uintptr_t)p, .size = n, .kind = kind};
}

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
  size_t *wsize = calloc(G.window, sizeof *wsize);
  if (!win || !wsize) {
    w->failed = 1;
    return NULL;
  }
  unsigned head = 0, live = 0;
  uint64_t op = 0, warm_start = bench_now_ns(), last_maps = 0;
  /* warm-up (untimed), then the timed phase, each a run of the same loop;
   * between them the main thread takes its first readings */
  for (int phase = 0; phase < 2; phase++) {
    uint64_t limit = w->failed ? 0 : phase ? G.ops : G.warm;
    bool rec = phase && G.record;
    if (phase) {
      w->warm_done = op;
      pthread_barrier_wait(&G.crew.warmed);
      pthread_barrier_wait(&G.crew.go);
    }
    for (uint64_t k = 0; k < limit; k++) {
      if (live == G.window) {
        if (rec) {
          note(EV_FREE, win[head], wsize[head]);
          uint64_t t0 = bench_now_ns();
          free(win[head]);
          w->lat_free[w->n_free++] = bench_since(t0);
        } else {
          free(win[head]);
        }
        live--;
      }
      size_t n = pick_size(&rng);
      char *p;
      if (rec) {
        uint64_t t0 = bench_now_ns();
        p = malloc(n);
        w->lat_malloc[w->n_malloc++] = bench_since(t0);
        if (p)
          note(EV_MALLOC, p, n);
      } else {
        p = malloc(n);
      }
      if (!p) {
        fprintf(stderr, "large_churn: malloc(%zu) failed\n", n);
        w->failed = 1;
        break;
      }
      touch(p, n, op++);
      win[head] = p;
      wsize[head] = n;
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
  free(wsize);
  return NULL;
}

/* ---- reuse distance, from the log of the timed phase ---- */

/* A freed block whose range no malloc has returned since: [start, end),
 * with the count of frees and of bytes freed up to and including its own.
 * Such blocks are disjoint (a malloc overlapping one retires it), so they
 * are kept sorted by start. */
typedef struct pending {
  uintptr_t start, end;
  uint64_t frees, bytes;
} pending_t;

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

/* The first pending block that ends after a (binary search). */
static size_t first_ending_after(const pending_t *p, size_t n, uintptr_t a) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (p[mid].end <= a)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

/* Appends reuse_n (blocks whose range came back), reuse_open (freed blocks
 * whose range had not come back when the log ended) and min, p1 and p50 of
 * the frees and of the MiB freed after a block before its range came back. */
static int print_reuse(void) {
  size_t n = atomic_load(&G.ev_next);
  if (n > G.ev_cap)
    n = G.ev_cap;
  pending_t *pend = bench_map_touched(n * sizeof *pend);
  uint64_t *dfree = bench_map_touched(n * sizeof *dfree);
  uint64_t *dbytes = bench_map_touched(n * sizeof *dbytes);
  if (!pend || !dfree || !dbytes)
    return 1;
  size_t np = 0, ns = 0;
  uint64_t frees = 0, bytes = 0;
  for (size_t t = 0; t < n; t++) {
    const event_t *e = &G.ev[t];
    if (e->kind == EV_NONE)
      continue;
    uintptr_t a = e->addr, end = e->addr + (e->size ? e->size : 1);
    size_t i = first_ending_after(pend, np, a), j = i;
    while (j < np && pend[j].start < end) {
      if (e->kind == EV_MALLOC) {
        dfree[ns] = frees - pend[j].frees;
        dbytes[ns] = bytes - pend[j].bytes;
        ns++;
      }
      j++; /* an overlap at a free would be a block freed twice: dropped */
    }
    memmove(pend + i, pend + j, (np - j) * sizeof *pend);
    np -= j - i;
    if (e->kind == EV_FREE) {
      frees++;
      bytes += e->size;
      memmove(pend + i + 1, pend + i, (np - i) * sizeof *pend);
      pend[i] = (pending_t){.start = a, .end = end, .frees = frees, .bytes = bytes};
      np++;
    }
  }
  qsort(dfree, ns, sizeof *dfree, cmp_u64);
  qsort(dbytes, ns, sizeof *dbytes, cmp_u64);
#define Q(v, q) (ns ? v[(size_t)((q) * (double)ns) < ns ? (size_t)((q) * (double)ns) : ns - 1] : 0)
  printf(" reuse_n=%zu reuse_open=%zu reuse_frees_min=%llu reuse_frees_p1=%llu"
         " reuse_frees_p50=%llu reuse_mib_min=%.2f reuse_mib_p1=%.2f reuse_mib_p50=%.2f",
         ns, np, (unsigned long long)Q(dfree, 0), (unsigned long long)Q(dfree, 0.01),
         (unsigned long long)Q(dfree, 0.5), (double)Q(dbytes, 0) / 1048576.0,
         (double)Q(dbytes, 0.01) / 1048576.0, (double)Q(dbytes, 0.5) / 1048576.0);
#undef Q
  return 0;
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
  G.record = (int)bench_arg_u64(argc, argv, "--record", 0);
  if (!G.window || !G.threads || G.threads > BENCH_MAX_THREADS) {
    fprintf(stderr, "large_churn: bad --window or --threads\n");
    return 2;
  }
  worker_t w[BENCH_MAX_THREADS];
  memset(w, 0, sizeof w);
  for (unsigned i = 0; i < G.threads; i++)
    w[i].id = i;
  uint64_t clock_floor = 0;
  if (G.record) { /* every call of the timed phase is logged: --ops bounds it */
    G.ev_cap = 2 * G.ops * G.threads;
    G.ev = bench_map_touched(G.ev_cap * sizeof *G.ev);
    uint32_t *lm = bench_map_touched(G.ops * G.threads * sizeof *lm);
    uint32_t *lf = bench_map_touched(G.ops * G.threads * sizeof *lf);
    if (!G.ev || !lm || !lf) {
      fprintf(stderr, "large_churn: no memory for the record of %llu ops\n",
              (unsigned long long)G.ops);
      return 1;
    }
    for (unsigned i = 0; i < G.threads; i++) { /* one slice per thread */
      w[i].lat_malloc = lm + i * G.ops;
      w[i].lat_free = lf + i * G.ops;
    }
    clock_floor = bench_clock_floor_ns();
  }
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
  if (G.record) {
    /* all threads' calls together (each slice moves down, never over a
     * later one): the latency of one call, whoever made it */
    size_t nm = 0, nf = 0;
    for (unsigned i = 0; i < G.threads; i++) {
      memmove(w[0].lat_malloc + nm, w[i].lat_malloc, w[i].n_malloc * sizeof(uint32_t));
      memmove(w[0].lat_free + nf, w[i].lat_free, w[i].n_free * sizeof(uint32_t));
      nm += w[i].n_malloc;
      nf += w[i].n_free;
    }
    printf(" clock_floor_ns=%llu", (unsigned long long)clock_floor);
    bench_print_latency("malloc", w[0].lat_malloc, nm);
    bench_print_latency("free", w[0].lat_free, nf);
    if (print_reuse())
      return 1;
  }
  printf("\n");
  return 0;
}
