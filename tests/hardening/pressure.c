/* pressure.c: the allocator in the states a process can put it in (its
 * pages locked by mlockall, a request that cannot be met, its mappings at
 * the limit): each subcommand checks qmalloc keeps working and keeps its
 * guarantees there. Built plain (run under LD_PRELOAD) and linked; reads
 * qmalloc's counters through dlsym so that the plain build needs no header.
 * Exit 77 (meson's "skipped") where the process cannot be put in the state.
 */
#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include "qmalloc.h"

static void *volatile sink;
/* The cases that end in a report: exported (the programs are linked with
 * -rdynamic) and never inlined, so that the report's SUMMARY line names
 * each as the offending frame, which the suite checks. */
#define REPORTED __attribute__((noinline, visibility("default")))
REPORTED int mlock_uaf(void);
REPORTED int huge_request(void);
REPORTED int map_count(void);

/* Under qemu-user (QMT_EMULATED: tests/meson.build) what a test measures
 * of the kernel may be the emulator's instead: skipped, saying why. */
static void skip_if_emulated(const char *why) {
  const char *emu = getenv("QMT_EMULATED");
  if (emu && *emu) {
    fprintf(stderr, "skipped: under %s %s\n", emu, why);
    exit(77);
  }
}

static void *opaque(void *p) {
  sink = p;
  return sink;
}

static qm_stats_t stats(void) {
  qm_stats_t s;
  memset(&s, 0, sizeof s);
  void (*f)(qm_stats_t *) = (void (*)(qm_stats_t *))dlsym(RTLD_DEFAULT, "qm_stats");
  if (!f) {
    fprintf(stderr, "pressure: qm_stats not found: is qmalloc loaded?\n");
    exit(3);
  }
  f(&s);
  return s;
}

/* Locks every page, now and to come, as a program that must not be paged
 * out does (glibc runs all of this). Root may lock any amount; anyone else
 * only up to RLIMIT_MEMLOCK, raised to its hard limit here. */
static void lock_all(void) {
  struct rlimit r;
  if (!getrlimit(RLIMIT_MEMLOCK, &r) && r.rlim_cur != r.rlim_max) {
    r.rlim_cur = r.rlim_max;
    setrlimit(RLIMIT_MEMLOCK, &r);
  }
  if (mlockall(MCL_CURRENT | MCL_FUTURE)) {
    fprintf(stderr, "skipped: mlockall: %s (needs CAP_IPC_LOCK or an unlimited RLIMIT_MEMLOCK)\n",
            strerror(errno));
    exit(77);
  }
}

/* Large mallocs and frees of several sizes (past the quarantine window, so
 * chunks are reused and dropped), malloc_trim, small churn across many
 * classes: every path that drops pages. */
static int mlock_churn(void) {
  lock_all();
  for (int round = 0; round < 3; round++) {
    void *v[48];
    for (int i = 0; i < 48; i++) {
      size_t n = ((size_t)(i % 16) + 1) << 17;
      v[i] = opaque(malloc(n));
      if (!v[i]) {
        fprintf(stderr, "pressure: malloc(%zu) failed\n", n);
        return 1;
      }
      memset(v[i], 1, n);
    }
    for (int i = 0; i < 48; i++)
      free(v[i]);
    malloc_trim(0);
    static void *s[8000];
    for (int k = 0; k < 4; k++) {
      for (int i = 0; i < 8000; i++)
        memset(s[i] = opaque(malloc(16 + (size_t)(i * 37) % 4000)), 2, 16);
      for (int i = 0; i < 8000; i++)
        free(s[i]);
    }
    malloc_trim(0);
  }
  qm_stats_t st = stats();
  fprintf(stderr, "pressure: mlock ok, %llu page drops remapped\n",
          (unsigned long long)st.locked_remaps);
  return 0;
}

/* The quarantine's guarantee holds with locked pages: a freed large chunk
 * is inaccessible, after malloc_trim dropped its pages too. */
REPORTED int mlock_uaf(void) {
  lock_all();
  char *p = opaque(malloc(1 << 20));
  memset(p, 1, 1 << 20);
  free(p);
  malloc_trim(0);
  p[16] = 2; /* must fault */
  return 0;
}

/* A request the kernel refuses whatever is freed (16 TiB: more than RAM and
 * swap) fails with ENOMEM and leaves the quarantine alone: the window's
 * chunk stays inaccessible, and the next large chunk does not get its
 * range. It once emptied the whole quarantine on its way to ENOMEM. */
