/* layout.c: what an attacker grooming the small-chunk heap relies on,
 * measured from outside with fixed trial counts: that the chunk just freed
 * is the next one of its size handed out, that fresh chunks sit side by
 * side, that a freed chunk soon comes back, that a heap of one size has
 * no inaccessible page inside it, and that a chunk freed by a thread that
 * exits comes back first to the thread after it (or, to a successor that
 * takes over its chunks, in the order of a thread's own). Prints the figure and
 * fails past the threshold the project promises; glibc's and jemalloc's
 * layouts fail the first four by far.
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void *volatile sink;

/* free(p) then malloc of the same size, 1000 times, with a live set of 64
 * chunks of that size around, as a program has. */
static int reuse(size_t n) {
  void *live[64];
  for (int i = 0; i < 64; i++)
    live[i] = malloc(n);
  int same = 0, trials = 1000;
  for (int t = 0; t < trials; t++) {
    void *p = malloc(n);
    sink = p;
    free(p);
    void *q = malloc(n);
    sink = q;
    same += q == p;
    free(q);
  }
  for (int i = 0; i < 64; i++)
    free(live[i]);
  printf("immediate reuse of a freed %zu-byte chunk: %d of %d trials\n", n, same, trials);
  return same * 10 > trials;
}

/* 1000 fresh chunks of one size in a row: how often is one right after
 * (or right before) the previous, a chunk size away? */
static int adjacent(size_t n) {
  enum { N = 1000 };
  static char *c[N];
  for (int i = 0; i < N; i++)
    c[i] = malloc(n);
  /* the chunk size: the smallest distance between any two of them */
  uintptr_t step = UINTPTR_MAX;
  for (int i = 1; i < N; i++) {
    uintptr_t d = c[i] > c[i - 1] ? (uintptr_t)(c[i] - c[i - 1]) : (uintptr_t)(c[i - 1] - c[i]);
    if (d && d < step)
      step = d;
  }
  int next = 0;
  for (int i = 1; i < N; i++)
    next += c[i] == c[i - 1] + step || c[i] == c[i - 1] - step;
  printf("fresh %zu-byte chunks in the very next slot: %d of %d\n", n, next, N - 1);
  for (int i = 0; i < N; i++)
    free(c[i]);
  return next * 10 > N - 1;
}

/* free(p), then `depth` mallocs of its size, each freed again before the
 * next (the churn that moves a delayed chunk along fastest), 1000 times:
 * how often does p come back among them? Fails if ever. */
static int delayed(size_t n, int depth) {
  int back = 0, trials = 1000;
  for (int t = 0; t < trials; t++) {
    void *p = malloc(n);
    sink = p;
    free(p);
    for (int i = 0; i < depth; i++) {
      void *q = malloc(n);
      sink = q;
      if (q == p) {
        back++;
        free(q);
        break;
      }
      free(q);
    }
  }
  printf("a freed %zu-byte chunk back within %d mallocs of its size: %d of %d trials\n", n, depth,
         back, trials);
  return back != 0;
}

static int cmp_ptr(const void *a, const void *b) {
  uintptr_t x = *(const uintptr_t *)a, y = *(const uintptr_t *)b;
  return x < y ? -1 : x > y;
}

/* 16 MiB of live n-byte chunks: how many pages between the lowest and the
 * highest are inaccessible? A write(2) from an inaccessible page fails with
 * EFAULT instead of faulting, for PROT_NONE pages and guard markers alike.
 * Fails with fewer than one per `per_kib` KiB of the span. */
static int guards(size_t n, size_t per_kib) {
  size_t count = ((size_t)16 << 20) / n;
  uintptr_t *c = calloc(count, sizeof *c);
  int fd[2];
  if (!c || pipe(fd))
    return 2;
  for (size_t i = 0; i < count; i++) {
    c[i] = (uintptr_t)malloc(n);
    if (!c[i])
      return 2;
  }
  qsort(c, count, sizeof *c, cmp_ptr);
  long pg = sysconf(_SC_PAGESIZE);
  uintptr_t lo = c[0] & ~(uintptr_t)(pg - 1), hi = c[count - 1];
  size_t none = 0;
  char byte;
  for (uintptr_t a = lo; a < hi; a += (uintptr_t)pg) {
    if (write(fd[1], (const void *)a, 1) == 1) {
      if (read(fd[0], &byte, 1) != 1)
        return 2;
    } else if (errno == EFAULT) {
      none++;
    } else {
      return 2;
    }
  }
  size_t span_kib = (hi - lo) >> 10, want = span_kib / per_kib;
  printf("16 MiB of live %zu-byte chunks over %zu KiB: %zu inaccessible pages among them "
         "(at least %zu wanted)\n",
         n, span_kib, none, want);
  for (size_t i = 0; i < count; i++)
    free((void *)c[i]);
  free(c);
  return none < want || !want;
}

