/* fault.c: the SIGSEGV handler that explains faults in qmalloc's guards:
 * one line from the large or the small side's description of the address,
 * the stack of the access, for a large chunk its own kept stacks, and the
 * SUMMARY line. It only prints (write(2), no lock, no allocation) and returns: the
 * retried access kills the process with the signal it would have had.
 */
#include "fault.h"

#include <signal.h>
#include <string.h>
#include <ucontext.h>

#include "guarded.h"
#include "init.h"
#include "options.h"
#include "primary.h"
#include "report.h"
#include "secondary.h"
#include "stack.h"
#include "zero.h"

static void fault_handler_install(void);

/* ---- describing small-chunk addresses (for the SIGSEGV report) ---- */

bool qm__small_describe(uintptr_t a, qm_access_t *what, qm_buf_t *d) {
  if (qm__guarded_describe(a, what, d))
    return true;
  if (qm__boot_on_guard(a)) {
    *what = QM_ACC_GUARD;
    qm_buf_str(d, "guard page of qmalloc's start-up arena");
    return true;
  }
  uintptr_t off = a - qm__pbase;
  if (a < qm__pbase && qm__pbase - a <= qm__page && qm__pspan) {
    *what = QM_ACC_WILD;
    qm_buf_str(d, "guard page below the small-chunk heap");
    return true;
  }
  if (off >= qm__pspan)
    return false;
  unsigned c = (unsigned)(off >> qm__rshift);
  if (c == QM_ZCLASS)
    return qm__zero_describe(a, what, d);
  uintptr_t roff = off & (((uintptr_t)1 << qm__rshift) - 1);
  if (roff < atomic_load_explicit(&qm__committed[c], memory_order_relaxed)) {
    if (!qm_on_guard(roff))
      return false; /* RW memory: whatever faulted there, it was not qmalloc's guard */
    *what = QM_ACC_GUARD;
    qm_buf_str(d, "guard page between runs of small chunks of class ");
    qm_buf_dec(d, qm__class[c].size);
    qm_buf_str(d, " bytes");
    return true;
  }
  *what = QM_ACC_WILD;
  qm_buf_str(d, "unused part of the small-chunk heap, class ");
  qm_buf_dec(d, qm__class[c].size);
  qm_buf_str(d, " bytes");
  return true;
}

/* Puts back the default action for SIGSEGV. SA_RESETHAND did so already
 * when this handler was called as installed; a handler installed later that
 * calls this one for faults it does not own has its own disposition in
 * place, and returning would retry the fault into it for ever. With the
 * default action, the retried access kills the process, as it would have
 * without qmalloc (a blocked SIGSEGV from a fault is forced through). */
static void default_action(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = SIG_DFL;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGSEGV, &sa, NULL);
}

/* The first line of a SIGSEGV explanation; whether addr is a large chunk's
 * and what the access hit. A fault inside a live chunk is no error qmalloc
 * found (the program's own mprotect, say): its line says what was hit
 * without "ERROR". */
static __attribute__((noinline)) bool segv_line(uintptr_t a, const void *ctx, bool *large,
                                                qm_access_t *kind) {
  qm_buf_t d;
  d.n = 0;
  *large = qm__large_describe(a, kind, NULL, &d);
  if (!*large && !qm__small_describe(a, kind, &d))
    return false;
  const char *rw = "";
#if defined(__x86_64__)
  const ucontext_t *uc = ctx;
  rw = uc->uc_mcontext.gregs[REG_ERR] & 2 ? " (write)" : " (read)";
#else
  (void)ctx;
#endif
  qm_buf_t b;
  b.n = 0;
  if (*kind == QM_ACC_LIVE) {
    qm_buf_str(&b, "qmalloc: SIGSEGV");
    qm_buf_str(&b, rw);
    qm_buf_str(&b, " at ");
    qm_buf_hex(&b, a);
    qm_buf_str(&b, " (");
    qm_buf_mem(&b, d.s, d.n);
    qm_buf_str(&b, "): inside a live chunk, not at a guard of qmalloc's\n");
    qm__report_out(&b);
    return true;
  }
  char w[96];
  size_t n = 0;
  const char *parts[3] = {qm__access_name(*kind), rw, " at"};
  for (unsigned k = 0; k < 3; k++)
    for (const char *c = parts[k]; *c && n < sizeof w - 1; c++)
      w[n++] = *c;
  w[n] = 0;
  qm__report_line(w, (const void *)a, d.s, d.n);
  return true;
}

/* The stack of the faulting access: unwound through the signal frame, and
 * printed from the interrupted instruction on; *first gets its first frame
 * (pc + *first is the access). Printed whatever stack_frames says: that
 * option bounds the stacks kept per chunk. */
static __attribute__((noinline)) unsigned segv_stack(const void *ctx, uintptr_t *pc,
                                                     unsigned *first) {
  unsigned n = qm__stack_capture(pc, QM_STACK_MAX), k = 0;
#if defined(__x86_64__)
  const ucontext_t *uc = ctx;
  uintptr_t ip = (uintptr_t)uc->uc_mcontext.gregs[REG_RIP];
  while (k < n && pc[k] != ip)
    k++;
  if (k == n)
    k = 0;
#else
  (void)ctx;
#endif
  qm__report_call_stack("accessed", pc + k, n - k);
  *first = k;
  return n;
}

static void on_segv(int sig, siginfo_t *si, void *ctx) {
  default_action();
  if (si->si_code <= 0) { /* sent by kill() or raise(): deliver it as sent */
    raise(sig);
    return;
  }
  /* print only: returning retries the access under the default action, so
   * the process dies of the SIGSEGV itself, as it would without qmalloc */
  uintptr_t a = (uintptr_t)si->si_addr;
  bool large;
  qm_access_t kind;
  if (!segv_line(a, ctx, &large, &kind))
    return; /* the retried access kills */
  uintptr_t pc[QM_STACK_MAX];
  unsigned k, n = segv_stack(ctx, pc, &k);
  if (kind == QM_ACC_LIVE)
    return;
  if (large)
    qm__large_report_stacks((const void *)a);
  qm__report_summary(qm__access_name(kind), pc + k, n - k);
}

/* Installed only over the default disposition, one-shot: a program that
 * handles SIGSEGV itself replaces it and sees no difference. */
void qm__fault_report_init(void) {
  if (qm__opt.fault_report)
    fault_handler_install();
}

static void fault_handler_install(void) {
  struct sigaction old;
  if (sigaction(SIGSEGV, NULL, &old) || old.sa_handler != SIG_DFL || (old.sa_flags & SA_SIGINFO))
    return;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_segv;
  sa.sa_flags = SA_SIGINFO | SA_RESETHAND | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGSEGV, &sa, NULL);
}
