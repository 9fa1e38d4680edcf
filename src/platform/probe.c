/* probe.c: finds out, by counting minor faults with getrusage(RUSAGE_THREAD),
 * whether mprotect(PROT_READ|PROT_WRITE) makes exclusive anonymous pages
 * writable at once (Linux 6.0 commit 64fe24a3e05e for dirty pages; 6.2 for
 * clean pages and PMD-mapped THP), whether MADV_GUARD_INSTALL exists (6.13),
 * and picks the quarantine strategy from that and the options. A fault count
 * is exact where a timing is not, so every verdict comes from one. The
 * measuring thread is pinned to one CPU meanwhile (its mask is restored).
 */
#include "probe.h"

#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/utsname.h>
#include <time.h>

#include "fmt.h"
#include "lock.h"
#include "options.h"
#include "os.h"
#include "qm.h"
#include "strategy.h"

#define PROBE_PAGES 16u

static qm_probe_result_t verdict;
static atomic_int verdict_ready;
static qm_lock_t probe_lock = QM_LOCK_INIT;

static long minflt(void) {
  struct rusage ru;
  getrusage(RUSAGE_THREAD, &ru);
  return ru.ru_minflt;
}

static uint64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The measuring thread stays on one CPU: the LRU drain in qm_probe_run()
 * (MADV_DONTNEED's lru_add_drain()) empties only the current CPU's batch, so
 * a thread that moved between writing its pages and rewriting them could find
 * them still held by the first CPU's batch, and a 5.10/5.15 kernel with
 * contrib/kernel's patch would answer "no fast path". No allocation (the
 * masks are on the stack, up to PIN_CPUS CPUs), errno kept; where the
 * affinity cannot be read or set the probe runs unpinned. */
#define PIN_CPUS 4096
#define PIN_WORDS (PIN_CPUS / (sizeof(unsigned long) * CHAR_BIT))

typedef struct {
  unsigned long old[PIN_WORDS];
  bool pinned;
} pin_t;

static void pin_begin(pin_t *pin) {
  int saved = errno;
  pin->pinned = false;
  int cpu = sched_getcpu();
  if (cpu >= 0 && cpu < PIN_CPUS &&
      sched_getaffinity(0, sizeof pin->old, (cpu_set_t *)pin->old) == 0) {
    unsigned long one[PIN_WORDS];
    memset(one, 0, sizeof one);
    CPU_SET_S((size_t)cpu, sizeof one, (cpu_set_t *)one);
    pin->pinned = sched_setaffinity(0, sizeof one, (cpu_set_t *)one) == 0;
  }
  errno = saved;
}

static void pin_end(pin_t *pin) {
  int saved = errno;
  if (pin->pinned)
    sched_setaffinity(0, sizeof pin->old, (cpu_set_t *)pin->old);
  errno = saved;
}

/* Writes one byte in each of n pages and returns the faults it took. */
/* Not instrumented under AddressSanitizer: its shadow pages, first read for
 * a fresh range, would be counted as the kernel's faults. */
__attribute__((no_sanitize_address)) static long write_pages(char *p, size_t n) {
  long f = minflt();
  for (size_t i = 0; i < n; i++)
    ((volatile char *)p)[i * qm__page] = (char)i;
  return minflt() - f;
}

static void set_reason(qm_probe_result_t *r, const char *a, long n1, const char *b, long n2,
                       const char *c) {
  qm_buf_t t;
  t.n = 0;
  qm_buf_str(&t, a);
  if (n1 >= 0)
    qm_buf_dec(&t, (uint64_t)n1);
  qm_buf_str(&t, b);
  if (n2 >= 0)
    qm_buf_dec(&t, (uint64_t)n2);
  qm_buf_str(&t, c);
  size_t n = t.n < sizeof r->reason - 1 ? t.n : sizeof r->reason - 1;
  memcpy(r->reason, t.s, n);
  r->reason[n] = 0;
}

/* The size of a PMD-mapped THP: the kernel's word where it has one, else
 * a page of page table entries (8 bytes each) of pages: 2 MiB with 4 KiB
 * pages, 32 MiB with 16 KiB, 512 MiB with 64 KiB. */
