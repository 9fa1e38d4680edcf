/* report.h: the catalogue of fatal reports. Every error qmalloc detects is
 * reported by one function per kind, which takes its operation and facts
 * and goes through one formatter (report.c): one line
 *   qmalloc: ERROR: <kind> 0x<ptr> (<details>)
 * written with write(2), then the stack of the call that found it, the
 * chunk's kept stacks where there are any, a closing
 * "SUMMARY: qmalloc: <kind> <frame>" line, and abort(). Everything goes out
 * through out.h (stderr, and the log file when option log_path names one).
 * Nothing allocates. The formats are restated for tests in tests/report.re.
 */
#ifndef QM_REPORT_H
#define QM_REPORT_H

#include "fmt.h"
#include "place.h"
#include "qm.h"

/* The words of an access kind ("use-after-free"). */
const char *qm__access_name(qm_access_t k);

/* The operation a pointer was passed to: the first words of a report on a
 * pointer that is no live chunk's ("invalid free of", "realloc of"). */
typedef enum qm_op {
  QM_OP_FREE,
  QM_OP_REALLOC,
  QM_OP_USABLE_SIZE,
} qm_op_t;

/* ---- the catalogue: one function per kind of fatal report ----
 * Each writes "qmalloc: ERROR: <kind> 0x<ptr> (<details>)", the stack of
 * the call that found it, the kept stacks of a large chunk, the SUMMARY
 * line naming <kind> and the call's first frame outside qmalloc, then
 * aborts. */

/* A pointer passed to op that is no live chunk's user pointer, at the place
 * pl that the part of qmalloc owning the address describes (NULL: none
 * does, "not allocated by qmalloc"): a freed chunk's user pointer is a
 * double free for free, "<op> of ... already freed" otherwise (its size
 * not printed for a zero-size chunk); anything else is named by pl's
 * words. kept: the large chunk's kept stacks there, or NULL. */
_Noreturn void qm__report_pointer(qm_op_t op, const void *p, const qm_place_t *pl,
                                  const qm_kept_t *kept) QM_COLD;
/* How a second free of a small chunk was found, besides a free that finds
 * it freed. */
typedef enum qm_refree {
  QM_REFREE_TWO_THREADS,     /* applied by its owner after another thread's free */
  QM_REFREE_HANDLER,         /* from a signal handler inside its own free */
  QM_REFREE_HANDLER_REALLOC, /* from a signal handler inside its realloc */
} qm_refree_t;
_Noreturn void qm__report_refree(const void *p, size_t size, qm_refree_t how) QM_COLD;
/* A small or sampled chunk of size bytes at p written past its end, the
 * first byte changed at offset at; found at the free of its neighbour
 * (side -1: the previous, +1: the next, at address by) or 0 at its own.
 * freed_ret: the return address of the free that parked it, found later
 * (0: found at that free): the report then names it, and its SUMMARY
 * blames it, not the unrelated call that found the damage. */
_Noreturn void qm__report_small_overflow(const void *p, qm_chunk_kind_t kind, size_t size,
                                         size_t at, int side, uintptr_t by,
                                         uintptr_t freed_ret) QM_COLD;
/* A free small chunk at ch (class class_bytes) zeroed at free, found
 * holding byte at offset at when handed out again. */
_Noreturn void qm__report_write_after_free(uintptr_t ch, size_t class_bytes, size_t at,
                                           unsigned byte) QM_COLD;
/* free_sized() (call names it) with a size or alignment the chunk (holding
 * `held` requested bytes, asked aligned to held_align)
 * was not allocated with; sized and aligned say which of passed and align
 * were passed; kept: a large chunk's kept stacks, or NULL. */
_Noreturn void qm__report_size_mismatch(const char *call, const void *ptr, bool sized,
                                        size_t passed, bool aligned, size_t align,
                                        qm_chunk_kind_t kind, size_t held, size_t held_align,
                                        const qm_kept_t *kept) QM_COLD;
/* An entry of a small-chunk free list (of the class of class_bytes) that is
 * not a free chunk of that class: "corrupted free list". */
_Noreturn void qm__report_bad_entry(size_t class_bytes, uintptr_t entry, const char *why) QM_COLD;
/* A free of p another thread owns that could not be sent for want of
 * memory. */
_Noreturn void qm__report_send_failed(const void *p) QM_COLD;
/* A syscall failed with an errno qmalloc cannot handle (anything but
 * ENOMEM where the caller can degrade): a bug or a hostile environment. */
_Noreturn void qm__report_os_failure(const char *call, const void *addr, size_t len,
                                     int err) QM_COLD;

/* The SIGSEGV explanation, which does not abort (the process dies of the
 * signal afterwards): the first line for an access (rw: " (write)",
 * " (read)" or "") at a, then qm__report_call_stack("accessed", ...), the
 * kept stacks, and qm__report_fault_summary(). At a live chunk the line
 * says what was hit without "ERROR", and nothing follows the stack. */
void qm__report_fault_line(uintptr_t a, const qm_place_t *pl, const char *rw) QM_COLD;
void qm__report_fault_summary(const qm_place_t *pl, const uintptr_t *pc, unsigned n) QM_COLD;
/* The stacks kept with a large chunk (qm__large_kept reads them): the
 * freeing thread's once freed, then the allocating thread's. */
void qm__report_kept(const qm_kept_t *k) QM_COLD;

/* "  <heading> by thread N here:" and up to stack_frames (16 when 0)
 * frames of pc: the stack of the call or access that found an error. */
void qm__report_call_stack(const char *heading, const uintptr_t *pc, unsigned n) QM_COLD;

#endif
