/* mprotect-reuse-check.c: checks, on the running kernel, what qmalloc's
 * companion mprotect patch promises: reused private pages take no write
 * fault after PROT_NONE -> PROT_READ|PROT_WRITE, while pages that must keep
 * their fault (shared with a fork() child, watched by soft-dirty tracking,
 * referenced by a pipe) keep it, and read-only mappings stay read-only.
 * Build: cc -O2 -o mprotect-reuse-check mprotect-reuse-check.c
 * Ends with "N passed, N failed"; exit status 0 only when all passed.
 * With --skip-if-absent (as qmalloc's test suite runs it), a kernel without
 * the fast path skips the checks that need it and the program exits 77
 * (meson's "skipped") unless one of the others failed.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/uio.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#define PG 4096UL
static int npass, nfail, nskip;
/* whether the running kernel has the fast path at all (see has_fast_path()),
 * and whether checks that need it are skipped where it has not */
static int fast_path = 1, skip_if_absent;

static void check(int ok, const char *what, long got, long want) {
  printf("%s %s (got %ld, want %ld)\n", ok ? "PASS" : "FAIL", what, got, want);
  if (ok)
    npass++;
  else
    nfail++;
}

/* A check that only a kernel with the fast path can pass. */
static void check_fast(int ok, const char *what, long got, long want) {
  if (!fast_path && skip_if_absent) {
    printf("SKIP %s (got %ld, want %ld: this kernel has no mprotect fast path)\n", what, got, want);
    nskip++;
    return;
  }
  check(ok, what, got, want);
}

static long minflt(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_minflt;
}

static char *map(size_t n, int shared) {
  char *p = mmap(NULL, n * PG, PROT_READ | PROT_WRITE,
                 (shared ? MAP_SHARED : MAP_PRIVATE) | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    perror("mmap");
    exit(1);
  }
  return p;
}

/* Push the test pages out of this CPU's LRU batch by adding others to it. */
static void flush_lru_batch(void) {
  static char *f;
  if (!f)
    f = map(64, 0);
  madvise(f, 64 * PG, MADV_DONTNEED);
  for (size_t i = 0; i < 64; i++)
    f[i * PG] = 1;
}

/* Same for the per-CPU lazyfree batch that MADV_FREE fills. */
static void flush_lazyfree_batch(void) {
  static char *g;
  if (!g)
    g = map(64, 0);
  for (size_t i = 0; i < 64; i++)
    g[i * PG] = 1;
  madvise(g, 64 * PG, MADV_FREE);
}

static void touch(char *p, size_t n, char v) {
  for (size_t i = 0; i < n; i++)
    p[i * PG] = v;
}

static long cycle_faults(char *p, size_t n, char v) {
  long f;
  if (mprotect(p, n * PG, PROT_NONE) || mprotect(p, n * PG, PROT_READ | PROT_WRITE)) {
    perror("mprotect");
    exit(1);
  }
  f = minflt();
  touch(p, n, v);
  return minflt() - f;
}

static sigjmp_buf jb;
static void on_segv(int sig) {
  (void)sig;
  siglongjmp(jb, 1);
}
static int write_faults_sigsegv(char *p) {
  if (sigsetjmp(jb, 1))
    return 1;
  *(volatile char *)p = 7;
  return 0;
}

static int soft_dirty(void *addr) {
  uint64_t e = 0;
  int fd = open("/proc/self/pagemap", O_RDONLY);
  pread(fd, &e, sizeof(e), ((uintptr_t)addr / PG) * sizeof(e));
  close(fd);
  return (e >> 55) & 1;
}

