/* out.c: where every line qmalloc prints goes: stderr, and the log file of
 * option log_path (opened at the first line written, by the process writing
 * it); and the one-line warnings. Below the reports and the stack printer,
 * which write through it; calls nothing of qmalloc's but fmt.c.
 */
#include "out.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "options.h"

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
void qm__out_log_forget(void) {
  lg.fd = -1;
  lg.pid = lg.failed_pid = 0;
}
#endif

void qm__out(qm_buf_t *b) {
  int fd = log_fd();
  if (fd >= 0) {
    size_t n = b->n;
    qm_buf_flush(b, fd);
    b->n = n;
  }
  qm_buf_flush(b, STDERR_FILENO);
}

void qm__warn_buf(qm_buf_t *line) {
  qm_buf_t b;
  b.n = 0;
  qm_buf_str(&b, "qmalloc: WARNING: ");
  qm_buf_mem(&b, line->s, line->n);
  qm_buf_str(&b, "\n");
  qm__out(&b);
}
