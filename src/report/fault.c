/* fault.c: the SIGSEGV handler that explains faults in qmalloc's guards:
 * one line from the one description of the address (qm__describe),
 * the stack of the access, for a large chunk its own kept stacks, and the
 * SUMMARY line. It only prints (write(2), no lock, no allocation) and returns: the
 * retried access kills the process with the signal it would have had.
 */
#include "fault.h"

#include <signal.h>
#include <string.h>
#include <ucontext.h>

#include "describe.h"
#include "options.h"
#include "report.h"
#include "stack.h"

static void fault_handler_install(void);

#if defined(__aarch64__)
/* arm64's signal frame: after the registers, uc_mcontext.__reserved holds
 * records, each a {magic, size} header; the kernel adds an esr_context
 * (ESR_MAGIC, arch/arm64/include/uapi/asm/sigcontext.h) to a fault's frame
 * since Linux 4.7. Its own definitions here: <asm/sigcontext.h> clashes
 * with glibc's <signal.h>. */
#define QM_ESR_MAGIC 0x45535201u
#define QM_EXTRA_MAGIC 0x45585401u
struct qm_a64_ctx {
  uint32_t magic, size;
};

/* The ESR of the fault, or 0 where the frame has none (an emulator's
 * frame may lack it). */
static uint64_t frame_esr(const ucontext_t *uc) {
  const char *r = (const char *)uc->uc_mcontext.__reserved;
  size_t off = 0, cap = sizeof uc->uc_mcontext.__reserved;
  while (off + sizeof(struct qm_a64_ctx) <= cap) {
    struct qm_a64_ctx h;
    memcpy(&h, r + off, sizeof h);
    if (!h.magic || h.magic == QM_EXTRA_MAGIC || h.size < sizeof h || h.size > cap - off)
      return 0;
    if (h.magic == QM_ESR_MAGIC && h.size >= sizeof h + 8) {
      uint64_t esr;
      memcpy(&esr, r + off + sizeof h, sizeof esr);
      return esr;
    }
    off += h.size;
  }
  return 0;
}

/* 1 for a write, 0 for a read, -1 unknown. From the ESR where the frame has
 * one: a data abort (EC 0x24 from EL0, 0x25) has WnR, bit 6, set for a
 * write; a cache maintenance (CM, bit 8) also sets WnR and is no write.
 * Else from the instruction at the PC: in every load/store encoding
 * (op0 bit 27 set, bit 25 clear) bit 22 is L, 1 for a load, but in the
 * atomic memory operations (LDADD, SWP, CAS...: bits 29:27 = 111, bit 24
 * clear, bit 21 set, bits 11:10 = 00), which read and write (LDAPR, in
 * that space too, is taken for one). */
static int a64_write(const ucontext_t *uc) {
  uint64_t esr = frame_esr(uc);
  unsigned ec = (unsigned)(esr >> 26) & 0x3f;
  if (ec == 0x24 || ec == 0x25)
    return (esr >> 6 & 1) && !(esr >> 8 & 1);
  /* an instruction fetch (a jump into a guard) has no instruction to read */
  uintptr_t pc = (uintptr_t)uc->uc_mcontext.pc;
  if ((pc ^ (uintptr_t)uc->uc_mcontext.fault_address) < qm__page)
    return -1;
  uint32_t insn;
  memcpy(&insn, (const void *)pc, sizeof insn);
  if (!(insn >> 27 & 1) || (insn >> 25 & 1))
    return -1;
  if ((insn >> 27 & 7) == 7 && !(insn >> 24 & 1) && (insn >> 21 & 1) && !(insn >> 10 & 3))
    return 1;
  return !(insn >> 22 & 1);
}
#endif

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

/* The first line of a SIGSEGV explanation, from the one description of
 * addresses; false where the fault is none of qmalloc's guards (plain
 * memory: the program's own protection, or no memory of qmalloc's). */
static __attribute__((noinline)) bool segv_line(uintptr_t a, const void *ctx, qm_place_t *pl) {
  if (!qm__describe(a, pl) || pl->plain)
    return false;
  const char *rw = "";
#if defined(__x86_64__)
  const ucontext_t *uc = ctx;
  rw = uc->uc_mcontext.gregs[REG_ERR] & 2 ? " (write)" : " (read)";
#elif defined(__aarch64__)
  int w = a64_write(ctx);
  rw = w < 0 ? "" : w ? " (write)" : " (read)";
#else
  (void)ctx;
#endif
  qm__report_fault_line(a, pl, rw);
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
#elif defined(__aarch64__)
  const ucontext_t *uc = ctx;
  uintptr_t ip = (uintptr_t)uc->uc_mcontext.pc;
#endif
#if defined(__x86_64__) || defined(__aarch64__)
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
  qm_place_t pl;
  if (!segv_line(a, ctx, &pl))
    return; /* the retried access kills */
  uintptr_t pc[QM_STACK_MAX];
  unsigned k, n = segv_stack(ctx, pc, &k);
  if (pl.access == QM_ACC_LIVE)
    return;
  qm_kept_t kept;
  if (pl.chunk && pl.kind == QM_CK_LARGE && qm__describe_kept(a, &kept))
    qm__report_kept(&kept);
  qm__report_fault_summary(&pl, pc + k, n - k);
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
