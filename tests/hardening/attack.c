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
#include <sys/mman.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "qmalloc.h"

/* The attacks that end in a report: exported (the programs are linked with
 * -rdynamic) and never inlined, so that the report's SUMMARY line names
 * each as the offending frame, which the suite checks. */
#define ATTACK __attribute__((noinline, visibility("default")))
ATTACK int before_flip(int at);
ATTACK int before_overwrite(void);
ATTACK int header_replay(void);
ATTACK int header_transplant(void);
ATTACK int header_cross_class(void);
ATTACK int canary_leak(void);
ATTACK int overflow(size_t n, size_t k, int v);
ATTACK int underflow_low(void);
ATTACK int zero_access(int write);
ATTACK int zero_unique(void);
ATTACK int interior_free(void);
ATTACK int forged_header(void);
ATTACK int metadata_free(void);
ATTACK int stack_free(void);
ATTACK int plain_double_free(void);
ATTACK int write_after_free(void);
ATTACK int realloc_freed(void);
ATTACK int neighbour_canary(void);

/* The attacks are on ordinary small chunks. About 1 in sample_rate
 * (200,000) small mallocs, at random, gets a guarded slot instead, which
 * ends flush against a guard page and reports an overflow by the fault,
 * not by the canary the suite expects: such a chunk is kept (freed, it
 * could come back) and the malloc made again. qmalloc's stats say which:
 * weak, so that the plain program finds them in the preloaded library.
 * (Before: a sampled 32-byte chunk ended overflow-full-8-max in SIGSEGV.) */
#pragma weak qm_stats
/* inlined: a report's first frame must be the attack's own */
static inline __attribute__((always_inline)) void *plain_malloc(size_t n) {
  for (int tries = 0;; tries++) {
    qm_stats_t a, b;
    if (!qm_stats || tries == 100) /* not qmalloc, or every chunk guarded */
      return malloc(n);
    qm_stats(&a);
    void *p = malloc(n);
    qm_stats(&b);
    if (b.guarded_allocs == a.guarded_allocs)
      return p;
  }
}
#define malloc(n) plain_malloc(n)

/* Keeps the compiler from reasoning about the heap: it must not drop a
 * store to freed memory or fold a malloc/free pair. */
static void *volatile sink;
static void *opaque(void *p) {
  sink = p;
  return sink;
}

/* The higher of two fresh chunks of n bytes: the 16 bytes below it are in
 * its class region (the lower one may be the region's first chunk). */
static unsigned char *not_first(size_t n) {
  unsigned char *a = opaque(malloc(n)), *b = opaque(malloc(n));
  return a > b ? a : b;
}

/* Where the header used to be, bits flipped after the free (FREE -> ALLOC
 * in the old layout): state is out of band, the second free aborts. */
ATTACK int before_flip(int at) {
  unsigned char *p = not_first(32);
  free(p);
  p[at] ^= 3;
  free(p);
  return 0;
}

/* The 16 bytes before a live chunk overwritten, then freed twice. */
ATTACK int before_overwrite(void) {
  unsigned char *p = not_first(48);
  memset(p - 16, 0x41, 16);
  free(p);
  free(p);
  return 0;
}

/* Header replay: the 16 bytes before a live chunk read, written back after
 * its free (or the same through a neighbour's over-read and overflow):
 * they are the neighbour's bytes, not state; the second free aborts. */
ATTACK int header_replay(void) {
  unsigned char *p = not_first(32), saved[16];
  memcpy(saved, p - 16, 16);
  free(p);
  memcpy(p - 16, saved, 16);
  free(p);
  return 0;
}

/* Header transplant: the words before a freed chunk, XORed with the state
 * and offset bits of the old header (0x30000, 1 << 18), laid before a live
 * chunk, whose address + 16 is then freed: nothing there is read, and the
 * table says the chunk's pointer is its start. */