static size_t thp_size(void) {
  long long n = qm_os_read_number("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size");
  if (n > 0 && qm_is_pow2((size_t)n) && (size_t)n > qm__page)
    return (size_t)n;
  return qm__page * (qm__page / 8);
}

/* The 6.2 test on a PMD-aligned THP: 0 faults rewriting it after
 * NONE -> RW, where 6.0/6.1 take one huge write fault. Not made where the
 * THP is above 32 MiB (512 MiB with 64 KiB pages): where the kernel gave
 * small pages instead, the test would write all of it. */
static void probe_thp(qm_probe_result_t *r) {
  size_t huge = thp_size();
  void *p;
  r->fast_thp = -1;
  r->faults_thp = -1;
  if (huge > ((size_t)32 << 20) || qm_os_map(huge, huge, QM_PROT_RW, &p))
    return;
  if (qm_os_hugepage(p, huge) == 0) {
    long first = write_pages(p, huge / qm__page);
    if (first <= 2 && !qm_os_protect(p, huge, QM_PROT_RW, QM_PROT_NONE) &&
        !qm_os_protect(p, huge, QM_PROT_NONE, QM_PROT_RW)) {
      r->faults_thp = write_pages(p, huge / qm__page);
      r->fast_thp = r->faults_thp == 0;
    }
  }
  qm_os_unmap(p, huge);
}

/* The belt's reuse, both ways, on the n written pages at p (RW, drained),
 * with p + n pages a scratch page to drain with: see faults_move_* in
 * qmalloc.h. p is left PROT_NONE and empty. */
static void probe_move_once(qm_probe_result_t *r, char *p, size_t n) {
  size_t len = n * qm__page;
  r->faults_move_protect = r->faults_move_rw = -1;
  void *d;
  if (qm_os_map(2 * len, 0, QM_PROT_NONE, &d))
    return;
  char *a = d, *b = a + len;
  if (!qm_os_protect(p, len, QM_PROT_RW, QM_PROT_NONE) && !qm_os_move(p, len, a, true) &&
      !qm_os_protect(a, len, QM_PROT_NONE, QM_PROT_RW)) {
    r->faults_move_protect = write_pages(a, n);
    qm_os_dontneed(p + len, qm__page, QM_PROT_RW); /* drain, as below */
    if (!qm_os_move(a, len, b, true) && !qm_os_move(b, len, a, true))
      r->faults_move_rw = write_pages(a, n);
  }
  qm_os_unmap(d, 2 * len);
}

/* The same, up to three times while either way counts faults, keeping each
 * way's fewest: the belt runs only where the first way counts none, and
 * one stray fault in the measuring thread (seen once in 30 runs of the
 * sanitizer build under load: 3 of 16 pages) must not turn it off for the
 * process. A kernel without the fast path counts every page every time. */
static void probe_move(qm_probe_result_t *r, char *p, size_t n) {
  size_t len = n * qm__page;
  long protect = -1, rw = -1;
  for (int try = 0; try < 3; try++) {
    if (try) { /* p was left PROT_NONE and empty: written afresh */
      if (qm_os_protect(p, len, QM_PROT_NONE, QM_PROT_RW))
        break;
      write_pages(p, n);
      qm_os_dontneed(p + len, qm__page, QM_PROT_RW);
    }
    probe_move_once(r, p, n);
    if (r->faults_move_protect >= 0 && (protect < 0 || r->faults_move_protect < protect))
      protect = r->faults_move_protect;
    if (r->faults_move_rw >= 0 && (rw < 0 || r->faults_move_rw < rw))
      rw = r->faults_move_rw;
    if (r->faults_move_protect < 0 || (protect == 0 && rw == 0))
      break; /* unsupported, or both fault-free */
  }
  r->faults_move_protect = protect;
  r->faults_move_rw = rw;
}

