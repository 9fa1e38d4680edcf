/* report.c: formats and writes every fatal error and warning. Fatal reports
 * end in abort() so that a core dump and the SIGABRT reach whoever watches
 * the process; a second fatal error while reporting aborts at once.
 */
#include "report.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

static atomic_int reporting;

static void emit_error(const char *what, const void *ptr, const char *details, size_t dlen) {
  qm_buf_t b;
  b.n = 0;
  qm_buf_str(&b, "qmalloc: ERROR: ");
  qm_buf_str(&b, what);
  if (ptr || !details) {
    qm_buf_str(&b, " ");
    qm_buf_hex(&b, (uintptr_t)ptr);
  }
  if (details && dlen) {
    qm_buf_str(&b, " (");
    qm_buf_mem(&b, details, dlen);
    qm_buf_str(&b, ")");
  }
  qm_buf_str(&b, "\n");
  qm_buf_flush(&b, STDERR_FILENO);
}

static _Noreturn void die(void) { abort(); }

_Noreturn void qm__report_fatal(const char *what, const void *ptr, const char *details) {
  if (atomic_exchange(&reporting, 1))
    die();
  size_t len = 0;
  while (details && details[len])
    len++;
  emit_error(what, ptr, details, len);
  die();
}

_Noreturn void qm__report_fatal_buf(const char *what, const void *ptr, qm_buf_t *details) {
  if (atomic_exchange(&reporting, 1))
    die();
  emit_error(what, ptr, details->s, details->n);
  die();
}

_Noreturn void qm__report_os_failure(const char *call, const void *addr, size_t len, int err) {
  qm_buf_t d;
  d.n = 0;
  qm_buf_str(&d, "length ");
  qm_buf_dec(&d, len);
  qm_buf_str(&d, ", errno ");
  qm_buf_dec(&d, (uint64_t)err);
  qm_buf_t w;
  w.n = 0;
  qm_buf_str(&w, "unexpected ");
  qm_buf_str(&w, call);
  qm_buf_str(&w, " failure at");
  w.s[w.n < sizeof(w.s) ? w.n : sizeof(w.s) - 1] = 0;
  qm__report_fatal_buf(w.s, addr, &d);
}

_Noreturn void qm__check_failed(const char *file, int line, const char *what, uint64_t a,
                                uint64_t b) {
  qm_buf_t d;
  d.n = 0;
  qm_buf_str(&d, what);
  qm_buf_str(&d, " at ");
  qm_buf_str(&d, file);
  qm_buf_str(&d, ":");
  qm_buf_dec(&d, (uint64_t)line);
  qm_buf_str(&d, ", operands ");
  qm_buf_dec(&d, a);
  qm_buf_str(&d, " and ");
  qm_buf_dec(&d, b);
  if (atomic_exchange(&reporting, 1))
    die();
  emit_error("internal check failed:", NULL, d.s, d.n);
  die();
}

void qm__warn_buf(qm_buf_t *line) {
  qm_buf_t b;
  b.n = 0;
  qm_buf_str(&b, "qmalloc: WARNING: ");
  qm_buf_mem(&b, line->s, line->n);
  qm_buf_str(&b, "\n");
  qm_buf_flush(&b, STDERR_FILENO);
}

_Noreturn void qm__report_size_mismatch(const char *call, const void *ptr, size_t passed,
                                        size_t align, const char *kind, size_t held) {
  qm_buf_t d, w;
  d.n = w.n = 0;
  qm_buf_str(&d, "passed ");
  if (passed != SIZE_MAX) {
    qm_buf_dec(&d, passed);
    qm_buf_str(&d, align ? " bytes, " : " bytes");
  }
  if (align) {
    qm_buf_str(&d, "alignment ");
    qm_buf_dec(&d, align);
  }
  qm_buf_str(&d, ", ");
  qm_buf_str(&d, kind);
  qm_buf_str(&d, " chunk holds ");
  qm_buf_dec(&d, held);
  qm_buf_str(&w, "size mismatch in ");
  qm_buf_str(&w, call);
  qm_buf_str(&w, " of");
  w.s[w.n < sizeof w.s ? w.n : sizeof w.s - 1] = 0;
  qm__report_fatal_buf(w.s, ptr, &d);
}

_Noreturn void qm__report_bad_entry(size_t class_bytes, uintptr_t entry, const char *why) {
  qm_buf_t d;
  d.n = 0;
  qm_buf_str(&d, why);
  qm_buf_str(&d, ", class ");
  qm_buf_dec(&d, class_bytes);
  qm_buf_str(&d, " bytes");
  qm__report_fatal_buf("corrupted free list: entry", (const void *)entry, &d);
}
