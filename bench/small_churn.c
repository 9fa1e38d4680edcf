/* small_churn.c: small-chunk churn through plain malloc/free, in four modes
 * that share the size distribution (fixed-seed uniform in [min, max] bytes,
 * each new block's first and last byte written) and count one op as one
 * malloc plus one free of the same block. Prints one result line: ops/s,
 * faults per op, peak RSS (VmHWM), RSS once all is freed, mappings at peak.
 *  churn     each thread keeps L live blocks and replaces a random one per op
 *            (free, then malloc). --record 1 also times every malloc and free
 *            of the timed phase (p50, p99, p99.9, beside the clock's floor).
 *  pc        producer-consumer: per pair, one thread allocates and passes each
 *            block through a bounded single-producer single-consumer ring (its
 *            indices published in batches, so the ring is not the cost) to a
 *            second thread, which frees it.
 *  handoff   T chains of threads in generations: each thread inherits its
 *            predecessor's L live blocks (the predecessor has exited), frees
 *            every one of them in a scattered pass, replacing each with one of
 *            its own, and exits; the next generation is new threads.
 *  phases    P phases of 2..4 threads each (created, joined, then the next
 *            phase): each builds L blocks, frees the blocks the previous phase
 *            kept, churns (a quarter of its ops swap one of its blocks for one
 *            in a shared transfer array instead, so blocks change threads
 *            within and across phases), frees all but --keep-pct of its blocks
 *            and exits; the peak RSS of the whole run is the figure of interest.
 *
 * usage: small_churn [--mode churn|pc|handoff|phases] [--threads T] [--pairs P]
 *                    [--live L] [--ops N] [--max-ms MS] [--warm N] [--min B]
 *                    [--max B] [--seed S] [--record 0|1] [--ring N]
 *                    [--warm-gens G] [--phases P] [--phase-ops N] [--keep-pct K]
 *                    [--transfer N] [--big-pm N] [--big-mul M]
 * churn: --ops and --warm per thread, the timed phase also stops at --max-ms.
 * pc: --ops and --warm per producer, --ring slots (a power of two).
 * handoff: --warm-gens untimed generations, then generations until --max-ms
 * or --ops per chain. phases: fixed work, --phase-ops churn ops per thread.
 * Any mode: --big-pm N of every 1,000 blocks are M times larger (--big-mul,
 * 64 unless given), to mix a few large chunks into the small ones.
 * Bookkeeping arrays (slots, rings, handed-over lists) come from mmap, so only
 * the blocks themselves go through the allocator under test, except in churn,
 * whose slot array has always come from calloc.
 */
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "bench.h"

typedef struct worker {
  unsigned id;
  uint64_t ops_done;
  int failed;
  uint32_t *lat_malloc, *lat_free; /* record mode: ns per call, --ops each */
} worker_t;

static struct {
  const char *mode;
  unsigned threads, pairs, phases, keep_pct;
  size_t live, min, max, ring;
  uint64_t ops, warm, max_ns, seed, warm_gens, phase_ops, transfer, big_pm, big_mul;
  bench_crew_t crew;
  uint64_t t_start;
  int record;
} G;

