/* bench.h: what every workload program under bench/ shares: clocks, exact
 * minor-fault counts, RSS and mapping counts read from /proc without malloc,
 * a fixed-seed PRNG, command-line parsing, the threaded harness, per-call
 * latency percentiles (record mode) and the one result line format.
 * Header-only (static functions) so each program stays one file plus this.
 */
#ifndef QM_BENCH_H
#define QM_BENCH_H

#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "qmalloc.h"

static inline uint64_t bench_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Minor faults of the whole process (every thread): exact. */
static inline long bench_minflt(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_minflt;
}

/* Reads a /proc file into buf with read(2): no stdio, so no malloc that
 * would disturb the allocator under test. Returns the length or -1. */
static inline long bench_read_file(const char *path, char *buf, size_t cap) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return -1;
  size_t n = 0;
  for (;;) {
    ssize_t r = read(fd, buf + n, cap - 1 - n);
    if (r <= 0)
      break;
    n += (size_t)r;
    if (n == cap - 1)
      break;
  }
  close(fd);
  buf[n] = 0;
  return (long)n;
}

/* A "Name:   123 kB" field of a /proc file, in KiB; -1 if absent. */
static inline long bench_proc_kb(const char *path, const char *name) {
  char buf[8192];
  if (bench_read_file(path, buf, sizeof buf) < 0)
    return -1;
  size_t len = strlen(name);
  for (char *line = buf; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL)
    if (!strncmp(line, name, len) && line[len] == ':')
      return strtol(line + len + 1, NULL, 10);
  return -1;
}

/* A field of /proc/self/status (VmHWM, VmRSS), in KiB. */
static inline long bench_status_kb(const char *name) {
  return bench_proc_kb("/proc/self/status", name);
}

/* Lines of /proc/self/maps: the mappings the process holds now. */
static inline long bench_count_maps(void) {
  char buf[65536];
  int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return -1;
  long lines = 0;
  ssize_t r;
  while ((r = read(fd, buf, sizeof buf)) > 0)
    for (ssize_t i = 0; i < r; i++)
      lines += buf[i] == '\n';
  close(fd);
  return lines;
}

/* splitmix64: a fixed seed gives the same request sequence to every
 * allocator. */
