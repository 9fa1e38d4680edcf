/* attack.c: one heap attack per subcommand, each the first thing a hostile
 * program (or a bad bug) would try against the small-chunk heap. Built
 * twice, plain (run under LD_PRELOAD) and linked with libqmalloc; the suite
 * in meson.build asserts how each ends: the signal and the exact report.
 * A subcommand that returns normally means the attack went unnoticed.
 */
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* Keeps the compiler from reasoning about the heap: it must not drop a
 * store to freed memory or fold a malloc/free pair. */
static void *volatile sink;
static void *opaque(void *p) {
  sink = p;
  return sink;
}

static int header_flip(void) { /* the 2-bit write that re-armed a freed chunk */
  unsigned char *p = opaque(malloc(32));
  free(p);
  p[-6] ^= 3; /* the header word's state bits: FREE -> ALLOC */
  free(p);
  return 0;
}

static int guard_flip(void) {
  unsigned char *p = opaque(malloc(32));
  free(p);
  p[-14] ^= 3;
  free(p);
  return 0;
}

static int header_overwrite(void) {
  unsigned char *p = opaque(malloc(48));
  memset(p - 8, 0x41, 8);
  free(p);
  return 0;
}

static int guard_overwrite(void) {
  unsigned char *p = opaque(malloc(48));
  memset(p - 16, 0x41, 8);
  free(p);
  return 0;
}

/* Re-arming a freed chunk with the 16 header bytes of a live one of the
 * same size: the checksum is keyed by the chunk's address, so a header
 * copied from elsewhere is not valid here. */
static int header_replay(void) {
  unsigned char *live = opaque(malloc(32)), *p = opaque(malloc(32));
  free(p);
  memcpy(p - 16, live - 16, 16);
  free(p);
  return 0;
}

/* A valid header of a 48-byte chunk laid over a 64-byte one's: keyed by
 * another class region's key (and address), it forges nothing there. */
static int header_cross_class(void) {
  unsigned char *a = opaque(malloc(48)), *b = opaque(malloc(64));
  memcpy(b - 16, a - 16, 16);
  free(b);
  return 0;
}

/* n bytes asked for, k written past them, with value v */
static int overflow(size_t n, size_t k, int v) {
  unsigned char *p = opaque(malloc(n));
  memset(p, 'x', n);
  memset(p + n, v, k);
  free(p);
  return 0;
}

static pthread_barrier_t bar;
static void *racer(void *p) {
  pthread_barrier_wait(&bar);
  free(p);
  return NULL;
}

/* Two threads free one pointer at the same instant, in a fresh child per
 * trial; every child must die of SIGABRT: a child that exits normally had
 * both frees accepted. */
static int racing_double_free(int trials) {
  for (int t = 0; t < trials; t++) {
    pid_t pid = fork();
    if (pid < 0)
      return 2;
    if (!pid) {
      void *p = opaque(malloc(64));
      pthread_t a, b;
      pthread_barrier_init(&bar, NULL, 2);
      pthread_create(&a, NULL, racer, p);
      pthread_create(&b, NULL, racer, p);
      pthread_join(a, NULL);
      pthread_join(b, NULL);
      _exit(0);
    }
    int st;
    waitpid(pid, &st, 0);
    if (!WIFSIGNALED(st) || WTERMSIG(st) != SIGABRT) {
      fprintf(stderr, "attack: trial %d: both frees accepted\n", t);
      return 1;
    }
  }
  fprintf(stderr, "attack: %d trials, every one aborted\n", trials);
  return 0;
}

/* The lowest 16-byte chunk, then a write of 200 bytes below it: where the
 * first metadata mapping used to sit. */
static int underflow_low(void) {
  unsigned char *low = NULL;
  for (int i = 0; i < 64; i++) {
    unsigned char *p = opaque(malloc(16));
    if (!low || p < low)
      low = p;
  }
  memset(low - 200, 0x41, 200);
  free(low);
  return 0;
}

static int zero_access(int write) {
  volatile unsigned char *p = opaque(malloc(0));
  if (write)
    p[0] = 1;
  else
    sink = (void *)(uintptr_t)p[0];
  return 0;
}

static int zero_unique(void) {
  void *a = opaque(malloc(0)), *b = opaque(malloc(0));
  if (!a || !b || a == b)
    return 1;
  free(a);
  free(b);
  free(a); /* a double free of one of them */
  return 0;
}

static int interior_free(void) {
  unsigned char *p = opaque(malloc(100));
  free(p + 48);
  return 0;
}

/* A header copied from a live chunk into the middle of another one, and
 * that address freed: the key and address in the checksum stop it. */
static int forged_header(void) {
  unsigned char *a = opaque(malloc(256)), *b = opaque(malloc(64));
  memcpy(a + 64, b - 16, 16);
  free(a + 80);
  return 0;
}

/* An address inside qmalloc's own metadata: the 1 MiB read-write mapping
 * between two guard pages. */