QM_EXPORT int qm_probe_run(qm_probe_result_t *r, int full) {
  if (!qm__page)
    qm__init_page_size();
  memset(r, 0, sizeof *r);
  r->faults_move_protect = r->faults_move_rw = -1;
  struct utsname u;
  if (uname(&u) == 0) {
    size_t n = strnlen(u.release, sizeof r->kernel - 1);
    memcpy(r->kernel, u.release, n);
    r->kernel[n] = 0;
  }
  uint64_t t0 = mono_ns();
  size_t n = PROBE_PAGES, len = n * qm__page;
  void *v;
  /* one page more: a scratch page to drain the per-CPU LRU batch with */
  int err = qm_os_map(len + qm__page, 0, QM_PROT_RW, &v);
  if (err)
    return err;
  char *p = v;
  qm_os_nohugepage(p, len + qm__page); /* a THP would answer for the PMD path */
  pin_t pin;
  pin_begin(&pin);
  r->measured = 1;
  r->pages = (unsigned)n;
  r->faults_first = write_pages(p, n);
  /* Freshly faulted pages can sit in this CPU's LRU batch, which holds a
   * reference; kernels that decide reuse by page_count() (5.10/5.15 with
   * contrib/kernel's patch) then keep their fault. MADV_DONTNEED of another
   * page starts with lru_add_drain(), emptying the batch; 6.0+ decides by
   * PageAnonExclusive and is unaffected. */
  qm_os_dontneed(p + len, qm__page, QM_PROT_RW);
  /* dirty exclusive pages: 6.0 */
  if ((err = qm_os_protect(p, len, QM_PROT_RW, QM_PROT_NONE)) ||
      (err = qm_os_protect(p, len, QM_PROT_NONE, QM_PROT_RW)))
    goto out;
  r->faults_dirty = write_pages(p, n);
  r->fast_dirty = r->faults_dirty == 0;
  /* clean exclusive pages: MADV_FREE clears the dirty bits and keeps the
   * pages (until reclaim); 6.2 makes them writable too */
  r->fast_clean = -1;
  r->faults_clean = -1;
  if (!qm_os_free_lazy(p, len, QM_PROT_RW) &&
      !(err = qm_os_protect(p, len, QM_PROT_RW, QM_PROT_NONE)) &&
      !(err = qm_os_protect(p, len, QM_PROT_NONE, QM_PROT_RW)) &&
      qm_os_resident_pages(p, len) == (long)n) {
    r->faults_clean = write_pages(p, n);
    r->fast_clean = r->faults_clean == 0;
  }
  /* guard regions: a feature test, answered by EINVAL where absent */
  r->guard_regions = qm_os_guard_install(p, qm__page) == 0;
  if (r->guard_regions)
    qm_os_guard_remove(p, qm__page);
  if (full)
    probe_thp(r);
  /* last: it leaves p PROT_NONE and empty */
  write_pages(p, n);
  qm_os_dontneed(p + len, qm__page, QM_PROT_RW);
  probe_move(r, p, n);
out:
  pin_end(&pin);
  qm_os_unmap(p, len + qm__page);
  r->probe_ns = mono_ns() - t0;
  return err;
}

static void set_way_reason(qm_probe_result_t *r, const char *a, long n1, const char *b, long n2,
                           const char *c) {
  qm_probe_result_t t;
  set_reason(&t, a, n1, b, n2, c);
  size_t n = strnlen(t.reason, sizeof r->belt_reason - 1);
  memcpy(r->belt_reason, t.reason, n);
  r->belt_reason[n] = 0;
}

/* The belt's way, where there is a fast path (fast) or not: forced by
 * belt_way, else the one whose reuse the probe found fault-free, protect
 * where both are (MOVE_WHERE_BOTH 0), none (in place) where neither is.
 * Both are fault-free on 6.18, and there they cost the same within the
 * noise of a shared VM (large churn after 3000 ops of warm-up, 1500 timed,
 * three runs each: W=64 425-637 ops/s protect, 423-551 move; faults/op
 * 0.83-0.87 and 0.63-0.67; W=8 0.40 both), while the move makes more
 * calls: per op 2 mprotect, 1 mremap, 0.12 mmap against 1.4 mprotect (a
 * misfit's tail closed at reuse, opened at free: 70% of W=8's reuses), 2
 * mremap, 1.24 mmap; and it holds the dead ranges' places in the mirror
 * until they are mapped afresh. */