REPORTED int huge_request(void) {
  /* qmalloc asks first and maps nothing, but where the kernel grants
   * anything qemu-user would keep flags for 16 TiB of guest pages (it took
   * the host's memory and was killed) */
  FILE *f = fopen("/proc/sys/vm/overcommit_memory", "r");
  int mode = -1;
  if (f && fscanf(f, "%d", &mode) != 1)
    mode = -1;
  if (f)
    fclose(f);
  if (mode == 1)
    skip_if_emulated("vm.overcommit_memory=1: the emulator's bookkeeping of a 16 TiB mapping "
                     "would take the host's memory");
  char *p = opaque(malloc(1 << 20));
  memset(p, 1, 1 << 20);
  free(p);
  errno = 0;
  void *q = opaque(malloc((size_t)16 << 40));
  if (q) {
    fprintf(stderr, "skipped: malloc(16 TiB) succeeded (vm.overcommit_memory=1)\n");
    return 77;
  }
  if (errno != ENOMEM) {
    fprintf(stderr, "pressure: malloc(16 TiB) failed with %s, not ENOMEM\n", strerror(errno));
    return 1;
  }
  char *r = opaque(malloc(1 << 20));
  memset(r, 3, 1 << 20);
  p[16] = 2; /* must fault */
  return 0;
}

/* The process's own mappings up to vm.max_map_count: one PROT_NONE range
 * with every other page made readable (each a mapping of its own, and no
 * memory charged). */
static char *fill_base;
static size_t fill_len;
static int fill_mappings(void) {
  FILE *f = fopen("/proc/sys/vm/max_map_count", "r");
  long max = 0;
  if (!f || fscanf(f, "%ld", &max) != 1 || max <= 0 || max > (1l << 21)) {
    fprintf(stderr, "skipped: vm.max_map_count unreadable or above 2M (%ld)\n", max);
    exit(77);
  }
  fclose(f);
  size_t pg = (size_t)sysconf(_SC_PAGESIZE);
  fill_len = ((size_t)max + 64) * 2 * pg;
  fill_base = mmap(NULL, fill_len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (fill_base == MAP_FAILED)
    return 0;
  for (size_t i = 1; i < fill_len / pg; i += 2)
    if (mprotect(fill_base + i * pg, pg, PROT_READ))
      return errno == ENOMEM;
  return 0;
}

/* A large request when no mapping is left: with chunks of their own
 * (window_gb=0) only unmapping the quarantine's window chunk lets it
 * succeed. The default profile serves it, counts it and warns once;
 * hardening=max fails it with ENOMEM, and the freed chunk still faults. On
 * the belt no chunk's mapping can go to make room: the request fails with
 * ENOMEM in both profiles, or (belt_way=move) is served once the freed
 * chunk's pooled pages are dropped, their place in the mirror merging
 * back; either way the window holds and the freed chunk still faults. */
REPORTED int map_count(void) {
  /* qemu-user's guest and qemu share one mm: at the limit, qemu's own
   * bookkeeping of the guest's next mmap (target_mmap -> page_set_flags ->
   * page_find_alloc -> g_malloc0) can fail, and glib's g_error, whose g_log
   * returns under qemu, ends in its for (;;): g_malloc0 spins at 100% CPU
   * with no syscall (3 runs of 17 at 65,532 mappings) until the timeout */
  skip_if_emulated("qemu's own allocations share the guest's vm.max_map_count: at the limit "
                   "its page_set_flags -> g_malloc0 fails and glib's g_error spins for ever");
  void (*get)(qm_stats_t *) = (void (*)(qm_stats_t *))dlsym(RTLD_DEFAULT, "qm_stats");
  char *p = opaque(malloc(1 << 20));
  if (!get || !p)
    return 3;
  memset(p, 1, 1 << 20);
  free(p);
  if (!fill_mappings()) {
    fprintf(stderr, "pressure: could not reach vm.max_map_count\n");
    return 1;
  }
  errno = 0;
  char *r = opaque(malloc(1 << 20));
  int err = errno;
  munmap(fill_base, fill_len);
  if (r) {
    qm_stats_t s;
    get(&s);
    fprintf(stderr, "pressure: served, %llu window breaks\n", (unsigned long long)s.window_breaks);
    if (s.window_breaks)
      return 0;
    p[16] = 2; /* served within the window: must fault */
    return 1;
  }
  fprintf(stderr, "pressure: refused: %s\n", strerror(err));
  if (err != ENOMEM)
    return 1;
  p[16] = 2; /* must fault */
  return 0;
}

int main(int argc, char **argv) {
  const char *m = argc > 1 ? argv[1] : "";
  if (!strcmp(m, "mlock-churn"))
    return mlock_churn();
  if (!strcmp(m, "mlock-uaf"))
    return mlock_uaf();
  if (!strcmp(m, "huge-request"))
    return huge_request();
  if (!strcmp(m, "map-count"))
    return map_count();
  fprintf(stderr, "pressure: unknown subcommand %s\n", m);
  return 2;
}