static int metadata_free(void) {
  free(opaque(malloc(24))); /* the thread cache exists now */
  FILE *f = fopen("/proc/self/maps", "r");
  char line[512], prev[8] = "";
  unsigned long plo = 0, phi = 0, lo, hi, target = 0;
  while (f && fgets(line, sizeof line, f)) {
    char prot[8];
    if (sscanf(line, "%lx-%lx %7s", &lo, &hi, prot) != 3)
      continue;
    if (!strcmp(prev, "rw-p") && phi - plo == (1ul << 20) && !strcmp(prot, "---p") && lo == phi)
      target = plo;
    memcpy(prev, prot, sizeof prev);
    plo = lo;
    phi = hi;
  }
  if (f)
    fclose(f);
  if (!target)
    return 3;
  free((void *)(target + 64));
  return 0;
}

static int stack_free(void) {
  char buf[32];
  free(opaque(buf + 16));
  return 0;
}

static int plain_double_free(void) {
  void *p = opaque(malloc(40));
  free(p);
  free(p);
  return 0;
}

/* Written after free, then handed out again: hardening=max zeroes freed
 * chunks and checks them at the next malloc. */
static int write_after_free(void) {
  unsigned char *p = opaque(malloc(64));
  free(p);
  p[5] = 1;
  for (int i = 0; i < 100000; i++)
    if (opaque(malloc(64)) == p)
      return 0;
  return 4;
}

static int realloc_freed(void) {
  void *p = opaque(malloc(72));
  free(p);
  sink = realloc(p, 80);
  return 0;
}

/* Two neighbouring chunks; the second freed, then its header overwritten
 * from the first without touching the first one's canary (a write that
 * skips ahead, or through a stale pointer): the first one's free checks
 * its neighbours in hardening=max. */
static int neighbour_header(void) {
  unsigned char *c[32];
  size_t n = 2000;
  for (int i = 0; i < 32; i++)
    c[i] = opaque(malloc(n));
  size_t step = SIZE_MAX;
  for (int i = 0; i < 32; i++)
    for (int j = 0; j < 32; j++)
      if (c[j] > c[i] && (size_t)(c[j] - c[i]) < step)
        step = (size_t)(c[j] - c[i]);
  for (int i = 0; i < 32; i++)
    for (int j = 0; j < 32; j++)
      if (c[j] == c[i] + step) {
        free(c[j]);
        memset(c[i] + step - 8, 0x41, 4); /* b's header word, not a's canary */
        free(c[i]);
        return 0;
      }
  return 6;
}

/* A handler installed after qmalloc's that passes on the faults it does not
 * own, as JITs and crash reporters do: a fault nobody owns must still kill
 * the process, not retry for ever. */
static struct sigaction chained;
static void passing_handler(int sig, siginfo_t *si, void *ctx) {
  if (chained.sa_flags & SA_SIGINFO)
    chained.sa_sigaction(sig, si, ctx);
}
static int chained_handler(void) {
  free(opaque(malloc(200000))); /* qmalloc's handler is in place now */
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = passing_handler;
  sa.sa_flags = SA_SIGINFO;
  sigaction(SIGSEGV, &sa, &chained);
  if (!(chained.sa_flags & SA_SIGINFO))
    return 5; /* nothing to chain to */
  alarm(20);  /* a loop would end here, as SIGALRM */
  *(volatile int *)opaque(NULL) = 1;
  return 0;
}

int main(int argc, char **argv) {
  const char *m = argc > 1 ? argv[1] : "";
  if (!strcmp(m, "header-flip"))
    return header_flip();
  if (!strcmp(m, "guard-flip"))
    return guard_flip();
  if (!strcmp(m, "header-overwrite"))
    return header_overwrite();
  if (!strcmp(m, "guard-overwrite"))
    return guard_overwrite();
  if (!strcmp(m, "header-replay"))
    return header_replay();
  if (!strcmp(m, "header-cross-class"))
    return header_cross_class();
  if (!strcmp(m, "overflow-1"))
    return overflow(20, 1, 'A');
  if (!strcmp(m, "overflow-8"))
    return overflow(20, 8, 'A');
  if (!strcmp(m, "overflow-nul"))
    return overflow(40, 1, 0);
  if (!strcmp(m, "overflow-full-1"))
    return overflow(32, 1, 'A');
  if (!strcmp(m, "overflow-full-8"))
    return overflow(32, 8, 'A');
  if (!strcmp(m, "overflow-short-8"))
    return overflow(27, 8, 'A'); /* 5 bytes of room, 3 more in the next chunk */
  if (!strcmp(m, "racing-double-free"))
    return racing_double_free(argc > 2 ? atoi(argv[2]) : 200);
  if (!strcmp(m, "underflow-low"))
    return underflow_low();
  if (!strcmp(m, "zero-write"))
    return zero_access(1);
  if (!strcmp(m, "zero-read"))
    return zero_access(0);
  if (!strcmp(m, "zero-unique"))
    return zero_unique();
  if (!strcmp(m, "interior-free"))
    return interior_free();
  if (!strcmp(m, "forged-header"))
    return forged_header();
  if (!strcmp(m, "metadata-free"))
    return metadata_free();
  if (!strcmp(m, "stack-free"))
    return stack_free();
  if (!strcmp(m, "double-free"))
    return plain_double_free();
  if (!strcmp(m, "write-after-free"))
    return write_after_free();
  if (!strcmp(m, "neighbour-header"))
    return neighbour_header();
  if (!strcmp(m, "chained-handler"))
    return chained_handler();
  if (!strcmp(m, "realloc-freed"))
    return realloc_freed();
  fprintf(stderr, "attack: unknown attack '%s'\n", m);
  return 2;
}
