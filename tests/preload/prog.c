/* prog.c: a plain C program, not linked with qmalloc, that misuses memory in
 * the way its first argument names; run under LD_PRELOAD by expect.sh to
 * show what qmalloc does to a program that knows nothing of it.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static void *churn(void *arg) {
  unsigned seed = (unsigned)(uintptr_t)arg;
  void *live[64] = {0};
  for (int i = 0; i < 200000; i++) {
    seed = seed * 1103515245 + 12345;
    int k = (seed >> 8) % 64;
    free(live[k]);
    size_t n = (seed >> 16) % 100 == 0 ? (size_t)(128 << 10) + (seed % (1 << 20)) : seed % 2048;
    live[k] = malloc(n);
    if (!live[k])
      return (void *)1;
    memset(live[k], i, n < 64 ? n : 64);
  }
  for (int k = 0; k < 64; k++)
    free(live[k]);
  return NULL;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr,
            "usage: prog uaf|double-free|overflow|underflow|invalid-free|own-mprotect|enomem|raise|"
            "threads "
            "[SIZE] [read|write]\n");
    return 2;
  }
  const char *mode = argv[1];
  size_t n = argc > 2 ? strtoull(argv[2], NULL, 0) : 131072;
  int write = argc > 3 && !strcmp(argv[3], "write");
  char *p = malloc(n);
  /* the misuses go through volatile: the compiler may not drop them */
  volatile char *volatile dangling = p;
  memset(p, 1, n);
  if (!strcmp(mode, "uaf")) {
    free(p);
    if (write)
      dangling[16] = 2;
    else
      printf("%d\n", dangling[16]);
  } else if (!strcmp(mode, "double-free")) {
    free(p);
    free((char *)dangling);
  } else if (!strcmp(mode, "overflow")) {
    dangling[n] = 3;
  } else if (!strcmp(mode, "underflow")) {
    dangling[-1] = 3;
  } else if (!strcmp(mode, "invalid-free")) {
    char *volatile interior = (char *)dangling + 8;
    free(interior);
  } else if (!strcmp(mode, "own-mprotect")) {
    /* the program's own protection of a page of a live chunk: no error of
     * qmalloc's, and its report must not say so */
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    char *page = (char *)(((uintptr_t)p + 2 * pg - 1) & ~(uintptr_t)(pg - 1));
    if (mprotect(page, pg, PROT_NONE))
      return 1;
    ((volatile char *)page)[5] = 4;
  } else if (!strcmp(mode, "enomem")) {
    errno = 0;
    void *q = malloc((size_t)1 << 45);
    volatile size_t count = SIZE_MAX / 4;
    void *r = calloc(count, 8);
    if (q || r || errno != ENOMEM)
      return 1;
    printf("NULL with ENOMEM\n");
  } else if (!strcmp(mode, "raise")) {
    free(p); /* qmalloc's SIGSEGV handler is in place by now */
    raise(SIGSEGV);
    printf("still alive after raise(SIGSEGV)\n");
    return 1;
  } else if (!strcmp(mode, "threads")) {
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
      pthread_create(&t[i], NULL, churn, (void *)(uintptr_t)(i + 1));
    for (int i = 0; i < 4; i++) {
      void *r;
      pthread_join(t[i], &r);
      if (r)
        return 1;
    }
    printf("threads done\n");
  } else {
    fprintf(stderr, "prog: unknown mode %s\n", mode);
    return 2;
  }
  if (!strcmp(mode, "enomem") || !strcmp(mode, "threads"))
    free(p);
  return 0;
}
