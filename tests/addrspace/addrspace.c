/* addrspace.c: the address space qmalloc holds, seen from a program that
 * knows nothing of it (run plain, preloaded, or linked with it).
 *   vmsize: one malloc of each kind (small, zero-size, sampled where the
 *     options sample, large), then prints VmSize in KiB: addrspace.sh
 *     compares it with the same program under glibc.
 *   rlimit: lowers RLIMIT_AS to 200 MiB in all after start, creates 8
 *     threads that allocate small and large chunks until the limit answers;
 *     every failure must be NULL with ENOMEM (EAGAIN from pthread_create).
 *     Exits 0 if so, 1 naming what went wrong.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

static long vm_kib(void) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  long kib = -1;
  while (f && fgets(line, sizeof line, f))
    if (!strncmp(line, "VmSize:", 7))
      kib = strtol(line + 7, NULL, 10);
  if (f)
    fclose(f);
  return kib;
}

static int vmsize(void) {
  char *volatile small = malloc(16), *volatile zero = malloc(0), *volatile large = malloc(1 << 20);
  if (!small || !zero || !large)
    return 1;
  small[0] = 1;
  large[0] = 1;
  /* enough small mallocs that sampling at a rate of 1 in 64 takes some */
  for (int i = 0; i < 256; i++) {
    char *volatile s = malloc(100);
    s[0] = 1;
    free(s);
  }
  printf("%ld\n", vm_kib());
  free(small);
  free(zero);
  free(large);
  return 0;
}

#define THREADS 8
#define KEEP 200000

static _Atomic int bad;

static void fail(const char *what, size_t n) {
  fprintf(stderr, "addrspace: %s of %zu bytes failed with errno %d (%s), not ENOMEM\n", what, n,
          errno, strerror(errno));
  bad = 1;
}

/* Small and large chunks, kept, until each size has met the limit. */
static void *churn(void *arg) {
  unsigned seed = (unsigned)(size_t)arg;
  void **keep = calloc(KEEP, sizeof *keep);
  if (!keep) {
    if (errno != ENOMEM)
      fail("calloc", KEEP * sizeof *keep);
    return NULL;
  }
  size_t n = 0;
  int small_done = 0, large_done = 0;
  while (n < KEEP && !(small_done && large_done)) {
    seed = seed * 1103515245u + 12345u;
    int large = !large_done && (small_done || seed % 16 == 0);
    size_t sz = large ? (size_t)(256 << 10) + seed % (4 << 20) : 1 + seed % 4000;
    errno = 0;
    char *p = malloc(sz);
    if (!p) {
      if (errno != ENOMEM)
        fail("malloc", sz);
      if (large)
        large_done = 1;
      else
        small_done = 1;
      continue;
    }
    p[0] = 1;
    p[sz - 1] = 1;
    keep[n++] = p;
  }
  /* some back, and the allocator still answers within what is left */
  for (size_t i = 0; i < n; i += 2)
    free(keep[i]);
  for (size_t i = 0; i < n; i += 2) {
    errno = 0;
    keep[i] = malloc(64);
    if (!keep[i] && errno != ENOMEM)
      fail("malloc after frees", 64);
  }
  for (size_t i = 0; i < n; i++)
    free(keep[i]);
  free(keep);
  return NULL;
}

static int rlimit(void) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_AS, &rl))
    return 1;
  long now = vm_kib();
  rl.rlim_cur = (rlim_t)200 << 20;
  if (now < 0 || (rlim_t)now << 10 >= rl.rlim_cur) {
    fprintf(stderr, "addrspace: VmSize %ld KiB at start, over the 200 MiB limit\n", now);
    return 1;
  }
  if (setrlimit(RLIMIT_AS, &rl))
    return 1;
  pthread_t t[THREADS];
  int made[THREADS] = {0}, threads = 0;
  for (int i = 0; i < THREADS; i++) {
    int err = pthread_create(&t[i], NULL, churn, (void *)(size_t)(i + 1));
    if (err && err != EAGAIN) {
      fprintf(stderr, "addrspace: pthread_create: %s\n", strerror(err));
      bad = 1;
    }
    made[i] = !err;
    threads += !err;
  }
  for (int i = 0; i < THREADS; i++)
    if (made[i])
      pthread_join(t[i], NULL);
  churn((void *)(size_t)99); /* the main thread too, all others gone */
  fprintf(stderr, "addrspace: %d of %d threads made, VmSize at start %ld KiB, at the end %ld KiB\n",
          threads, THREADS, now, vm_kib());
  return bad;
}

int main(int argc, char **argv) {
  if (argc == 2 && !strcmp(argv[1], "vmsize"))
    return vmsize();
  if (argc == 2 && !strcmp(argv[1], "rlimit"))
    return rlimit();
  fprintf(stderr, "usage: %s vmsize|rlimit\n", argv[0]);
  return 2;
}