#define MOVE_WHERE_BOTH 0
static void choose_way(qm_probe_result_t *r, bool fast) {
  bool protect_ok = fast && r->faults_move_protect == 0, move_ok = r->faults_move_rw == 0;
  uint64_t opt = qm__opt.belt_way;
  if (r->faults_move_protect < 0) {
    r->belt_way = QM_BELT_IN_PLACE;
    set_way_reason(r, "in place: no MREMAP_DONTUNMAP (Linux 5.7), no page can move", -1, "", -1,
                   "");
  } else if (opt == QM_WAY_PROTECT || opt == QM_WAY_MOVE) {
    r->belt_way = opt == QM_WAY_PROTECT ? QM_BELT_PROTECT : QM_BELT_MOVE;
    bool ok = opt == QM_WAY_PROTECT ? protect_ok : move_ok;
    set_way_reason(r, "forced by the belt_way option", -1,
                   ok ? "" : ", though the probe counted faults for it", -1, "");
  } else if (protect_ok && (!move_ok || !MOVE_WHERE_BOTH)) {
    r->belt_way = QM_BELT_PROTECT;
    set_way_reason(r, "protect: pages moved PROT_NONE and opened took 0 faults for ", r->pages,
                   move_ok ? " pages, as did pages moved RW; protect makes fewer calls"
                           : " pages (pages moved RW took ",
                   move_ok ? -1 : r->faults_move_rw, move_ok ? "" : ")");
  } else if (move_ok) {
    r->belt_way = QM_BELT_MOVE;
    if (protect_ok)
      set_way_reason(r, "move: both ways fault-free (", r->faults_move_protect,
                     " and 0 faults), the move preferred", -1, "");
    else
      set_way_reason(r, "move: pages moved RW took 0 faults for ", r->pages,
                     fast ? " pages, moved PROT_NONE and opened "
                          : " pages; no mprotect fast path ("
                            "moved PROT_NONE and opened: ",
                     r->faults_move_protect, fast ? "" : ")");
  } else {
    r->belt_way = QM_BELT_IN_PLACE;
    set_way_reason(r, "in place: pages moved faulted either way (", r->faults_move_protect,
                   " PROT_NONE and opened, ", r->faults_move_rw, " RW)");
  }
}

static void choose(qm_probe_result_t *r) {
  static const int forced[] = {0,
                               QM_STRATEGY_PROTECT,
                               QM_STRATEGY_DISCARD,
                               QM_STRATEGY_GUARD,
                               QM_STRATEGY_UNMAP,
                               QM_STRATEGY_NONE};
  uint64_t opt = qm__opt.strategy;
  if (opt != QM_STRAT_AUTO) {
    r->strategy = forced[opt];
    if (r->strategy == QM_STRATEGY_GUARD && !r->guard_regions) {
      r->strategy = QM_STRATEGY_DISCARD;
      set_reason(r,
                 "strategy=guard asked for, but this kernel has no MADV_GUARD_INSTALL "
                 "(Linux 6.13): using discard",
                 -1, "", -1, "");
    } else {
      set_reason(r, "forced by the strategy option", -1, "", -1, "");
    }
    choose_way(r, r->fast_dirty == 1);
    return;
  }
  choose_way(r, r->fast_dirty == 1);
  if (r->fast_dirty) {
    r->strategy = QM_STRATEGY_PROTECT;
    if (r->measured)
      set_reason(r, "mprotect(RW) made ", r->pages, " written pages writable with ",
                 r->faults_dirty,
                 " faults: quarantined chunks keep their pages and reuse takes no faults");
    else
      set_reason(r, "probe=fast: the kernel is taken to have the mprotect fast path", -1, "", -1,
                 "");
    return;
  }
  /* no fast path, but the belt on and moving pages fault-free: chunks
   * keep their pages all the same, in the belt's pool (only the belt's
   * chunks are reused, by moving: large_alloc.c) */
  if (qm__opt.window_gb && r->belt_way == QM_BELT_MOVE) {
    r->strategy = QM_STRATEGY_PROTECT;
    if (r->measured)
      set_reason(r, "no mprotect fast path (", r->faults_dirty, " faults rewriting ", r->pages,
                 " pages), but pages moved RW take none: freed chunks keep their pages in the "
                 "belt's pool");
    else
      set_reason(r,
                 "probe=slow, but pages moved RW take none: freed chunks keep their pages in "
                 "the belt's pool",
                 -1, "", -1, "");
    return;
  }
  r->strategy = r->guard_regions ? QM_STRATEGY_GUARD : QM_STRATEGY_DISCARD;
  if (r->measured)
    set_reason(r, "no mprotect fast path (", r->faults_dirty, " faults rewriting ", r->pages,
               " pages): quarantined chunks drop their pages");
  else
    set_reason(r, "probe=slow: quarantined chunks drop their pages", -1, "", -1, "");
}

