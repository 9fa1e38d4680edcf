/* fork_edges.c: fork at the edges of the process model, as a server meets
 * them; built plain (run with libqmalloc.so preloaded) and linked with
 * -lqmalloc. Each mode must end by itself: a deadlock is the test's timeout.
 *   signal N    one thread churns small and large chunks while SIGALRM's
 *               handler forks N times (a handler that interrupted malloc or
 *               free); each child finishes the interrupted call, churns on
 *               and exits 0. At most 420 s, under the test's timeout: on a
 *               loaded machine each fork and its child's run wait their
 *               turn for a CPU (10,000 forks took 395 s at load 9, 80 s
 *               quiet); it then ends early, saying so, and fewer than 200
 *               forks prove too little and fail
 *   stdio S     for S seconds, main forks while threads run getline,
 *               fflush(NULL) and realloc: stdio's locks and the allocator's
 *               must never form a cycle
 *   exited R    R rounds: a thread allocates chunks and exits, another frees
 *               them (frees sent to a closed owner id) while main forks;
 *               each child frees some of the same chunks and allocates
 * Exit 0, or 1 with a line naming what failed.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void fail(const char *what, long n) {
  fprintf(stderr, "fork_edges: %s (%ld)\n", what, n);
  exit(1);
}

/* Waits for child pid (async-signal-safe); true if it exited 0. */
static bool reap(pid_t pid) {
  int st = 0;
  pid_t r;
  while ((r = waitpid(pid, &st, 0)) < 0 && errno == EINTR)
    ;
  return r == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

/* One step of a churn over v[n]: a burst of one class now and then (the
 * central lists' locks), a large chunk every 61st (the secondary's). */
static void churn_step(void **v, unsigned n, unsigned *i) {
  unsigned k = *i % n;
  size_t size = *i % 61 == 0 ? (size_t)(128u << 10) + (*i % 7) * 4096 : 8 + (*i * 37) % 1500;
  free(v[k]);
  v[k] = malloc(size);
  if (!v[k])
    fail("malloc failed", (long)size);
  memset(v[k], 0x5a, size < 64 ? size : 64);
  ++*i;
}

/* ---- signal ---- */

#define SIG_N 512
static void *sig_v[SIG_N];
static volatile sig_atomic_t in_child, forks, bad_child;

/* A one-shot timer, re-armed after each fork at another delay: the handler
 * lands at ever other points of the churn, not where it returned. */
static void arm(void) {
  struct itimerval it = {{0, 0}, {0, 20 + (forks * 7919) % 300}};
  setitimer(ITIMER_REAL, &it, NULL);
}

static void on_alarm(int sig) {
  (void)sig;
  if (in_child)
    return;
  int saved = errno;
  pid_t pid = fork();
  if (pid == 0) {
    /* back to the interrupted call, which must finish in this child too */
    in_child = 1;
    errno = saved;
    return;
  }
  if (pid < 0 || !reap(pid))
    bad_child = 1;
  forks++;
  arm();
  errno = saved;
}

#define SIG_MAX_S 420
static int mode_signal(long n) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_alarm;
  sigaction(SIGALRM, &sa, NULL);
  time_t end = time(NULL) + SIG_MAX_S;
  arm();
  unsigned i = 0;
  while (forks < n && !bad_child && (i % 256 || time(NULL) < end)) {
    churn_step(sig_v, SIG_N, &i);
    if (in_child) {
      /* the child (which inherits no timer): its allocator whole */
      for (unsigned j = 0; j < 100; j++)
        churn_step(sig_v, SIG_N, &i);
      for (unsigned j = 0; j < SIG_N; j++)
        free(sig_v[j]);
      _exit(0);
    }
  }
  struct itimerval off = {{0, 0}, {0, 0}};
  setitimer(ITIMER_REAL, &off, NULL);
  if (bad_child)
    fail("a child of a fork from the signal handler failed after forks", forks);
  if (forks < 200)
    fail("too few forks from the handler to prove anything", forks);
  for (unsigned j = 0; j < SIG_N; j++)
    free(sig_v[j]);
  printf("fork_edges: signal: %ld forks from the handler, every child whole%s\n", (long)forks,
         forks < n ? " (ended at the time bound)" : "");
  return 0;
}

/* ---- stdio ---- */

static atomic_bool stop;
static FILE *lines; /* shared by the getline threads: its FILE lock */

static void *reader(void *arg) {
  (void)arg;
  while (!atomic_load(&stop)) {
    char *buf = NULL; /* a fresh buffer each line: getline's mallocs and reallocs */
    size_t cap = 0;
    ssize_t got = getline(&buf, &cap, lines);
    if (got < 0) {
      flockfile(lines);
      rewind(lines);
      funlockfile(lines);
    }
    free(buf);
  }
  return NULL;
}

