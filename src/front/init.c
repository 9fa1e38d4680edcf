/* init.c: process initialisation without recursion and without malloc, and
 * fork safety. Init runs on the first call into qmalloc (or from the
 * library constructor, whichever is first); other threads wait for it.
 * Requests made while the options are read (a qmalloc_default_options()
 * that allocates) are served from the start-up arena (boot.c), so that nothing
 * is fixed from the default options before the real ones are known. The
 * fork lock order, taken in prepare and released in reverse:
 *   guarded-slot lock -> secondary init lock -> probe lock -> secondary lock -> class locks 0..N
 *   -> zero-size lock -> meta lock -> thread-cache registry lock -> steering lock
 *   -> owner-id locks
 * all after stdio's list lock; which is also the only nesting allowed
 * anywhere else.
 */
#include "init.h"

#include <errno.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "boot.h"
#include "cache.h"
#include "fault.h"
#include "guarded.h"
#include "life.h"
#include "meta.h"
#include "optparse.h"
#include "os.h"
#include "out.h"
#include "primary.h"
#include "qm.h"
#include "random.h"
#include "report.h"
#include "seal.h"
#include "secondary.h"
#include "smallstate.h"
#include "stack.h"
#include "zero.h"

int qm__init_done;

static int init_state; /* 0 not started, 1 running, 2 done */
int qm__booting;

/* stdio's list lock, taken first: glibc's fork takes it after the atfork
 * handlers, so a forking thread holding qmalloc's locks waited for it while
 * fflush(NULL) held it waiting for a FILE whose holder (getline, in
 * realloc) waited for qmalloc. glibc orders its own malloc's locks after
 * this one; so do these handlers. The lock is recursive (glibc's fork takes
 * it again). Weak: absent outside glibc. */
extern void _IO_list_lock(void) __attribute__((weak));
extern void _IO_list_unlock(void) __attribute__((weak));
/* glibc 2.32+: true while the process has never had a second thread */
extern char __libc_single_threaded __attribute__((weak));

_Bool qm__fork_dry, qm__fork_held;
/* Forks that interrupted a call of the forking thread into qmalloc (a
 * signal handler forked), fork's own handlers among them; their handlers
 * leave everything as it is. A depth, not a flag: set by a fork inside
 * fork's handlers, a flag made the outer fork's parent keep every lock
 * (a single-threaded process hung on its next malloc). */
static unsigned fork_nested;
/* The forking thread's busy mark, set from prepare until parent or child
 * has given every lock back: a signal handler's free landing in fork's
 * handlers takes the nested path, applied as the mark is cleared.
 * Unmarked, it waited for good on a lock fork held (msg_lock, a class
 * lock, the large side's). */
static uintptr_t fork_was;
#ifdef QM_TEST_HOOKS
void (*qm__fork_hook)(void);
#endif

/* Every lock, in the order written above (or tried only, in a dry run). */
static void fork_lock_all(void) {
  qm__guarded_fork_prepare();
  qm__large_fork_prepare();
  qm__primary_lock_all();
  qm__zero_fork_prepare();
  qm_fork_lock(&qm__meta_lock);
  qm__life_fork_prepare();
  qm__state_fork_prepare(qm__life_ids());
}

/* With one thread, nobody but this thread can hold a lock or be inside
 * qmalloc: if it is (a handler that interrupted malloc forks), taking the
 * locks would wait for itself. glibc's malloc takes no lock then either.
 * The interrupted call finishes in the parent and in the child, each with
 * the state it left; the child only draws from fresh random streams. With
 * more threads the locks are taken as always: a fork from a handler that
 * interrupted qmalloc there is beyond what fork promises (POSIX.1-2008 TC2
 * made fork not async-signal-safe; _Fork is). */
static bool fork_interrupts_self(uintptr_t was) {
  if (!&__libc_single_threaded || !__libc_single_threaded)
    return false;
  if (was || qm__unwind_busy())
    return true;
  qm__fork_held = 0;
  qm__fork_dry = 1;
  fork_lock_all();
  qm__fork_dry = 0;
  return qm__fork_held;
}

/* glibc's fork takes stdio's list lock (and resets it in the child) only
 * when the process has threads; else the child's handler gives back the
 * level prepare added, keeping any level an interrupted fflush holds. */
static bool fork_stdio_single;

static void fork_prepare(void) {
  fork_stdio_single = &__libc_single_threaded && __libc_single_threaded;
  if (_IO_list_lock)
    _IO_list_lock();
  /* marked before the dry run: a handler that forks in it is nested, and
   * leaves qm__fork_dry alone (it cleared it under the outer run, which
   * then took the locks for real and waited for itself at the next) */
  uintptr_t was = qm_busy_enter();
  if (fork_interrupts_self(was)) {
    qm_busy_leave(was);
    fork_nested++;
    return;
  }
  fork_was = was;
  qm__unwind_fork_prepare(); /* first: a thread waiting at its gate holds no lock */
  /* the child's cache must hold no chunk whose canary is unchecked */
  qm__small_pend_flush();
  fork_lock_all();
#ifdef QM_TEST_HOOKS
  if (qm__fork_hook) /* where a signal handler may land */
    qm__fork_hook();
#endif
}