static inline uint64_t bench_rand(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Uniform in [0, 1). */
static inline double bench_unit(uint64_t *s) { return (double)(bench_rand(s) >> 11) * 0x1p-53; }

/* "--name value" as an unsigned number (with an optional k/m/g suffix), or
 * the default. */
static inline uint64_t bench_arg_u64(int argc, char **argv, const char *name, uint64_t dflt) {
  for (int i = 1; i + 1 < argc; i++) {
    if (strcmp(argv[i], name))
      continue;
    char *end;
    uint64_t v = strtoull(argv[i + 1], &end, 10);
    if (*end == 'k' || *end == 'K')
      v <<= 10;
    else if (*end == 'm' || *end == 'M')
      v <<= 20;
    else if (*end == 'g' || *end == 'G')
      v <<= 30;
    return v;
  }
  return dflt;
}

static inline const char *bench_arg_str(int argc, char **argv, const char *name, const char *dflt) {
  for (int i = 1; i + 1 < argc; i++)
    if (!strcmp(argv[i], name))
      return argv[i + 1];
  return dflt;
}

/* The threaded harness of the churn programs: T workers warm up untimed,
 * meet the main thread at `warmed` (it takes its first readings), start the
 * timed phase together at `go`, meet again at `stop` (the peak readings) and
 * free what they hold after `freed`. */
#define BENCH_MAX_THREADS 64u

typedef struct bench_crew {
  pthread_barrier_t warmed, go, stop, freed;
  pthread_t tid[BENCH_MAX_THREADS];
  unsigned n;
} bench_crew_t;

/* Starts n workers running fn(arg + i * stride); 0, or 1 with a message. */
static inline int bench_crew_start(bench_crew_t *c, unsigned n, void *(*fn)(void *), void *arg,
                                   size_t stride, const char *who) {
  c->n = n;
  pthread_barrier_init(&c->warmed, NULL, n + 1);
  pthread_barrier_init(&c->go, NULL, n + 1);
  pthread_barrier_init(&c->stop, NULL, n + 1);
  pthread_barrier_init(&c->freed, NULL, n + 1);
  for (unsigned i = 0; i < n; i++)
    if (pthread_create(&c->tid[i], NULL, fn, (char *)arg + i * stride)) {
      fprintf(stderr, "%s: pthread_create failed\n", who);
      return 1;
    }
  return 0;
}

static inline void bench_crew_join(bench_crew_t *c) {
  for (unsigned i = 0; i < c->n; i++)
    pthread_join(c->tid[i], NULL);
}

/* Worker id's own PRNG stream from the run's seed. */
static inline uint64_t bench_thread_seed(uint64_t seed, unsigned id) {
  return seed ^ ((uint64_t)(id + 1) * 0xd1b54a32d192ed03ull);
}

/* Keeps the compiler from dropping writes to memory that is freed later. */
static inline void bench_escape(void *p) { __asm__ volatile("" : : "r"(p) : "memory"); }

/* qmalloc's counters when libqmalloc is the allocator (preloaded or linked);
 * found with dlsym so the programs stay plain malloc programs. */
typedef void (*bench_qm_stats_fn)(qm_stats_t *);

static inline bench_qm_stats_fn bench_qm_stats_lookup(void) {
  return (bench_qm_stats_fn)(uintptr_t)dlsym(RTLD_DEFAULT, "qm_stats");
}

/* Appends qmalloc's syscall and reuse counts between two snapshots, and
 * the quarantine's chunks and resident MiB at the second. */
static inline void bench_print_qm_delta(const qm_stats_t *a, const qm_stats_t *b) {
  printf(" qm_mmap=%llu qm_munmap=%llu qm_mprotect=%llu qm_madvise=%llu qm_mremap=%llu"
         " qm_reuses=%llu qm_fresh=%llu qm_drops=%llu qm_unmaps=%llu qm_avoided=%llu",
         (unsigned long long)(b->sys_mmap - a->sys_mmap),
         (unsigned long long)(b->sys_munmap - a->sys_munmap),
         (unsigned long long)(b->sys_mprotect - a->sys_mprotect),
         (unsigned long long)(b->sys_madvise - a->sys_madvise),
         (unsigned long long)(b->sys_mremap - a->sys_mremap),
         (unsigned long long)(b->reuses - a->reuses),
         (unsigned long long)(b->fresh_maps - a->fresh_maps),
         (unsigned long long)(b->drops - a->drops), (unsigned long long)(b->unmaps - a->unmaps),
         (unsigned long long)(b->faults_avoided - a->faults_avoided));
  printf(" qm_quar_chunks=%llu qm_quar_res_mib=%.1f", (unsigned long long)b->quarantine_chunks,
         (double)b->quarantine_resident_bytes / (1 << 20));
}

/* ---- record mode: what one call costs ---- */

/* Memory for the record itself, from mmap and written once before the
 * timed phase: no malloc of the allocator under test, and no fault while
 * the calls are timed. NULL on failure. */
static inline void *bench_map_touched(size_t bytes) {
  void *p =
      mmap(NULL, bytes ? bytes : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    return NULL;
  memset(p, 0, bytes);
  return p;
}

/* The least time between two clock readings: the floor of every latency
 * figure (a call that takes no time still shows this). */
static inline uint64_t bench_clock_floor_ns(void) {
  uint64_t best = UINT64_MAX;
  for (int i = 0; i < 2000; i++) {
    uint64_t a = bench_now_ns(), b = bench_now_ns();
    if (b - a < best)
      best = b - a;
  }
  return best;
}

static inline int bench_cmp_u32(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return (x > y) - (x < y);
}

/* The value at quantile q (0..1) of n sorted values (nearest rank). */
static inline uint32_t bench_quantile_u32(const uint32_t *v, size_t n, double q) {
  if (!n)
    return 0;
  size_t k = (size_t)(q * (double)n);
  return v[k < n ? k : n - 1];
}

/* Sorts n latencies (ns) and appends " lat_NAME_p50_ns=.. _p99_ns=.. _p999_ns=..". */
static inline void bench_print_latency(const char *name, uint32_t *v, size_t n) {
  qsort(v, n, sizeof *v, bench_cmp_u32);
  printf(" lat_%s_n=%zu lat_%s_p50_ns=%u lat_%s_p99_ns=%u lat_%s_p999_ns=%u", name, n, name,
         bench_quantile_u32(v, n, 0.5), name, bench_quantile_u32(v, n, 0.99), name,
         bench_quantile_u32(v, n, 0.999));
}

/* Times one call: the nanoseconds since t0, saturated to 32 bits. */
static inline uint32_t bench_since(uint64_t t0) {
  uint64_t d = bench_now_ns() - t0;
  return d > UINT32_MAX ? UINT32_MAX : (uint32_t)d;
}

#endif