static char *take(uint64_t *rng, uint64_t op, uint32_t *lat) {
  uint64_t r = bench_rand(rng);
  size_t n = G.min + (size_t)(r % (G.max - G.min + 1));
  if (G.big_pm && (r >> 40) % 1000 < G.big_pm) /* the high bits: independent of n's */
    n *= G.big_mul;
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

/* The fields every mode prints after its own. */
static void print_common(uint64_t ops, uint64_t ns, long faults, long hwm, long rss_after,
                         long maps) {
  printf(" ops=%llu ns=%llu ops_per_s=%.1f minflt=%ld faults_per_op=%.6f peak_rss_kb=%ld"
         " rss_after_kb=%ld maps_peak=%ld",
         (unsigned long long)ops, (unsigned long long)ns, (double)ops * 1e9 / (double)ns, faults,
         (double)faults / (double)ops, hwm, rss_after, maps);
}

/* A waiter on the other thread of a pair: spins briefly, then yields the CPU
 * (on a loaded machine the thread it waits for may need this one). */
static void wait_a_little(unsigned *spins) {
  if (++*spins < 64) {
#if defined(__x86_64__) || defined(__i386__)
    __asm__ volatile("pause");
#elif defined(__aarch64__)
    __asm__ volatile("yield");
#endif
  } else {
    sched_yield();
  }
}

/* ---- churn ---- */

static void *churn_run(void *arg) {
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

/* The timed phase of a started crew: waits until every thread is warm,
 * starts them, waits until every one is done (for producer-consumer, until
 * every consumer has freed the last block); returns its ns and the minor
 * faults count at its start in *f0. */
static uint64_t crew_timed(long *f0) {
  pthread_barrier_wait(&G.crew.warmed);
  *f0 = bench_minflt();
  uint64_t t0 = bench_now_ns();
  G.t_start = t0;
  pthread_barrier_wait(&G.crew.go);
  pthread_barrier_wait(&G.crew.stop);
  return bench_now_ns() - t0;
}
static int churn_main(void) {
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
  if (bench_crew_start(&G.crew, G.threads, churn_run, w, sizeof *w, "small_churn"))
    return 1;
  long f0;
  uint64_t ns = crew_timed(&f0);
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
  printf("result bench=small_churn threads=%u live=%zu", G.threads, G.live);
  print_common(ops, ns, faults, hwm, rss_after, maps);
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

/* ---- producer-consumer ---- */

/* One pair's ring: the producer owns tail, the consumer head, each on its
 * own line. Each side publishes its index every RING_BATCH items and before
 * it waits, and rereads the other's only when the ring looks full (empty),
 * so the pair shares a line about once per RING_BATCH blocks. A NULL block
 * ends a phase. */
#define RING_BATCH 64u

typedef struct pc_ring {
  _Alignas(64) _Atomic uint64_t tail;
  _Alignas(64) _Atomic uint64_t head;
  _Alignas(64) void **slot;
  uint64_t mask;
  unsigned id;
  uint64_t ops_done; /* blocks freed in the timed phase (the consumer's count) */
  int failed;
} pc_ring_t;

typedef struct pc_side {
  _Alignas(64) pc_ring_t *ring;
  int consumer;
  uint64_t mine, theirs; /* own index, the other side's as last read */
} pc_side_t;

static void pc_push(pc_side_t *s, void *p) {
  pc_ring_t *r = s->ring;
  unsigned spins = 0;
  while (s->mine - s->theirs > r->mask) {
    atomic_store_explicit(&r->tail, s->mine, memory_order_release);
    s->theirs = atomic_load_explicit(&r->head, memory_order_acquire);
    if (s->mine - s->theirs > r->mask)
      wait_a_little(&spins);
  }
  r->slot[s->mine & r->mask] = p;
  if (!(++s->mine % RING_BATCH) || !p)
    atomic_store_explicit(&r->tail, s->mine, memory_order_release);
}

static void *pc_pop(pc_side_t *s) {
  pc_ring_t *r = s->ring;
  unsigned spins = 0;
  while (s->mine == s->theirs) {
    atomic_store_explicit(&r->head, s->mine, memory_order_release);
    s->theirs = atomic_load_explicit(&r->tail, memory_order_acquire);
    if (s->mine == s->theirs)
      wait_a_little(&spins);
  }
  void *p = r->slot[s->mine & r->mask];
  if (!(++s->mine % RING_BATCH))
    atomic_store_explicit(&r->head, s->mine, memory_order_release);
  return p;
}

static void *pc_run(void *arg) {
  pc_side_t *s = arg;
  pc_ring_t *r = s->ring;
  uint64_t rng = bench_thread_seed(G.seed, r->id);
  uint64_t op = 0;
  for (int phase = 0; phase < 2; phase++) {
    if (phase) {
      pthread_barrier_wait(&G.crew.warmed);
      pthread_barrier_wait(&G.crew.go);
    }
    if (s->consumer) {
      void *p;
      while ((p = pc_pop(s))) {
        free(p);
        r->ops_done += (uint64_t)phase;
      }
      continue;
    }
    uint64_t limit = r->failed ? 0 : phase ? G.ops : G.warm;
    for (uint64_t k = 0; k < limit; k++, op++) {
      char *p = take(&rng, op, NULL);
      if (!p) {
        r->failed = 1;
        break;
      }
      pc_push(s, p);
      if (phase && (k & 1023) == 1023 && bench_now_ns() - G.t_start > G.max_ns)
        break;
    }
    pc_push(s, NULL);
  }
  pthread_barrier_wait(&G.crew.stop);
  pthread_barrier_wait(&G.crew.freed);
  return NULL;
}

static int pc_main(void) {
  if (G.ring < RING_BATCH || (G.ring & (G.ring - 1)) || 2 * G.pairs > BENCH_MAX_THREADS) {
    fprintf(stderr,
            "small_churn: --ring must be a power of two of at least %u, --pairs at most "
            "%u\n",
            RING_BATCH, BENCH_MAX_THREADS / 2);
    return 2;
  }
  pc_ring_t *ring = bench_map_touched(G.pairs * sizeof *ring);
  pc_side_t *side = bench_map_touched(2 * G.pairs * sizeof *side);
  if (!ring || !side)
    return 1;
  for (unsigned i = 0; i < G.pairs; i++) {
    ring[i].id = i;
    ring[i].mask = G.ring - 1;
    if (!(ring[i].slot = bench_map_touched(G.ring * sizeof(void *))))
      return 1;
    side[2 * i].ring = side[2 * i + 1].ring = &ring[i];
    side[2 * i + 1].consumer = 1;
  }
  if (bench_crew_start(&G.crew, 2 * G.pairs, pc_run, side, sizeof *side, "small_churn"))
    return 1;
  long f0;
  uint64_t ns = crew_timed(&f0); /* every consumer has freed the last block */
  long faults = bench_minflt() - f0;
  long hwm = bench_status_kb("VmHWM");
  long maps = bench_count_maps();
  pthread_barrier_wait(&G.crew.freed);
  bench_crew_join(&G.crew);
  uint64_t ops = 0;
  int failed = 0;
  for (unsigned i = 0; i < G.pairs; i++) {
    ops += ring[i].ops_done;
    failed |= ring[i].failed;
  }
  if (failed || !ops) {
    fprintf(stderr, "small_churn: allocation failed\n");
    return 1;
  }
  printf("result bench=producer_consumer pairs=%u ring=%zu", G.pairs, G.ring);
  print_common(ops, ns, faults, hwm, bench_status_kb("VmRSS"), maps);
  printf("\n");
  return 0;
}

/* ---- hand-off ---- */

/* One chain of threads: its blocks and its PRNG stream outlive every
 * generation; only one thread of the chain runs at a time. */
typedef struct chain {
  _Alignas(64) char **slot;
  unsigned id;
  uint64_t rng, op, ops_done;
  int failed, timed;
} chain_t;

static size_t gcd(size_t a, size_t b) {
  while (b) {
    size_t t = a % b;
    a = b;
    b = t;
  }
  return a;
}

static void *handoff_run(void *arg) {
  chain_t *c = arg;
  uint64_t rng = c->rng;
  if (!c->slot[0]) { /* the first generation builds the working set */
    for (size_t i = 0; i < G.live; i++)
      if (!(c->slot[i] = take(&rng, c->op++, NULL))) {
        c->failed = 1;
        break;
      }
    c->rng = rng;
    return NULL;
  }
  /* every inherited block freed once, in a scattered order: a stride prime
   * to L from a random start visits each slot once in L steps */
  size_t start = (size_t)(bench_rand(&rng) % G.live), stride = 1;
  if (G.live > 2)
    do
      stride = 1 + (size_t)(bench_rand(&rng) % (G.live - 1));
    while (gcd(stride, G.live) != 1);
  size_t i = start;
  for (size_t k = 0; k < G.live; k++) {
    free(c->slot[i]);
    if (!(c->slot[i] = take(&rng, c->op++, NULL))) {
      c->failed = 1;
      break;
    }
    i += stride;
    if (i >= G.live)
      i -= G.live;
  }
  c->ops_done += c->timed ? G.live : 0;
  c->rng = rng;
  return NULL;
}

/* Runs one generation: a new thread per chain, all joined. 0, or 1. */
static int handoff_generation(chain_t *c, int timed) {
  pthread_t tid[BENCH_MAX_THREADS];
  for (unsigned i = 0; i < G.threads; i++) {
    c[i].timed = timed;
    if (pthread_create(&tid[i], NULL, handoff_run, &c[i])) {
      fprintf(stderr, "small_churn: pthread_create failed\n");
      return 1;
    }
  }
  int failed = 0;
  for (unsigned i = 0; i < G.threads; i++) {
    pthread_join(tid[i], NULL);
    failed |= c[i].failed;
  }
  if (failed)
    fprintf(stderr, "small_churn: allocation failed\n");
  return failed;
}

static int handoff_main(void) {
  chain_t *c = bench_map_touched(G.threads * sizeof *c);
  if (!c)
    return 1;
  for (unsigned i = 0; i < G.threads; i++) {
    c[i].id = i;
    c[i].rng = bench_thread_seed(G.seed, i);
    if (!(c[i].slot = bench_map_touched(G.live * sizeof(char *))))
      return 1;
  }
  for (uint64_t g = 0; g <= G.warm_gens; g++)
    if (handoff_generation(c, 0))
      return 1;
  long f0 = bench_minflt();
  uint64_t t0 = bench_now_ns(), gens = 0;
  do {
    if (handoff_generation(c, 1))
      return 1;
    gens++;
  } while (bench_now_ns() - t0 < G.max_ns && gens * G.live < G.ops);
  uint64_t ns = bench_now_ns() - t0;
  long faults = bench_minflt() - f0;
  long hwm = bench_status_kb("VmHWM");
  long maps = bench_count_maps();
  uint64_t ops = 0;
  for (unsigned i = 0; i < G.threads; i++) {
    ops += c[i].ops_done;
    for (size_t k = 0; k < G.live; k++)
      free(c[i].slot[k]);
  }
  printf("result bench=handoff threads=%u live=%zu generations=%llu", G.threads, G.live,
         (unsigned long long)gens);
  print_common(ops, ns, faults, hwm, bench_status_kb("VmRSS"), maps);
  printf("\n");
  return 0;
}

/* ---- phases ---- */

#define PHASE_MAX_THREADS 4u

typedef struct phaser {
  _Alignas(64) char **slot;
  unsigned idx, n;
  uint64_t rng, ops_done;
  int failed;
} phaser_t;

static struct {
  char **kept_prev, **kept_next; /* blocks handed from one phase to the next */
  size_t n_prev, keep;           /* threads of the previous phase; blocks each keeps */
  _Atomic(char *) *transfer;     /* blocks any thread may swap one of its own for */
  size_t n_transfer;
} P;

static void *phases_run(void *arg) {
  phaser_t *w = arg;
  uint64_t rng = w->rng, op = 0;
  for (size_t i = 0; i < G.live; i++)
    if (!(w->slot[i] = take(&rng, op++, NULL))) {
      w->failed = 1;
      return NULL;
    }
  for (size_t i = w->idx; i < P.n_prev * P.keep; i += w->n)
    free(P.kept_prev[i]);
  for (uint64_t k = 0; k < G.phase_ops; k++) {
    size_t i = (size_t)(bench_rand(&rng) % G.live);
    if ((k & 3) == 3 && P.n_transfer) { /* a quarter of the ops trade blocks between threads */
      size_t j = (size_t)(bench_rand(&rng) % P.n_transfer);
      w->slot[i] = atomic_exchange_explicit(&P.transfer[j], w->slot[i], memory_order_acq_rel);
      continue;
    }
    free(w->slot[i]);
    if (!(w->slot[i] = take(&rng, op++, NULL))) {
      w->failed = 1;
      return NULL;
    }
  }
  for (size_t i = 0; i < G.live; i++)
    if (i < P.keep)
      P.kept_next[w->idx * P.keep + i] = w->slot[i];
    else
      free(w->slot[i]);
  w->ops_done += op;
  w->rng = rng;
  return NULL;
}

static int phases_main(void) {
  phaser_t *w = bench_map_touched(PHASE_MAX_THREADS * sizeof *w);
  P.keep = G.live * G.keep_pct / 100;
  P.kept_prev = bench_map_touched(PHASE_MAX_THREADS * (P.keep + 1) * sizeof(char *));
  P.kept_next = bench_map_touched(PHASE_MAX_THREADS * (P.keep + 1) * sizeof(char *));
  P.n_transfer = G.transfer;
  P.transfer = bench_map_touched(P.n_transfer * sizeof *P.transfer);
  if (!w || !P.kept_prev || !P.kept_next || !P.transfer)
    return 1;
  for (unsigned i = 0; i < PHASE_MAX_THREADS; i++) {
    w[i].rng = bench_thread_seed(G.seed, i);
    if (!(w[i].slot = bench_map_touched(G.live * sizeof(char *))))
      return 1;
  }
  long f0 = bench_minflt();
  uint64_t t0 = bench_now_ns(), ops = 0, rng = bench_thread_seed(G.seed, PHASE_MAX_THREADS);
  for (size_t j = 0; j < P.n_transfer; j++, ops++)
    if (!(P.transfer[j] = take(&rng, j, NULL))) {
      fprintf(stderr, "small_churn: allocation failed\n");
      return 1;
    }
  for (unsigned ph = 0; ph < G.phases; ph++) {
    unsigned n = 2 + ph % (PHASE_MAX_THREADS - 1); /* 2, 3, 4, 2, ... */
    pthread_t tid[PHASE_MAX_THREADS];
    for (unsigned i = 0; i < n; i++) {
      w[i].idx = i;
      w[i].n = n;
      if (pthread_create(&tid[i], NULL, phases_run, &w[i])) {
        fprintf(stderr, "small_churn: pthread_create failed\n");
        return 1;
      }
    }
    int failed = 0;
    for (unsigned i = 0; i < n; i++) {
      pthread_join(tid[i], NULL);
      failed |= w[i].failed;
    }
    if (failed) {
      fprintf(stderr, "small_churn: allocation failed\n");
      return 1;
    }
    char **t = P.kept_prev;
    P.kept_prev = P.kept_next;
    P.kept_next = t;
    P.n_prev = n;
  }
  uint64_t ns = bench_now_ns() - t0;
  long faults = bench_minflt() - f0;
  long hwm = bench_status_kb("VmHWM");
  long maps = bench_count_maps();
  for (size_t i = 0; i < P.n_prev * P.keep; i++)
    free(P.kept_prev[i]);
  for (size_t j = 0; j < P.n_transfer; j++)
    free(P.transfer[j]);
  for (unsigned i = 0; i < PHASE_MAX_THREADS; i++)
    ops += w[i].ops_done;
  printf("result bench=phases phases=%u live=%zu keep_pct=%u transfer=%zu", G.phases, G.live,
         G.keep_pct, P.n_transfer);
  print_common(ops, ns, faults, hwm, bench_status_kb("VmRSS"), maps);
  printf("\n");
  return 0;
}

int main(int argc, char **argv) {
  G.mode = bench_arg_str(argc, argv, "--mode", "churn");
  G.threads = (unsigned)bench_arg_u64(argc, argv, "--threads", 1);
  G.pairs = (unsigned)bench_arg_u64(argc, argv, "--pairs", 1);
  G.live = bench_arg_u64(argc, argv, "--live", 10000);
  G.ops = bench_arg_u64(argc, argv, "--ops", 4000000);
  G.warm = bench_arg_u64(argc, argv, "--warm", 200000);
  G.max_ns = bench_arg_u64(argc, argv, "--max-ms", 1000) * 1000000u;
  G.min = bench_arg_u64(argc, argv, "--min", 8);
  G.max = bench_arg_u64(argc, argv, "--max", 1024);
  G.seed = bench_arg_u64(argc, argv, "--seed", 42);
  G.record = (int)bench_arg_u64(argc, argv, "--record", 0);
  G.ring = bench_arg_u64(argc, argv, "--ring", 4096);
  G.warm_gens = bench_arg_u64(argc, argv, "--warm-gens", 2);
  G.phases = (unsigned)bench_arg_u64(argc, argv, "--phases", 8);
  G.phase_ops = bench_arg_u64(argc, argv, "--phase-ops", 50000);
  G.keep_pct = (unsigned)bench_arg_u64(argc, argv, "--keep-pct", 10);
  G.transfer = bench_arg_u64(argc, argv, "--transfer", 1000);
  G.big_pm = bench_arg_u64(argc, argv, "--big-pm", 0);
  G.big_mul = bench_arg_u64(argc, argv, "--big-mul", 64);
  if (!G.threads || G.threads > BENCH_MAX_THREADS || !G.pairs || !G.live || !G.min ||
      G.max < G.min || G.keep_pct > 100) {
    fprintf(stderr, "small_churn: bad arguments\n");
    return 2;
  }
  if (G.record && strcmp(G.mode, "churn")) {
    fprintf(stderr, "small_churn: --record is for --mode churn only\n");
    return 2;
  }
  if (!strcmp(G.mode, "churn"))
    return churn_main();
  if (!strcmp(G.mode, "pc"))
    return pc_main();
  if (!strcmp(G.mode, "handoff"))
    return handoff_main();
  if (!strcmp(G.mode, "phases"))
    return phases_main();
  fprintf(stderr, "small_churn: --mode %s: expected churn, pc, handoff or phases\n", G.mode);
  return 2;
}