static void fork_parent(void) {
  if (fork_nested) {
    fork_nested--;
  } else {
    qm__state_fork_parent();
    qm__life_fork_parent();
    qm_unlock(&qm__meta_lock);
    qm__zero_fork_parent();
    qm__primary_unlock_all();
    qm__large_fork_parent();
    qm__guarded_fork_parent();
    qm__unwind_fork_parent();
    qm__busy_leave_applying(fork_was);
  }
  if (_IO_list_unlock)
    _IO_list_unlock();
}

/* The class locks fresh before the cache's handler: the parent's other
 * threads' ids are closed, and what was sent to them goes to the central
 * lists. Then the central chunks take fresh generations: those too. */
static void fork_child(void) {
  if (fork_stdio_single && _IO_list_unlock)
    _IO_list_unlock();
  qm__random_fork_child(); /* before anything in the child draws */
  qm_os_fork_child();
  if (fork_nested) {
    fork_nested--;
    qm__unwind_fork_child_nested();
    return;
  }
  qm_lock_reinit(&qm__meta_lock);
  qm__zero_fork_child();
  qm__primary_fork_locks();
  qm__state_fork_child();
  qm__life_fork_child();
  qm__primary_fork_child(qm__cache_group(), qm__small_regen);
  qm__large_fork_child();
  qm__guarded_fork_child();
  qm__busy_leave_applying(fork_was);
}

static __thread bool initializing __attribute__((tls_model("initial-exec")));

/* The widest vectors the CPU runs and the kernel saves (XCR0): 2 for
 * AVX-512F (opmask and ZMM state too, bits 5-7), 1 for AVX2 (YMM state,
 * bits 1-2), else 0. Elsewhere 0: on arm64 the zero check's generic loop
 * of 16-byte vectors is NEON's, which every arm64 CPU has; SVE is not
 * used. */
static uint8_t cpu_vec(void) {
#if defined(__x86_64__)
  unsigned a, b, c, d, lo, hi;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE) || !(c & bit_AVX))
    return 0;
  __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  (void)hi;
  if ((lo & 6) != 6 || !__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(b & bit_AVX2))
    return 0;
  return (b & bit_AVX512F) && (lo & 0xe6) == 0xe6 ? 2 : 1;
#else
  return 0;
#endif
}

void qm__init_slow(void) {
  int expected = 0;
  if (!__atomic_compare_exchange_n(&init_state, &expected, 1, false, __ATOMIC_ACQ_REL,
                                   __ATOMIC_ACQUIRE)) {
    /* Called back from inside init on this thread: only a
     * qmalloc_default_options() that allocates does that. Its requests are
     * served from the bootstrap arena (qm__booting is set). */
    if (initializing)
      return;
    while (__atomic_load_n(&init_state, __ATOMIC_ACQUIRE) != 2)
      sched_yield(); /* another thread initialises */
    return;
  }
  initializing = true;
  qm__init_page_size();
  __atomic_store_n(&qm__booting, 1, __ATOMIC_RELAXED);
  qm__options_init();
  __atomic_store_n(&qm__booting, 0, __ATOMIC_RELAXED);
  qm__secret = qm_random_u64() | 1;
  qm__cache_checked =
      qm__opt.hardening == QM_HARDENING_MAX || qm__opt.zero_on_free || qm__opt.free_delay;
  qm__vec = cpu_vec();
  /* the largest class serves QM_SMALL_MAX bytes (its canary takes the
   * rest): requests past it are large whatever the threshold */
  size_t limit = qm__opt.large_threshold_kb << 10;
  if (limit > QM_SMALL_MAX + 1)
    limit = QM_SMALL_MAX + 1;
  if (qm__primary_init(qm__secret) == 0 && qm__state_init() == 0)
    qm__small_limit = limit;
  /* else every request goes to the secondary: slow, but correct */
  qm__late_init();
  qm__ro_seal(); /* nothing above changes after this */
  __atomic_store_n(&qm__init_done, 1, __ATOMIC_RELEASE);
  __atomic_store_n(&init_state, 2, __ATOMIC_RELEASE);
  initializing = false;
  /* these may allocate: done after init is visible, so they recurse safely */
  qm__life_init();
  qm__unwind_init();
  qm__fault_report_init();
  pthread_atfork(fork_prepare, fork_parent, fork_child);
  if (qm__opt.help) {
    /* at once, before the program runs: _exit, so that nothing of the
     * program's (its atexit handlers, stdio it buffered) runs either */
    qm__options_help();
    _exit(0);
  }
  if (qm__opt.verbose) {
    qm__options_print();
    const qm_probe_result_t *r = qm_probe_result();
    qm_buf_t b;
    b.n = 0;
    qm_buf_str(&b, "qmalloc: strategy ");
    qm_buf_str(&b, qm_strategy_name(r->strategy));
    qm_buf_str(&b, ": ");
    qm_buf_str(&b, r->reason);
    qm_buf_str(&b, "\nqmalloc: belt way ");
    qm_buf_str(&b, qm_belt_way_name(r->belt_way));
    qm_buf_str(&b, ": ");
    qm_buf_str(&b, r->belt_reason);
    qm_buf_str(&b, "\n");
    qm__out(&b);
  }
}

/* Initialise at load too, so that pthread_atfork is registered before the
 * program can start threads; lazy init covers calls that come earlier. */
__attribute__((constructor)) static void qm_constructor(void) { qm__init(); }
