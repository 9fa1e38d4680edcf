/* planted.c: one heap bug planted on purpose, for the benchmark report's
 * detection column: whether the allocator preloaded stops the program, and
 * when. It writes "stage=bug" just before the faulty access or call,
 * "stage=after" once that returned, and "stage=end" before it exits (with
 * write(2), so a process killed at any point has said exactly how far it got);
 * after the bug it goes on allocating and freeing blocks of the same size, as
 * a program would, so that checks made later (at a refill, at the chunk's
 * next hand-out, at exit) get their chance.
 *
 * usage: planted --bug double-free|invalid-free|uaf-write-small|
 *                      uaf-write-large|overflow-small|overflow-large
 *   double-free      free of a 64-byte block already freed
 *   invalid-free     free of a pointer 16 bytes into a live 64-byte block
 *   uaf-write-small  8 bytes written at offset 32 of a freed 64-byte block
 *   uaf-write-large  a byte written into a freed 1 MiB block after another
 *                    1 MiB malloc
 *   overflow-small   the byte after a 24-byte request written (an off-by-one
 *                    NUL), then the block freed
 *   overflow-large   the byte after a 256 KiB request written
 */
#include "bench.h"

/* The block as the compiler cannot follow it: set before the free, read
 * back after it through a volatile, so that a use after free or a free it
 * could see is wrong is neither warned about nor dropped; making exactly
 * that call is the point here. */
static void *volatile kept;

static char *keep(char *p) {
  kept = p;
  return p;
}

static char *again(void) { return kept; }

/* invalid-free's offset into the block, as opaque as the block */
static volatile size_t interior = 16;

static void stage(const char *s) {
  char buf[32];
  size_t n = (size_t)snprintf(buf, sizeof buf, "stage=%s\n", s);
  if (write(1, buf, n) != (ssize_t)n)
    _exit(3);
}

/* What a program does after the bug: n blocks of size bytes allocated, each
 * written, then freed (a freed chunk comes back into use, and the frees fill
 * a batch that a check may be waiting for). */
static int churn(size_t size, unsigned n) {
  char **v = bench_map_touched(n * sizeof *v);
  if (!v)
    return 1;
  for (unsigned i = 0; i < n; i++) {
    if (!(v[i] = malloc(size)))
      return 1;
    memset(v[i], (int)i, size);
  }
  for (unsigned i = 0; i < n; i++)
    free(v[i]);
  munmap(v, n * sizeof *v);
  return 0;
}

int main(int argc, char **argv) {
  const char *bug = bench_arg_str(argc, argv, "--bug", "");
  /* 2,000 blocks: more than hardening=max's free_delay (256) of one class */
  const unsigned n = 2000;
  char *p;
  if (!strcmp(bug, "double-free")) {
    p = keep(malloc(64));
    memset(p, 1, 64);
    free(p);
    stage("bug");
    free(again());
    stage("after");
    if (churn(64, n))
      return 2;
  } else if (!strcmp(bug, "invalid-free")) {
    p = keep(malloc(64));
    memset(p, 1, 64);
    stage("bug");
    free(again() + interior);
    stage("after");
    if (churn(64, n))
      return 2;
  } else if (!strcmp(bug, "uaf-write-small")) {
    p = keep(malloc(64));
    memset(p, 1, 64);
    free(p);
    stage("bug");
    volatile uint64_t *field = (uint64_t *)(again() + 32);
    *field = 0x4141414141414141ull;
    stage("after");
    if (churn(64, n))
      return 2;
  } else if (!strcmp(bug, "uaf-write-large")) {
    size_t sz = (size_t)1 << 20;
    p = keep(malloc(sz));
    memset(p, 1, sz);
    free(p);
    char *q = malloc(sz);
    if (!q)
      return 2;
    memset(q, 2, sz);
    stage("bug");
    ((volatile char *)again())[4096] = 1;
    stage("after");
    free(q);
  } else if (!strcmp(bug, "overflow-small")) {
    p = keep(malloc(24));
    memset(p, 1, 24);
    stage("bug");
    ((volatile char *)again())[24] = 0;
    stage("after");
    free(p);
    if (churn(24, n))
      return 2;
  } else if (!strcmp(bug, "overflow-large")) {
    size_t sz = (size_t)256 << 10;
    p = keep(malloc(sz));
    memset(p, 1, sz);
    stage("bug");
    ((volatile char *)again())[sz] = 1;
    stage("after");
    free(p);
  } else {
    fprintf(stderr,
            "planted: --bug %s: expected double-free, invalid-free, uaf-write-small, "
            "uaf-write-large, overflow-small or overflow-large\n",
            bug);
    return 2;
  }
  stage("end");
  printf("result bench=planted bug=%s survived=1\n", bug);
  return 0;
}
