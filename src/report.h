/* report.h: the one fatal path and the one warning path. Every error qmalloc
 * detects ends in qm__report_fatal(): one line on stderr in the format
 *   qmalloc: ERROR: <what> 0x<ptr> (<details>)
 * written with write(2), then the stack of the call that found it, the
 * chunk's kept stacks where there are any (a tail the caller prints), a
 * closing "SUMMARY: qmalloc: <kind> <frame>" line, and abort(). Everything qmalloc prints also
 * goes to the log file when option log_path names one. Nothing allocates.
 */
#ifndef QM_REPORT_H
#define QM_REPORT_H

#include "fmt.h"
#include "qm.h"

/* What an access at an address hit, as the one description of addresses
 * gives it (qm__large_describe, qm__small_describe): the SIGSEGV report's
 * kind and qm_describe()'s first words. QM_ACC_LIVE is no error of
 * qmalloc's: inside a live chunk (a fault there is the program's own
 * protection). */
typedef enum qm_access {
  QM_ACC_UAF,
  QM_ACC_OVERFLOW,
  QM_ACC_UNDERFLOW,
  QM_ACC_GUARD, /* a guard between runs of small chunks: either way */
  QM_ACC_WILD,
  QM_ACC_LIVE,
} qm_access_t;
const char *qm__access_name(qm_access_t k);

/* The operation of free(), "invalid free of": passed down as op and told
 * apart by its address, never by its text (a free of a freed chunk is then
 * reported as a double free). */
extern QM_HIDDEN const char qm__op_free[];

/* what: e.g. "double free of"; details: already formatted, may be NULL. */
_Noreturn void qm__report_fatal(const char *what, const void *ptr, const char *details) QM_COLD;

/* The same, with details taken from a buffer the caller filled. */
_Noreturn void qm__report_fatal_buf(const char *what, const void *ptr, qm_buf_t *details) QM_COLD;

/* More lines of a report after its first one: tail(ptr) prints them with
 * qm__report_out(), lock-free (it may run in a signal handler). */
typedef void (*qm_report_tail_t)(const void *ptr);
_Noreturn void qm__report_fatal_tail(const char *what, const void *ptr, qm_buf_t *details,
                                     qm_report_tail_t tail) QM_COLD;
/* The first line of a report that does not abort (the SIGSEGV explanation:
 * the process dies of the signal afterwards). */
void qm__report_line(const char *what, const void *ptr, const char *details, size_t dlen) QM_COLD;

/* "  <heading> by thread N here:" and up to stack_frames (16 when 0)
 * frames of pc: the stack of the call or access that found an error. */
void qm__report_call_stack(const char *heading, const uintptr_t *pc, unsigned n) QM_COLD;
/* "SUMMARY: qmalloc: <kind> (module+0xOFF) symbol+0xN", the frame pc[0]:
 * the last line of every error report. kind: the first line's words before
 * the address. */
void qm__report_summary(const char *kind, const uintptr_t *pc, unsigned n) QM_COLD;

/* Writes b to stderr and the log file, then empties it. */
void qm__report_out(qm_buf_t *b);
#ifdef QM_TEST_HOOKS
/* Test hook: forgets the log file and a failure to open it (the descriptor
 * stays open), so that the next line opens log_path afresh. */
void qm__report_log_forget(void);
#endif

/* A syscall failed with an errno qmalloc cannot handle (anything but
 * ENOMEM where the caller can degrade): a bug or a hostile environment. */
_Noreturn void qm__report_os_failure(const char *call, const void *addr, size_t len,
                                     int err) QM_COLD;

/* free_sized() (call names it) with a size or alignment the chunk (kind
 * "small" or "large", holding `held` requested bytes) was not allocated
 * with; sized and aligned say which of passed and align were passed. */
_Noreturn void qm__report_size_mismatch(const char *call, const void *ptr, bool sized,
                                        size_t passed, bool aligned, size_t align, const char *kind,
                                        size_t held, qm_report_tail_t tail) QM_COLD;

/* An entry of a small-chunk free list (of the class of class_bytes) that is
 * not a free chunk of that class: "corrupted free list". */
_Noreturn void qm__report_bad_entry(size_t class_bytes, uintptr_t entry, const char *why) QM_COLD;

/* "qmalloc: WARNING: <line>" on stderr; never fatal. */
void qm__warn_buf(qm_buf_t *line) QM_COLD;

#endif
