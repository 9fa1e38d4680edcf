/* window.c: the large window at the belt's edges (issue 40, item 5), as a
 * program that knows nothing of qmalloc: a dangling pointer to a freed
 * large chunk must fault however the chunk was placed (over-aligned, past
 * a belt pinned full, under RLIMIT_AS set before exec), after 200 later
 * large frees of its size and 64 live chunks of it; and where a chunk
 * cannot keep the window, malloc says so (ENOMEM) or the break is counted.
 * Modes:
 *   aligned          aligned_alloc(32 MiB, 1 MiB)
 *   full N           N untouched malloc(15 MiB) kept live first, then 1 MiB
 *   rlimit           RLIMIT_AS = 1 GiB, re-exec, then 1100 frees of 1 MiB
 *   break N max|default   N untouched malloc(15 MiB) kept live: under max
 *                    some must fail with ENOMEM, under default none may
 * A fault is the pass (the caller checks the signal and the report); an
 * exit 1 says what went wrong. Exit 77: the state could not be made.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#define MiB ((size_t)1 << 20)
#define LATER                                                                                      \
  200 /* later frees: the quarantine ages a chunk after 16 and 32 MiB, and                         \
       * picks among the aged ones at random */
#define LIVE 64

static void *get(size_t align, size_t size) {
  void *p = align ? aligned_alloc(align, size) : malloc(size);
  if (!p) {
    fprintf(stderr, "window: %s(%zu) failed: %s\n", align ? "aligned_alloc" : "malloc", size,
            strerror(errno));
    exit(1);
  }
  if (align && (uintptr_t)p % align) {
    fprintf(stderr, "window: %p not aligned to %zu\n", p, align);
    exit(1);
  }
  return p;
}

/* Frees one chunk, then `rounds` more of its kind, each written, then
 * takes up to LIVE live ones, then writes through the first one's
 * dangling pointer. Without the window the freed range is handed out again
 * once it has aged in the quarantine (quarantine_min_frees and _mb: 16
 * frees and 32 MiB), and a live chunk takes it: that is reported here and
 * the write would land in it silently. */
/* not static, not inlined: reports name it as the offending frame */
__attribute__((noinline)) int dangle(size_t align, size_t size, unsigned rounds);
int dangle(size_t align, size_t size, unsigned rounds) {
  char *p = get(align, size);
  memset(p, 1, size);
  uintptr_t a = (uintptr_t)p; /* kept as a number: the compiler warns of the pointer */
  free(p);
  for (unsigned k = 0; k < rounds + LIVE; k++) {
    char *q = get(align, size);
    memset(q, 2, size);
    /* the window's floor: 1024 frees (and 256 MiB) at least */
    if (k < 1024 && (uintptr_t)q < a + size && a < (uintptr_t)q + size) {
      fprintf(stderr,
              "window: the range freed at 0x%jx handed out again at %p after %u large frees\n",
              (uintmax_t)a, (void *)q, k < rounds ? k : rounds);
      return 1;
    }
    if (k < rounds)
      free(q);
  }
  *(volatile char *)(a + 16) = 4; /* must fault */
  fprintf(stderr, "window: no fault writing the chunk freed %u large frees ago\n", rounds);
  return 1;
}

/* n untouched chunks of 15 MiB kept live: they pin a 16 MiB segment each.
 * Returns how many malloc refused (each must say ENOMEM). */
static size_t pin(size_t n) {
  size_t refused = 0;
  for (size_t k = 0; k < n; k++) {
    errno = 0;
    if (!malloc(15 * MiB)) {
      if (errno != ENOMEM) {
        fprintf(stderr, "window: malloc failed with %s, not ENOMEM\n", strerror(errno));
        exit(1);
      }
      refused++;
    }
  }
  return refused;
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "";
  if (!strcmp(mode, "aligned"))
    return dangle(32 * MiB, MiB, LATER);
  if (!strcmp(mode, "full") && argc > 2) {
    size_t refused = pin(strtoul(argv[2], NULL, 10));
    if (refused) {
      fprintf(stderr, "window: %zu of the pinning chunks refused: the belt did not grow\n",
              refused);
      return 1;
    }
    return dangle(0, MiB, LATER);
  }
  if (!strcmp(mode, "rlimit")) {
    /* the limit at exec, as the caller of a set-user-ID program sets it */
    struct rlimit rl;
    if (getrlimit(RLIMIT_AS, &rl))
      return 77;
    if (rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > ((rlim_t)1 << 30)) {
      rl.rlim_cur = (rlim_t)1 << 30;
      if (setrlimit(RLIMIT_AS, &rl))
        return 77;
      execv("/proc/self/exe", argv);
      perror("window: execv");
      return 77;
    }
    /* past the window's floor under this limit: 1024 frees and more bytes
     * carved than the limit holds */
    return dangle(0, MiB, 1100);
  }
  if (!strcmp(mode, "break") && argc > 3) {
    size_t n = strtoul(argv[2], NULL, 10), refused = pin(n);
    bool max = !strcmp(argv[3], "max");
    fprintf(stderr, "window: %zu of %zu refused\n", refused, n);
    if (max && !refused) {
      fprintf(stderr, "window: hardening=max gave every chunk, some off the belt\n");
      return 1;
    }
    if (!max && refused) {
      fprintf(stderr, "window: the default profile refused chunks it could map\n");
      return 1;
    }
    return 0;
  }
  fprintf(stderr, "usage: window aligned | full N | rlimit | break N max|default\n");
  return 2;
}