ATTACK int header_transplant(void) {
  unsigned char *a = not_first(32), *b = not_first(32);
  uint64_t w[2];
  free(a);
  memcpy(w, a - 16, 16);
  w[1] ^= 0x30000 + (1u << 18);
  memcpy(b - 16, w, 16);
  free(b + 16);
  return 0;
}

/* A valid chunk's 16 preceding bytes laid before one of another class. */
ATTACK int header_cross_class(void) {
  unsigned char *a = not_first(48), *b = not_first(64);
  memcpy(b - 16, a - 16, 16);
  free(b);
  free(b);
  return 0;
}

/* Canary leak: an unterminated string read past a chunk stops inside its
 * canary (byte 1 is zero) having leaked one byte; even the whole canary of
 * one chunk, read by a wider over-read, is not another's: an overflow of a
 * second chunk that writes the first one's canary over its own aborts. */
ATTACK int canary_leak(void) {
  char *a = (char *)not_first(24), *b = (char *)not_first(24);
  memset(a, 'x', 24);
  if (strlen(a) != 25)
    return 7;
  unsigned char leaked[8];
  memcpy(leaked, a + 24, 8);
  memset(b, 'y', 24);
  memcpy(b + 24, leaked, 8);
  free(a);
  free(b);
  return 0;
}

/* Runs child(t) in a fresh process: 0 if it died of SIGABRT, 3 if it saw
 * no chance to attack (it exits 3 when no signal landed: inconclusive), 1
 * if it lived on (both frees were accepted), 2 if it could not be run. */
static int one_trial(int t, void (*child)(int t)) {
  pid_t pid = fork();
  if (pid < 0)
    return 2;
  if (!pid)
    child(t);
  int st;
  if (waitpid(pid, &st, 0) != pid)
    return 2;
  if (WIFEXITED(st) && WEXITSTATUS(st) == 3)
    return 3;
  if (WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT)
    return 0;
  fprintf(stderr, "attack: trial %d: both frees accepted\n", t);
  return 1;
}

/* Every trial must die of SIGABRT; at most a tenth may be inconclusive. */
static int every_trial_aborts(int trials, void (*child)(int t)) {
  int inconclusive = 0;
  for (int t = 0; t < trials; t++) {
    int r = one_trial(t, child);
    if (r == 3)
      inconclusive++;
    else if (r)
      return r;
  }
  if (inconclusive > trials / 10) {
    fprintf(stderr, "attack: %d of %d trials had no signal during a free\n", inconclusive, trials);
    return 1;
  }
  fprintf(stderr, "attack: %d trials, every one aborted\n", trials);
  if (inconclusive)
    fprintf(stderr, "attack: (%d without a signal during a free)\n", inconclusive);
  return 0;
}

/* One trial whose report the suite checks whole (its kind and offending
 * frame): children are run until one is conclusive (at most 100), and a
 * child that aborted is answered by this process aborting too, its report
 * being the last thing on the shared stderr (an inconclusive child prints
 * nothing). */
static int one_trial_reported(void (*child)(int t)) {
  for (int t = 0; t < 100; t++) {
    int r = one_trial(t, child);
    if (r == 3)
      continue;
    if (r)
      return r;
    signal(SIGABRT, SIG_DFL);
    raise(SIGABRT);
  }
  fprintf(stderr, "attack: 100 trials had no signal during a free\n");
  return 1;
}

/* Signal re-entry: a free interrupted by a signal whose handler frees the
 * same pointer. The child frees one chunk after another, each named in
 * `sig_target` only while it is being freed; a timer fires every 20 us and its
 * handler frees the target if there is one, so most of the signals that
 * find a target land inside that free. Once the handler has freed a
 * target, the child must abort (the handler's free or the interrupted one
 * reports); a child that lives on had both frees accepted. One fresh child
 * per trial. */