/* One trial of handoff: thread A mallocs HAND chunks, frees them (in the
 * order malloc gave them) and exits; then thread B mallocs HAND chunks.
 * With hand_inherit, A first mallocs one more chunk, which it leaves live,
 * and B's first act frees it: B succeeds A (its owner id, and the chunks
 * A's cache held), and the chunk watched is A's last freed, not its
 * lowest. */
enum { HAND = 512 };
static size_t hand_n;
static int hand_inherit;
static void *hand_live;  /* A's chunk that B frees first (hand_inherit) */
static uintptr_t hand_x; /* A's lowest chunk, or its last freed */
static int hand_at;      /* where it came back among B's mallocs, or HAND */
static void *hand_a(void *arg) {
  (void)arg;
  void *c[HAND];
  hand_live = hand_inherit ? malloc(hand_n) : NULL;
  hand_x = UINTPTR_MAX;
  for (int i = 0; i < HAND; i++) {
    c[i] = malloc(hand_n);
    if ((uintptr_t)c[i] < hand_x)
      hand_x = (uintptr_t)c[i];
  }
  if (hand_inherit)
    hand_x = (uintptr_t)c[HAND - 1];
  for (int i = 0; i < HAND; i++)
    free(c[i]);
  return NULL;
}
static void *hand_b(void *arg) {
  (void)arg;
  void *c[HAND];
  free(hand_live);
  hand_at = HAND;
  for (int i = 0; i < HAND; i++) {
    c[i] = malloc(hand_n);
    if ((uintptr_t)c[i] == hand_x && hand_at == HAND)
      hand_at = i;
  }
  for (int i = 0; i < HAND; i++)
    free(c[i]);
  return NULL;
}

/* A thread frees its chunks and exits; the next thread's mallocs of that
 * size: how often is the first thread's lowest chunk among the first
 * `within` of them? An attacker who frees a chunk it can name (the lowest
 * of a fresh batch) must not be able to count on its coming back to the
 * victim's next mallocs. Fails when it does in more than `pct` percent of
 * 200 trials (taken lowest first, it came back 200 of 200). With inherit,
 * the next thread succeeds the first, and the first's last freed chunk is
 * watched: it comes back as a thread's own frees do, at a random place of
 * its bin, not first (last in, first out: 200 of 200). */
static int handoff(size_t n, int within, int pct, int inherit) {
  int back = 0, trials = 200;
  hand_n = n;
  hand_inherit = inherit;
  for (int t = 0; t < trials; t++) {
    pthread_t a, b;
    if (pthread_create(&a, NULL, hand_a, NULL) || pthread_join(a, NULL) ||
        pthread_create(&b, NULL, hand_b, NULL) || pthread_join(b, NULL))
      return 2;
    back += hand_at < within;
  }
  if (inherit)
    printf("the last %zu-byte chunk an exited thread freed among its successor's first %d "
           "mallocs: %d of %d trials\n",
           n, within, back, trials);
  else
    printf("a %zu-byte chunk freed by an exited thread among the next one's first %d mallocs: "
           "%d of %d trials\n",
           n, within, back, trials);
  return back * 100 > pct * trials;
}

int main(int argc, char **argv) {
  const char *m = argc > 1 ? argv[1] : "";
  size_t n = argc > 2 ? strtoull(argv[2], NULL, 0) : 64;
  if (!strcmp(m, "reuse"))
    return reuse(n);
  if (!strcmp(m, "adjacent"))
    return adjacent(n);
  if (!strcmp(m, "delayed"))
    return delayed(n, argc > 3 ? atoi(argv[3]) : 256);
  if (!strcmp(m, "guards"))
    return guards(n, argc > 3 ? strtoull(argv[3], NULL, 0) : 1024);
  if (!strcmp(m, "handoff") || !strcmp(m, "handoff-inherit"))
    return handoff(n, argc > 3 ? atoi(argv[3]) : 64, argc > 4 ? atoi(argv[4]) : 50,
                   !strcmp(m, "handoff-inherit"));
  fprintf(stderr, "layout: unknown measurement '%s'\n", m);
  return 2;
}