const qm_probe_result_t *qm__probe(void) {
  if (atomic_load_explicit(&verdict_ready, memory_order_acquire))
    return &verdict;
  qm_lock(&probe_lock);
  if (!atomic_load_explicit(&verdict_ready, memory_order_relaxed)) {
    qm_probe_result_t r;
    if (qm__opt.probe == QM_PROBE_AUTO) {
      if (qm_probe_run(&r, 0))
        r.fast_dirty = 0; /* no memory to probe with: assume the slow kernel */
    } else {
      qm_probe_run(&r, 0); /* still learns guard support and the kernel */
      r.measured = 0;
      r.fast_dirty = qm__opt.probe == QM_PROBE_FAST;
    }
    choose(&r);
    verdict = r;
    atomic_store_explicit(&verdict_ready, 1, memory_order_release);
  }
  qm_unlock(&probe_lock);
  return &verdict;
}

QM_EXPORT const qm_probe_result_t *qm_probe_result(void) { return qm__probe(); }

QM_EXPORT const char *qm_belt_way_name(int w) {
  switch (w) {
  case QM_BELT_IN_PLACE:
    return "in-place";
  case QM_BELT_PROTECT:
    return "protect";
  case QM_BELT_MOVE:
    return "move";
  default:
    return "unknown";
  }
}

QM_EXPORT const char *qm_strategy_name(int s) {
  switch (s) {
  case QM_STRATEGY_PROTECT:
    return "protect";
  case QM_STRATEGY_DISCARD:
    return "discard";
  case QM_STRATEGY_GUARD:
    return "guard";
  case QM_STRATEGY_UNMAP:
    return "unmap";
  case QM_STRATEGY_NONE:
    return "none";
  default:
    return "unknown";
  }
}

void qm__probe_fork_prepare(void) { qm_fork_lock(&probe_lock); }
void qm__probe_fork_parent(void) { qm_unlock(&probe_lock); }
void qm__probe_fork_child(void) { qm_lock_reinit(&probe_lock); }

/* ---- measuring a strategy: the seed loop with a strategy's retire and
 * revive as the step between writes ---- */

static void sort_u64(uint64_t *v, size_t n) {
  for (size_t gap = n / 2; gap; gap /= 2) /* shell sort: no allocation */
    for (size_t i = gap; i < n; i++)
      for (size_t j = i; j >= gap && v[j - gap] > v[j]; j -= gap) {
        uint64_t t = v[j];
        v[j] = v[j - gap];
        v[j - gap] = t;
      }
}

QM_EXPORT int qm_strategy_cost(int strategy, size_t bytes, unsigned touch_pages, unsigned iters,
                               uint64_t *faults_x1000, uint64_t *median_ns) {
  if (!qm__page)
    qm__init_page_size();
  if (strategy < QM_STRATEGY_PROTECT || strategy > QM_STRATEGY_NONE || !bytes || !iters)
    return EINVAL;
  size_t len = qm_page_up(bytes), pg = qm__page;
  size_t touch = touch_pages < len / pg ? touch_pages : len / pg;
  bool unmap = strategy == QM_STRATEGY_UNMAP;
  int layout = unmap ? QM_STRATEGY_PROTECT : strategy;
  uint64_t *ns;
  size_t ns_len = qm_page_up((size_t)iters * sizeof *ns);
  int err = qm_os_map(ns_len, 0, QM_PROT_RW, (void **)&ns);
  if (err)
    return err;
  qm_range_t r;
  if ((err = qm__range_map(layout, len, 0, len, false, &r))) {
    qm_os_unmap(ns, ns_len);
    return err;
  }
  char *p = (char *)r.usable;
  memset(p, 1, len);
  memset(ns, 0, ns_len); /* its faults must not count */
  long faults = 0;
  for (unsigned i = 0; i <= iters && !err; i++) {
    long f0 = minflt();
    uint64_t t0 = mono_ns();
    bool dropped;
    if (unmap) {
      qm_os_unmap((void *)r.base, r.span);
      err = qm__range_map(layout, len, 0, len, false, &r);
      p = (char *)r.usable;
    } else if (!(err = qm__range_retire(strategy, p, len, &dropped))) {
      err = qm__range_revive(strategy, p, len);
    }
    if (!err)
      memset(p, (int)i, touch * pg);
    uint64_t t = mono_ns() - t0;
    long f = minflt() - f0;
    if (i) { /* iteration 0 warms up */
      ns[i - 1] = t;
      faults += f;
    }
  }
  if (!err) {
    sort_u64(ns, iters);
    *median_ns = ns[iters / 2];
    *faults_x1000 = (uint64_t)faults * 1000 / iters;
    qm_os_unmap((void *)r.base, r.span);
  }
  qm_os_unmap(ns, ns_len);
  return err;
}