static void *volatile sig_target;
static volatile sig_atomic_t fired;
/* the frames a report names: the handler's free, or the interrupted one */
ATTACK void free_target(int sig);
ATTACK void signal_double_free_child(int t);
void free_target(int sig) {
  (void)sig;
  void *q = sig_target;
  if (q) {
    sig_target = NULL;
    free(q);
    fired = 1;
  }
}
void signal_double_free_child(int t) {
  (void)t;
  signal(SIGALRM, free_target);
  struct itimerval it = {{0, 20}, {0, 20}};
  setitimer(ITIMER_REAL, &it, NULL);
  for (long i = 0; i < 20000000 && !fired; i++) {
    void *p = opaque(malloc(64));
    sig_target = p;
    free(p);
    sig_target = NULL;
  }
  /* the chunk freed twice is handed out again: both frees accepted */
  for (int i = 0; i < 1000; i++)
    free(opaque(malloc(64)));
  _exit(fired ? 0 : 3);
}
static int signal_double_free(const char *trials) {
  if (trials && !strcmp(trials, "report"))
    return one_trial_reported(signal_double_free_child);
  return every_trial_aborts(trials ? atoi(trials) : 200, signal_double_free_child);
}

/* Signal re-entry split in two: a handler frees the victim while the
 * program is inside (or around) the free or malloc of other chunks, and the
 * program frees the victim again afterwards. The handler's free must count
 * at once, even when it landed inside another free: every child must die
 * of SIGABRT at the program's free (none may go on with the victim live
 * twice). */
static void *volatile split_victim;
static volatile sig_atomic_t split_handled;
static void free_split_victim(int sig) {
  (void)sig;
  free(split_victim);
  split_handled = 1;
}
static void signal_split_free_child(int t) {
  signal(SIGALRM, free_split_victim);
  srand((unsigned)t * 2654435761u);
  for (int i = 0; i < 1000; i++)
    free(opaque(malloc(48)));
  split_victim = opaque(malloc(48));
  struct itimerval it = {{0, 0}, {0, 1 + rand() % 40}};
  setitimer(ITIMER_REAL, &it, NULL);
  for (long spin = 0; !split_handled && spin < 200000000L; spin++)
    free(opaque(malloc(48)));
  free(split_victim);
  _exit(0);
}
static int signal_split_free(int trials) {
  return every_trial_aborts(trials, signal_split_free_child);
}

/* A free from a signal handler landing inside the flush of the parked
 * frees that fork's prepare handler runs. The signal is made to land there
 * every time: the canary of the first parked chunk sits on a page made
 * PROT_NONE, so the flush's canary load faults, and the SIGSEGV handler
 * restores the page and frees one more chunk, the 32nd parked since the
 * ring was last emptied (by an earlier fork). No chunk may then be handed
 * out twice; exits 1 if one is. In checked mode nothing is parked and the
 * flush takes no fault. */
static unsigned char *flush_page;
static void *flush_extra;
static volatile sig_atomic_t flush_faults;
static void flush_segv(int sig, siginfo_t *si, void *uc) {
  (void)sig, (void)si, (void)uc;
  flush_faults++;
  mprotect(flush_page, 4096, PROT_READ | PROT_WRITE);
  free(flush_extra);
}
/* Makes the page holding at PROT_NONE, with handler h for its fault
 * (which must make it accessible again); returns the page. */