/* A freshly written page reads back soft-dirty where the kernel tracks it. */
static int soft_dirty_supported(void) {
  char *t = mmap(NULL, PG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  int r;

  if (t == MAP_FAILED)
    return 0;
  t[0] = 1;
  r = soft_dirty(t);
  munmap(t, PG);
  return r;
}

/* The running kernel's version as major * 100 + minor, e.g. 510 for 5.10. */
static int kernel_version(void) {
  struct utsname u;
  int major = 0, minor = 0;

  if (uname(&u) == 0)
    sscanf(u.release, "%d.%d", &major, &minor);
  return major * 100 + minor;
}

static void skip(const char *what, const char *why) { printf("SKIP %s (%s)\n", what, why); }

static void clear_refs(void) {
  int fd = open("/proc/self/clear_refs", O_WRONLY);
  if (fd < 0 || write(fd, "4", 1) != 1) {
    perror("clear_refs");
    exit(1);
  }
  close(fd);
}

/* The probe's test: 16 written pages, this CPU's LRU batch drained (an
 * MADV_DONTNEED of another page starts with lru_add_drain()), then
 * PROT_NONE -> RW and a rewrite. A kernel without the fast path takes one
 * write fault per page. */
static int has_fast_path(long *faults) {
  char *z = map(17, 0);
  madvise(z, 17 * PG, MADV_NOHUGEPAGE);
  touch(z, 16, 1);
  madvise(z + 16 * PG, PG, MADV_DONTNEED);
  *faults = cycle_faults(z, 16, 2);
  munmap(z, 17 * PG);
  return *faults < 16;
}

/* Stays on the CPU it runs on: the LRU batches that flush_lru_batch() and
 * MADV_DONTNEED drain are per CPU, and a move between writing and measuring
 * would leave the test pages in another CPU's batch. */
static void pin_to_this_cpu(void) {
  cpu_set_t one;
  int cpu = sched_getcpu();

  if (cpu < 0)
    return;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  if (sched_setaffinity(0, sizeof(one), &one))
    perror("sched_setaffinity (running unpinned)");
}

static void run(void) {
  const size_t N = 64;
  char name[160];
  long f, want;

  /* 1. the allocator pattern */
  char *a = map(N, 0);
  madvise(a, N * PG, MADV_NOHUGEPAGE);
  touch(a, N, 1);
  flush_lru_batch();
  for (int it = 0; it < 3; it++) {
    f = cycle_faults(a, N, 2 + it);
    want = 0;
    snprintf(name, sizeof(name), "reuse cycle %d: write faults after PROT_NONE->RW", it);
    check_fast(f == want, name, f, want);
  }

  /* 1b. no flush: pages still in the per-CPU LRU batch keep faulting */
  {
    char *z = map(N, 0);
    madvise(z, N * PG, MADV_NOHUGEPAGE);
    touch(z, N, 1);
    for (int it = 0; it < 3; it++) {
      f = cycle_faults(z, N, 2 + it);
      snprintf(name, sizeof(name), "no LRU flush, cycle %d: write faults (at most 15)", it);
      check_fast(f <= 15, name, f, 15);
    }
    munmap(z, N * PG);
  }

  /* 1c. fresh pages, then MADV_DONTNEED of one scratch page: zap_page_range()
   * drains this CPU's LRU batch, so every page qualifies */
  {
    static char *scratch;
    if (!scratch)
      scratch = map(1, 0);
    char *z = map(16, 0);
    madvise(z, 16 * PG, MADV_NOHUGEPAGE);
    touch(z, 16, 1);
    madvise(scratch, PG, MADV_DONTNEED);
    f = cycle_faults(z, 16, 2);
    want = 0;
    check_fast(f == want, "16 fresh pages + MADV_DONTNEED of a scratch page: write faults", f,
               want);
    munmap(z, 16 * PG);
  }

  /* 2. clean (MADV_FREE) exclusive pages: the fault would reuse them too */
  if (kernel_version() >= 600 && kernel_version() < 602) {
    skip("clean (MADV_FREE'd) pages", "6.0 and 6.1 make only dirty pages writable");
  } else {
    madvise(a, N * PG, MADV_FREE);
    flush_lazyfree_batch();
    f = cycle_faults(a, N, 9);
    want = 0;
    check_fast(f == want, "MADV_FREE'd pages: write faults after PROT_NONE->RW", f, want);
  }

  /* 3. pages shared with a child after fork() stay copy-on-write */
  {
    int go[2], res;
    char *b = map(16, 0);
    touch(b, 16, 'P');
    flush_lru_batch();
    if (pipe(go))
      exit(1);
    pid_t pid = fork();
    if (pid == 0) {
      char c;
      read(go[0], &c, 1);
      for (size_t i = 0; i < 16; i++)
        if (b[i * PG] != 'P')
          _exit(1);
      _exit(0);
    }
    f = cycle_faults(b, 16, 'Q');
    /* >= : the parent's own stack is copy-on-write too after fork() */
    check(f >= 16, "fork-shared pages: parent write faults (one per page at least)", f, 16);
    write(go[1], "x", 1);
    waitpid(pid, &res, 0);
    check(WIFEXITED(res) && WEXITSTATUS(res) == 0, "fork-shared pages: child still sees its data",
          WEXITSTATUS(res), 0);
    munmap(b, 16 * PG);
  }

  /* 4. soft-dirty: a write after clear_refs must be recorded */
  if (!soft_dirty_supported())
    skip("soft-dirty checks", "this kernel does not report soft-dirty bits");
  else {
    char *c = map(1, 0);
    c[0] = 1;
    flush_lru_batch();
    clear_refs();
    check(soft_dirty(c) == 0, "soft-dirty cleared by clear_refs", soft_dirty(c), 0);
    mprotect(c, PG, PROT_READ);
    mprotect(c, PG, PROT_READ | PROT_WRITE);
    f = minflt();
    c[0] = 2;
    f = minflt() - f;
    check(soft_dirty(c) == 1, "soft-dirty set by the write after mprotect RW", soft_dirty(c), 1);
    check(f == 1, "soft-dirty armed, clean bit: write takes its fault", f, 1);
    /* now soft-dirty again: nothing left to record, fast path allowed */
    f = cycle_faults(c, 1, 3);
    want = 0;
    check_fast(f == want, "soft-dirty armed, bit already set: write faults", f, want);
    munmap(c, PG);
  }

  /* 5. extra reference (vmsplice into a pipe): keep the fault */
  if (kernel_version() >= 600)
    skip("pipe-referenced page keeps its fault",
         "6.0 and later reuse exclusive pages whatever their refcount");
  else {
    int pp[2];
    char *d = map(1, 0);
    d[0] = 'A';
    flush_lru_batch();
    if (pipe(pp))
      exit(1);
    struct iovec iov = {d, PG};
    if (vmsplice(pp[1], &iov, 1, 0) != (ssize_t)PG) {
      perror("vmsplice");
      exit(1);
    }
    f = cycle_faults(d, 1, 'B');
    check(f == 1, "page referenced by a pipe: write takes its fault", f, 1);
    close(pp[0]);
    close(pp[1]);
    munmap(d, PG);
  }

  /* 6. no write permission, no writable PTE */
  {
    char *e = map(1, 0);
    e[0] = 1;
    flush_lru_batch();
    mprotect(e, PG, PROT_NONE);
    mprotect(e, PG, PROT_READ);
    check(write_faults_sigsegv(e) == 1, "PROT_READ private page: write gets SIGSEGV", 0, 1);
    char *s = map(1, 1);
    s[0] = 1;
    mprotect(s, PG, PROT_NONE);
    mprotect(s, PG, PROT_READ);
    check(write_faults_sigsegv(s) == 1, "PROT_READ MAP_SHARED page: write gets SIGSEGV", 0, 1);
    munmap(e, PG);
    munmap(s, PG);
  }
  munmap(a, N * PG);
}

int main(int argc, char **argv) {
  struct sigaction sa;
  long faults;

  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--skip-if-absent") == 0) {
      skip_if_absent = 1;
    } else {
      fprintf(stderr, "usage: %s [--skip-if-absent]\n", argv[0]);
      return 2;
    }
  }
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = on_segv;
  sigaction(SIGSEGV, &sa, NULL);
  setvbuf(stdout, NULL, _IONBF, 0);
  pin_to_this_cpu();
  fast_path = has_fast_path(&faults);
  printf("mprotect fast path: %s (%ld faults rewriting 16 pages after PROT_NONE->RW)\n",
         fast_path ? "present" : "absent", faults);
  run();
  if (nskip) {
    printf("%d passed, %d failed, %d skipped\n", npass, nfail, nskip);
    if (!nfail)
      printf("SKIP: no mprotect fast path in this kernel (Linux 6.0, or 5.10/5.15 with "
             "contrib/kernel's patch): the checks that need it were skipped\n");
    return nfail ? 1 : 77;
  }
  printf("%d passed, %d failed\n", npass, nfail);
  return nfail != 0;
}
