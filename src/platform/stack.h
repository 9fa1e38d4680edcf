/* stack.h: the calling thread's stack as return addresses, and frames
 * printed as "#N 0xPC (module+0xOFF) name". Capture allocates nothing and
 * takes no lock of qmalloc's; printing reads only what the loader mapped.
 */
#ifndef QM_STACK_H
#define QM_STACK_H

#include <stdbool.h>
#include <stdint.h>

#include "fmt.h"

#define QM_STACK_MAX 64 /* the most frames option stack_frames allows */

/* Up to max (<= QM_STACK_MAX) return addresses of the caller's callers,
 * innermost first, leaving out the frames inside qmalloc's own shared
 * object. 0 when max is 0, before qmalloc is initialised (the loader may be
 * the caller), and in a static program before constructors run (static
 * glibc allocates before the unwinder can work). */
unsigned qm__stack_capture(uintptr_t *pcs, unsigned max);

/* The kernel's id of the calling thread (cached per thread; renewed in a
 * fork child) and a monotonic clock in ms; neither allocates. */
uint32_t qm__thread_id(void);
uint64_t qm__clock_ms(void);

/* Once at init: the first unwind, so that no lazy set-up of the unwinder
 * happens later under a caller's lock or in a signal handler. */
void qm__unwind_init(void);
/* A stack taken by a caller that holds no lock of qmalloc's (the large
 * chunks' allocation, free and realloc): it waits while a fork is under
 * way, so that fork() never copies a thread inside libgcc's unwinder, whose
 * object_mutex a static program takes on every unwind (its tables are
 * registered by crtbeginT.o) and the child would find locked forever. */
unsigned qm__stack_capture_unlocked(uintptr_t *pcs, unsigned max);
/* Fork: prepare, first of qmalloc's handlers, waits until no thread is in
 * qm__stack_capture_unlocked; parent and child, last, open it again. */
void qm__unwind_fork_prepare(void);
void qm__unwind_fork_parent(void);
void qm__unwind_fork_child(void);
/* The markers that bracket qmalloc's code in its link order (text_lo.c,
 * text_hi.c): hot and cold parts each. */
void qm__text_lo(void);
void qm__text_lo_cold(void);
void qm__text_hi(void);
void qm__text_hi_cold(void);
/* A thread is inside the unwinder (with one thread: the caller itself). */
bool qm__unwind_busy(void);
/* In the child of a fork that interrupted this thread inside qmalloc. */
void qm__unwind_fork_child_nested(void);

/* Appends "#n 0xPC (module+0xOFF) symbol+0xN" for one frame: the module by
 * _dl_find_object (lock-free, async-signal-safe; glibc 2.35) or else
 * dl_iterate_phdr, the symbol from the module's dynamic symbol table. */
void qm__frame_format(qm_buf_t *b, unsigned n, uintptr_t pc);

/* "(module+0xOFF) symbol+0xN" of one frame (the part of a frame's line
 * after its pc; nothing when no module holds pc): the SUMMARY line's. */
void qm__frame_where(qm_buf_t *b, uintptr_t pc);
/* The first of pc[0..n) in the program's own code: outside libc and the
 * dynamic loader (qmalloc's frames are never taken); 0 if none is. Where a
 * report puts the blame: a bug found in puts's malloc is the program's. */
unsigned qm__frame_first_own(const uintptr_t *pc, unsigned n);

/* Prints n frames, one a line indented by four, with qm__out();
 * "(no stack recorded)" for none. */
void qm__stack_print(const uintptr_t *pc, unsigned n);

#endif
