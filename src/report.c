/* report.c: formats and writes every fatal error and warning. Fatal reports
 * end in abort() so that a core dump and the SIGABRT reach whoever watches
 * the process; a second fatal error while reporting aborts at once. The log
 * file is opened at the first line written, by the process writing it.
 */
#include "report.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "options.h"
#include "stack.h"

static atomic_int reporting;

/* The log file of option log_path, PATH.<pid>: opened late rather than at
 * start-up, so that a daemon that closes every descriptor as it starts does
 * not close it, and a fork child writes its own file. The descriptor is
 * trusted only while it is still the file opened (a program may have closed
 * it and got the number back for a file of its own). A process whose file
 * cannot be opened, or is refused, says so once on stderr and does not try
 * again (failed_pid). */
static struct {
  int fd, pid, failed_pid;
  dev_t dev;
  ino_t ino;
} lg = {.fd = -1};

/* "qmalloc: WARNING: log_path: cannot open 'PATH': why; ..." on stderr only
 * (the log file is what failed). */
static void log_warn(const qm_buf_t *path, const char *why, int err) {
  qm_buf_t b;
  b.n = 0;
  qm_buf_str(&b, "qmalloc: WARNING: log_path: cannot open '");
  qm_buf_escaped(&b, path->s, path->n);
  qm_buf_str(&b, "': ");
  if (why) {
    qm_buf_str(&b, why);
  } else if (err == ENOENT) {
    qm_buf_str(&b, "its directory does not exist");
  } else if (err == ELOOP) {
    qm_buf_str(&b, "it is a symbolic link, refused");
  } else if (err == EACCES || err == EPERM) {
    qm_buf_str(&b, "permission denied");
  } else {
    qm_buf_str(&b, "errno ");
    qm_buf_dec(&b, (uint64_t)err);
  }
  qm_buf_str(&b, "; reports go to stderr only\n");
  qm_buf_flush(&b, STDERR_FILENO);
}

/* The file is opened as the process's effective user writes it: never
 * through a symbolic link (O_NOFOLLOW), and kept only if it is a regular
 * file with one link owned by that user, so that neither a link planted in
 * a shared directory nor a file another user made ahead of time gets the
 * reports, whatever the program's privileges. Created 0600: reports hold
 * addresses. */
static int log_fd(void) {
  if (!qm__opt_str.log_path[0])
    return -1;
  int pid = (int)getpid();
  struct stat st;
  if (lg.fd >= 0 && lg.pid == pid && !fstat(lg.fd, &st) && st.st_dev == lg.dev &&
      st.st_ino == lg.ino)
    return lg.fd;
  if (lg.failed_pid == pid)
    return -1;
  qm_buf_t path;
  path.n = 0;
  qm_buf_str(&path, qm__opt_str.log_path);
  qm_buf_str(&path, ".");
  qm_buf_dec(&path, (uint64_t)pid);
  if (path.n >= sizeof path.s)
    return -1;
  path.s[path.n] = 0;
  int saved = errno;
  int fd = open(path.s, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOCTTY | O_NOFOLLOW, 0600);
  int err = errno;
  const char *why = NULL;
  if (fd >= 0 && fstat(fd, &st)) {
    err = errno;
    close(fd);
    fd = -1;
  } else if (fd >= 0 && (!S_ISREG(st.st_mode) || st.st_nlink != 1 || st.st_uid != geteuid())) {
    why = "not a regular file with one link owned by the user writing it, refused";
    close(fd);
    fd = -1;
  }
  errno = saved;
  if (fd < 0) {
    lg.failed_pid = pid;
    log_warn(&path, why, err);
    return -1;
  }
  lg.fd = fd;
  lg.pid = pid;
  lg.dev = st.st_dev;
  lg.ino = st.st_ino;
  return fd;
}

#ifdef QM_TEST_HOOKS
void qm__report_log_forget(void) {
  lg.fd = -1;
  lg.pid = lg.failed_pid = 0;
}
#endif

void qm__report_out(qm_buf_t *b) {
  int fd = log_fd();
  if (fd >= 0) {
    size_t n = b->n;
    qm_buf_flush(b, fd);
    b->n = n;
  }
  qm_buf_flush(b, STDERR_FILENO);
}

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
  qm__report_out(&b);
}

/* The stack of the call that found the error, printed after the report's
 * first line, and the frame the SUMMARY line names: the caller's frames
 * outside qmalloc, taken here, on the way to abort, so that no fast path
 * pays for it. stack_frames=0 drops the stacks kept per chunk, not this
 * one (it then has the default's 16 frames). */