/* ---- measuring the belt's two ways: one chunk freed and reused iters
 * times, each reuse at the next place of a private reservation, as the
 * belt's head moves on ---- */

QM_EXPORT int qm_belt_way_cost(int way, size_t bytes, unsigned iters, uint64_t *faults_x1000,
                               uint64_t *median_ns) {
  if (!qm__page)
    qm__init_page_size();
  if ((way != QM_BELT_PROTECT && way != QM_BELT_MOVE) || !bytes || !iters)
    return EINVAL;
  size_t len = qm_page_up(bytes), pg = qm__page, step = len + 2 * pg;
  size_t span = (size_t)(iters + 2) * step;
  uint64_t *ns;
  size_t ns_len = qm_page_up((size_t)iters * sizeof *ns);
  void *belt = NULL, *mirror = NULL;
  int err = qm_os_map(ns_len, 0, QM_PROT_RW, (void **)&ns);
  if (err)
    return err;
  if ((err = qm_os_reserve(span, &belt)) ||
      (way == QM_BELT_MOVE && (err = qm_os_reserve(span, &mirror)))) {
    if (belt)
      qm_os_unmap(belt, span);
    qm_os_unmap(ns, ns_len);
    return err;
  }
  uintptr_t b = (uintptr_t)belt, m = (uintptr_t)mirror;
  char *p = (char *)(b + pg);
  if (!(err = qm_os_protect(p, len, QM_PROT_NONE, QM_PROT_RW)))
    memset(p, 1, len);
  memset(ns, 0, ns_len); /* its faults must not count */
  long faults = 0;
  for (unsigned i = 0; i <= iters && !err; i++) {
    char *q = p + step, *s = (char *)(m + ((uintptr_t)p - b)); /* p's place in the mirror */
    long f0 = minflt();
    uint64_t t0 = mono_ns();
    if (way == QM_BELT_PROTECT) { /* free: NONE in place; reuse: moved, opened */
      if (!(err = qm_os_protect(p, len, QM_PROT_RW, QM_PROT_NONE)) &&
          !(err = qm_os_move(p, len, q, true)))
        err = qm_os_protect(q, len, QM_PROT_NONE, QM_PROT_RW);
    } else { /* free: moved away, the range mapped afresh; reuse: moved back */
      if (!(err = qm_os_move(p, len, s, true)) && !(err = qm_os_reserve_fixed(p, len)))
        err = qm_os_move(s, len, q, true);
    }
    if (!err)
      for (size_t k = 0; k < len; k += pg)
        q[k] = (char)i;
    uint64_t t = mono_ns() - t0;
    long f = minflt() - f0;
    if (i) { /* iteration 0 warms up */
      ns[i - 1] = t;
      faults += f;
    }
    /* the dead range, as the belt maps it afresh later, in a batch */
    if (!err)
      err = qm_os_reserve_fixed(way == QM_BELT_PROTECT ? p : s, len);
    p = q;
  }
  if (!err) {
    sort_u64(ns, iters);
    *median_ns = ns[iters / 2];
    *faults_x1000 = (uint64_t)faults * 1000 / iters;
  }
  qm_os_unmap(belt, span);
  if (mirror)
    qm_os_unmap(mirror, span);
  qm_os_unmap(ns, ns_len);
  return err;
}