static unsigned char *trap_page(const void *at, void (*h)(int, siginfo_t *, void *)) {
  unsigned char *page = (unsigned char *)((uintptr_t)at & ~(uintptr_t)4095);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = h;
  sa.sa_flags = SA_SIGINFO;
  sigaction(SIGSEGV, &sa, NULL);
  mprotect(page, 4096, PROT_NONE);
  return page;
}
static void fork_and_wait(void) {
  pid_t pid = fork();
  if (!pid)
    _exit(0);
  if (pid > 0)
    waitpid(pid, NULL, 0);
}
static int signal_in_flush(void) {
  enum { N = 64, PARKED = 31, SIZE = 48 };
  unsigned char *p[N], *q[N];
  for (int i = 0; i < N; i++)
    p[i] = opaque(malloc(SIZE));
  flush_extra = opaque(malloc(SIZE));
  fork_and_wait(); /* nothing parked from here on */
  for (int i = 0; i < PARKED; i++)
    free(p[i]);
  flush_page = trap_page(p[0] + SIZE, flush_segv);
  fork_and_wait();
  mprotect(flush_page, 4096, PROT_READ | PROT_WRITE);
  signal(SIGSEGV, SIG_DFL);
  for (int i = 0; i < N; i++) {
    q[i] = opaque(malloc(SIZE));
    for (int j = 0; j < i; j++)
      if (q[j] == q[i]) {
        fprintf(stderr, "attack: %p handed out twice\n", (void *)q[i]);
        return 1;
      }
  }
  fprintf(stderr, "attack: %s, no chunk handed out twice\n",
          flush_faults ? "a handler's free inside the flush" : "no fault in the flush");
  return 0;
}

/* A free from a signal handler of the very chunk realloc is resizing in
 * place. The signal is made to land inside realloc: the canary its check
 * reads sits on a page made PROT_NONE, and the SIGSEGV handler restores
 * the page and frees the chunk. That free must report: left to finish,
 * the resize writes the entry back live over the free, and the chunk is
 * handed out again while realloc's caller holds it (exits 1 if it is). */
static unsigned char *rs_page;
static void *rs_chunk;
static volatile sig_atomic_t rs_freed; /* also keeps the free from being a tail call */
/* the frame a report names: the handler's free */
ATTACK void realloc_segv(int sig, siginfo_t *si, void *uc);
void realloc_segv(int sig, siginfo_t *si, void *uc) {
  (void)sig, (void)si, (void)uc;
  mprotect(rs_page, 4096, PROT_READ | PROT_WRITE);
  free(rs_chunk);
  rs_freed = 1;
}
static int realloc_signal_free(void) {
  enum { SIZE = 200, LESS = 180 }; /* one class: resized in place */
  unsigned char *p = opaque(malloc(SIZE));
  rs_chunk = p;
  rs_page = trap_page(p + SIZE, realloc_segv);
  unsigned char *q = opaque(realloc(p, LESS));
  signal(SIGSEGV, SIG_DFL);
  for (int i = 0; i < 100000; i++)
    if (opaque(malloc(LESS)) == q) {
      fprintf(stderr, "attack: %p handed out again while realloc's caller holds it\n", (void *)q);
      return 1;
    }
  fprintf(stderr, "attack: the handler's free of the chunk under realloc was accepted\n");
  return 1;
}

/* n bytes asked for, k written past them, with value v */
ATTACK int overflow(size_t n, size_t k, int v) {
  unsigned char *p = opaque(malloc(n));
  memset(p, 'x', n);
  memset(p + n, v, k);
  free(p);
  return 0;
}

static pthread_barrier_t bar;
/* the frame a report names: either racer's free */
ATTACK void *racer(void *p);
void *racer(void *p) {
  pthread_barrier_wait(&bar);
  free(p);
  return NULL;
}

/* Two threads free one pointer at the same instant, in a fresh child per
 * trial; every child must die of SIGABRT: a child that exits normally had
 * both frees accepted. */
static void racing_double_free_child(int t) {
  (void)t;
  void *p = opaque(malloc(64));
  pthread_t a, b;
  pthread_barrier_init(&bar, NULL, 2);
  pthread_create(&a, NULL, racer, p);
  pthread_create(&b, NULL, racer, p);
  pthread_join(a, NULL);
  pthread_join(b, NULL);
  _exit(0);
}
static int racing_double_free(const char *trials) {
  if (trials && !strcmp(trials, "report"))
    return one_trial_reported(racing_double_free_child);
  return every_trial_aborts(trials ? atoi(trials) : 200, racing_double_free_child);
}

/* The lowest 16-byte chunk (8 bytes and the canary), then a write of 200 bytes below it: where the
 * first metadata mapping used to sit. */