static void *flusher(void *arg) {
  (void)arg;
  while (!atomic_load(&stop))
    fflush(NULL); /* stdio's list lock, then each FILE's */
  return NULL;
}

static void *reallocer(void *arg) {
  (void)arg;
  void *p = NULL;
  unsigned i = 0;
  while (!atomic_load(&stop)) {
    size_t n = i % 50 == 49 ? (size_t)(300u << 10) : 16 + (i * 131) % 4000;
    void *q = realloc(p, n);
    if (!q)
      fail("realloc failed", (long)n);
    p = q;
    i++;
  }
  free(p);
  return NULL;
}

static int mode_stdio(long seconds) {
  /* lines of every length, some past the large threshold */
  lines = tmpfile();
  if (!lines)
    fail("tmpfile failed", errno);
  for (unsigned l = 0; l < 400; l++) {
    size_t len = l % 40 == 39 ? (size_t)(200u << 10) : 1 + (l * 97) % 3000;
    for (size_t k = 0; k < len; k++)
      fputc('a' + (int)(k % 26), lines);
    fputc('\n', lines);
  }
  rewind(lines);
  pthread_t t[5];
  void *(*fn[5])(void *) = {reader, reader, flusher, flusher, reallocer};
  for (int k = 0; k < 5; k++)
    if (pthread_create(&t[k], NULL, fn[k], NULL))
      fail("pthread_create failed", k);
  time_t end = time(NULL) + seconds;
  long n = 0;
  while (time(NULL) < end) {
    pid_t pid = fork();
    if (pid < 0)
      fail("fork failed", errno);
    if (pid == 0) {
      /* the child's allocator and stdio both usable */
      void *v[64];
      for (unsigned k = 0; k < 64; k++)
        v[k] = malloc(k % 16 == 15 ? (size_t)(256u << 10) : 24 + k * 40);
      for (unsigned k = 0; k < 64; k++)
        free(v[k]);
      char *s = NULL;
      if (asprintf(&s, "%ld", n) < 0)
        _exit(2);
      free(s);
      fflush(NULL);
      _exit(0);
    }
    if (!reap(pid))
      fail("a child of the fork storm failed in round", n);
    n++;
  }
  atomic_store(&stop, true);
  for (int k = 0; k < 5; k++)
    pthread_join(t[k], NULL);
  printf("fork_edges: stdio: %ld forks while threads ran getline, fflush and realloc\n", n);
  return 0;
}

/* ---- exited ---- */

#define EX_N 5000
static void *ex_v[EX_N];
static atomic_uint ex_done; /* chunks the freeing thread has freed */

static void *ex_alloc(void *arg) {
  (void)arg;
  for (unsigned k = 0; k < EX_N; k++)
    if (!(ex_v[k] = malloc(16 + (k % 50) * 16)))
      fail("malloc failed", k);
  return NULL; /* exits: its owner id closes */
}

static void *ex_free(void *arg) {
  (void)arg;
  for (unsigned k = 0; k < EX_N; k++) {
    free(ex_v[k]);
    atomic_store(&ex_done, k + 1);
  }
  return NULL;
}

static int mode_exited(long rounds) {
  for (long r = 0; r < rounds; r++) {
    pthread_t a, f;
    if (pthread_create(&a, NULL, ex_alloc, NULL))
      fail("pthread_create failed", r);
    pthread_join(a, NULL);
    atomic_store(&ex_done, 0);
    if (pthread_create(&f, NULL, ex_free, NULL))
      fail("pthread_create failed", r);
    for (unsigned k = 0; k < 2; k++) {
      /* while the other thread is freeing: a third of the way, then two */
      while (atomic_load(&ex_done) < (k + 1) * EX_N / 3)
        sched_yield();
      pid_t pid = fork();
      if (pid < 0)
        fail("fork failed", errno);
      if (pid == 0) {
        /* chunks the other thread had not reached: sent to the closed id */
        unsigned from = atomic_load(&ex_done) + 1;
        for (unsigned j = from; j < EX_N && j < from + 300; j++)
          free(ex_v[j]);
        void *p = malloc(100);
        free(p);
        _exit(0);
      }
      if (!reap(pid))
        fail("a child failed in round", r);
    }
    pthread_join(f, NULL);
  }
  printf("fork_edges: exited: %ld rounds of frees to exited threads' chunks across fork\n", rounds);
  return 0;
}

int main(int argc, char **argv) {
  if (argc != 3)
    fail("usage: fork_edges signal|stdio|exited N", argc);
  long n = strtol(argv[2], NULL, 10);
  if (!strcmp(argv[1], "signal"))
    return mode_signal(n);
  if (!strcmp(argv[1], "stdio"))
    return mode_stdio(n);
  if (!strcmp(argv[1], "exited"))
    return mode_exited(n);
  fail("unknown mode", 0);
  return 1;
}
