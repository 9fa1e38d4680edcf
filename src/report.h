/* report.h: the one fatal path and the one warning path. Every error qmalloc
 * detects ends in qm__report_fatal(): one line on stderr in the format
 *   qmalloc: ERROR: <what> 0x<ptr> (<details>)
 * written with write(2), then abort(). Nothing here allocates.
 */
#ifndef QM_REPORT_H
#define QM_REPORT_H

#include "fmt.h"
#include "qm.h"

/* what: e.g. "double free of"; details: already formatted, may be NULL. */
_Noreturn void qm__report_fatal(const char *what, const void *ptr, const char *details) QM_COLD;

/* The same, with details taken from a buffer the caller filled. */
_Noreturn void qm__report_fatal_buf(const char *what, const void *ptr, qm_buf_t *details) QM_COLD;

/* A syscall failed with an errno qmalloc cannot handle (anything but
 * ENOMEM where the caller can degrade): a bug or a hostile environment. */
_Noreturn void qm__report_os_failure(const char *call, const void *addr, size_t len,
                                     int err) QM_COLD;

/* free_sized() (call names it) with a size or alignment the chunk (kind
 * "small" or "large", holding `held` requested bytes) was not allocated
 * with; passed SIZE_MAX and align 0 when none was passed. */
_Noreturn void qm__report_size_mismatch(const char *call, const void *ptr, size_t passed,
                                        size_t align, const char *kind, size_t held) QM_COLD;

/* An entry of a small-chunk free list (of the class of class_bytes) that is
 * not a free chunk of that class: "corrupted free list". */
_Noreturn void qm__report_bad_entry(size_t class_bytes, uintptr_t entry, const char *why) QM_COLD;

/* "qmalloc: WARNING: <line>" on stderr; never fatal. */
void qm__warn_buf(qm_buf_t *line) QM_COLD;

#endif