typedef struct offender {
  uintptr_t pc[QM_STACK_MAX];
  unsigned n;
} offender_t;

static unsigned call_frames(void) {
  unsigned f = (unsigned)qm__opt.stack_frames;
  return f ? f : 16;
}

void qm__report_call_stack(const char *heading, const uintptr_t *pc, unsigned n) {
  qm_buf_t b;
  b.n = 0;
  qm_buf_str(&b, "  ");
  qm_buf_str(&b, heading);
  qm_buf_str(&b, " by thread ");
  qm_buf_dec(&b, qm__thread_id());
  qm_buf_str(&b, " here:\n");
  qm__report_out(&b);
  qm__stack_print(pc, n < call_frames() ? n : call_frames());
}

void qm__report_summary(const char *kind, const uintptr_t *pc, unsigned n) {
  qm_buf_t b;
  b.n = 0;
  qm_buf_str(&b, "SUMMARY: qmalloc: ");
  /* the kind is the first line's words before the address ("double
   * free of" -> "double free") */
  size_t len = 0;
  while (kind[len])
    len++;
  if (len > 3 && (!memcmp(kind + len - 3, " of", 3) || !memcmp(kind + len - 3, " at", 3)))
    len -= 3;
  else if (len > 1 && kind[len - 1] == ':')
    len--;
  qm_buf_mem(&b, kind, len);
  if (n) {
    qm_buf_str(&b, " ");
    qm__frame_where(&b, pc[0]);
  }
  qm_buf_str(&b, "\n");
  qm__report_out(&b);
}

static __attribute__((noinline)) void offending_call(offender_t *o) {
  o->n = qm__stack_capture(o->pc, QM_STACK_MAX);
  qm__report_call_stack("detected in a call", o->pc, o->n);
}

const char qm__op_free[] = "invalid free of";

const char *qm__access_name(qm_access_t k) {
  switch (k) {
  case QM_ACC_UAF:
    return "use-after-free";
  case QM_ACC_OVERFLOW:
    return "heap overflow";
  case QM_ACC_UNDERFLOW:
    return "heap underflow";
  case QM_ACC_GUARD:
    return "heap overflow or underflow";
  case QM_ACC_WILD:
    return "wild access";
  case QM_ACC_LIVE:
    break;
  }
  return "access";
}

static _Noreturn void die(void) { abort(); }

/* The lines after the first: the offending call's stack, the chunk's kept
 * stacks (tail), the SUMMARY line; then abort. */
static _Noreturn void finish(const char *what, const void *ptr, qm_report_tail_t tail) {
  offender_t o;
  offending_call(&o);
  if (tail)
    tail(ptr);
  qm__report_summary(what, o.pc, o.n);
  die();
}

void qm__report_line(const char *what, const void *ptr, const char *details, size_t dlen) {
  emit_error(what, ptr, details, dlen);
}

_Noreturn void qm__report_fatal_tail(const char *what, const void *ptr, qm_buf_t *details,
                                     qm_report_tail_t tail) {
  if (atomic_exchange(&reporting, 1))
    die();
  emit_error(what, ptr, details->s, details->n);
  finish(what, ptr, tail);
}

_Noreturn void qm__report_fatal(const char *what, const void *ptr, const char *details) {
  if (atomic_exchange(&reporting, 1))
    die();
  size_t len = 0;
  while (details && details[len])
    len++;
  emit_error(what, ptr, details, len);
  finish(what, ptr, NULL);
}

_Noreturn void qm__report_fatal_buf(const char *what, const void *ptr, qm_buf_t *details) {
  if (atomic_exchange(&reporting, 1))
    die();
  emit_error(what, ptr, details->s, details->n);
  finish(what, ptr, NULL);
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
  finish("internal check failed:", NULL, NULL);
}

void qm__warn_buf(qm_buf_t *line) {
  qm_buf_t b;
  b.n = 0;
  qm_buf_str(&b, "qmalloc: WARNING: ");
  qm_buf_mem(&b, line->s, line->n);
  qm_buf_str(&b, "\n");
  qm__report_out(&b);
}

_Noreturn void qm__report_size_mismatch(const char *call, const void *ptr, bool sized,
                                        size_t passed, bool aligned, size_t align, const char *kind,
                                        size_t held, qm_report_tail_t tail) {
  qm_buf_t d, w;
  d.n = w.n = 0;
  qm_buf_str(&d, "passed ");
  if (sized) {
    qm_buf_dec(&d, passed);
    qm_buf_str(&d, aligned ? " bytes, " : " bytes");
  }
  if (aligned) {
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
  qm__report_fatal_tail(w.s, ptr, &d, tail);
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
