/* layout.c: what an attacker grooming the small-chunk heap relies on,
 * measured from outside with fixed trial counts: that the chunk just freed
 * is the next one of its size handed out, and that fresh chunks sit side by
 * side. Prints the figure and fails past the threshold the project
 * promises (10%); an allocator that reuses last-in-first-out, or carves in
 * address order, fails both by far.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

int main(int argc, char **argv) {
  const char *m = argc > 1 ? argv[1] : "";
  size_t n = argc > 2 ? strtoull(argv[2], NULL, 0) : 64;
  if (!strcmp(m, "reuse"))
    return reuse(n);
  if (!strcmp(m, "adjacent"))
    return adjacent(n);
  fprintf(stderr, "layout: unknown measurement '%s'\n", m);
  return 2;
}