ATTACK int underflow_low(void) {
  unsigned char *low = NULL;
  for (int i = 0; i < 64; i++) {
    unsigned char *p = opaque(malloc(8));
    if (!low || p < low)
      low = p;
  }
  /* byte stores, not memset: the fault is in this function's own frame */
  for (volatile unsigned char *q = low - 200; q < low; q++)
    *q = 0x41;
  free(low);
  return 0;
}

ATTACK int zero_access(int write) {
  volatile unsigned char *p = opaque(malloc(0));
  if (write)
    p[0] = 1;
  else
    sink = (void *)(uintptr_t)p[0];
  return 0;
}

ATTACK int zero_unique(void) {
  void *a = opaque(malloc(0)), *b = opaque(malloc(0));
  if (!a || !b || a == b)
    return 1;
  free(a);
  free(b);
  free(a); /* a double free of one of them */
  return 0;
}

ATTACK int interior_free(void) {
  unsigned char *p = opaque(malloc(100));
  free(p + 48);
  return 0;
}

/* The bytes before a live chunk copied into the middle of another one, and
 * that address freed: an interior pointer, whatever lies before it. */
ATTACK int forged_header(void) {
  unsigned char *a = opaque(malloc(240)), *b = not_first(64);
  memcpy(a + 64, b - 16, 16);
  free(a + 80);
  return 0;
}

/* An address inside qmalloc's own metadata: the 1 MiB read-write mapping
 * between two guard pages. */
ATTACK int metadata_free(void) {
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

ATTACK int stack_free(void) {
  char buf[32];
  free(opaque(buf + 16));
  return 0;
}

ATTACK int plain_double_free(void) {
  void *p = opaque(malloc(40));
  free(p);
  free(p);
  return 0;
}

/* Written after free, then handed out again: hardening=max zeroes freed
 * chunks and checks them at the next malloc. */
ATTACK int write_after_free(void) {
  unsigned char *p = opaque(malloc(56));
  free(p);
  p[5] = 1;
  for (int i = 0; i < 100000; i++)
    if (opaque(malloc(56)) == p)
      return 0;
  return 4;
}

ATTACK int realloc_freed(void) {
  void *p = opaque(malloc(72));
  free(p);
  sink = realloc(p, 80);
  return 0;
}

/* Two live neighbouring chunks; the second one's canary overwritten from
 * the first without touching the first one's (a write that skips ahead, or
 * through a stale pointer): the first one's free checks its neighbours'
 * canaries in hardening=max. */
ATTACK int neighbour_canary(void) {
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
        memset(c[i] + step + n, 0x41, 4); /* b's canary, not a's */
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
    return before_flip(-6);
  if (!strcmp(m, "guard-flip"))
    return before_flip(-14);
  if (!strcmp(m, "header-overwrite"))
    return before_overwrite();
  if (!strcmp(m, "header-replay"))
    return header_replay();
  if (!strcmp(m, "header-transplant"))
    return header_transplant();
  if (!strcmp(m, "header-cross-class"))
    return header_cross_class();
  if (!strcmp(m, "canary-leak"))
    return canary_leak();
  if (!strcmp(m, "signal-double-free"))
    return signal_double_free(argc > 2 ? argv[2] : NULL);
  if (!strcmp(m, "signal-split-free"))
    return signal_split_free(argc > 2 ? atoi(argv[2]) : 200);
  if (!strcmp(m, "signal-in-flush"))
    return signal_in_flush();
  if (!strcmp(m, "realloc-signal-free"))
    return realloc_signal_free();
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
    return racing_double_free(argc > 2 ? argv[2] : NULL);
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
  if (!strcmp(m, "neighbour-canary"))
    return neighbour_canary();
  if (!strcmp(m, "chained-handler"))
    return chained_handler();
  if (!strcmp(m, "realloc-freed"))
    return realloc_freed();
  fprintf(stderr, "attack: unknown attack '%s'\n", m);
  return 2;
}
