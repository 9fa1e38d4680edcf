/* os_info.c: what the system says, read without changing anything: whether
 * a mapping could be had (limits, overcommit), which pages are resident,
 * /proc and /sys files, the mapping count and the page size. Every call
 * leaves errno as the caller had it.
 */
#include "os.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/auxv.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include "qm.h"
#include "seal.h"

bool qm_os_could_map(size_t span, size_t rw, size_t held) {
  if (span > (size_t)1 << 47)
    return false;
  int saved = errno;
  bool ok = true;
  struct rlimit r;
  if (!getrlimit(RLIMIT_AS, &r) && r.rlim_cur != RLIM_INFINITY) {
    long long vm = qm_os_read_number("/proc/self/statm"); /* pages mapped now */
    size_t now = vm > 0 ? (size_t)vm << qm__page_shift : 0;
    size_t after = now > held ? now - held : 0;
    ok = span <= r.rlim_cur && after <= r.rlim_cur - span;
  }
  /* 0 (heuristic) refuses one mapping larger than RAM and swap, 2 (strict)
   * refuses less still; 1 grants anything */
  if (ok && qm_os_read_number("/proc/sys/vm/overcommit_memory") != 1) {
    struct sysinfo si;
    if (!sysinfo(&si))
      ok = rw / si.mem_unit <= (size_t)si.totalram + si.totalswap;
  }
  errno = saved;
  return ok;
}

long qm_os_resident_pages(void *p, size_t len) {
  unsigned char vec[256];
  long n = 0;
  int saved = errno;
  for (size_t off = 0; off < len; off += sizeof vec * qm__page) {
    size_t chunk = len - off < sizeof vec * qm__page ? len - off : sizeof vec * qm__page;
    if (mincore((char *)p + off, chunk, vec)) {
      errno = saved;
      return -1;
    }
    for (size_t i = 0; i < qm_pages(chunk); i++)
      n += vec[i] & 1;
  }
  return n;
}

/* errno is the caller's, whatever the file did: a successful malloc must
 * leave it as it was (a missing /sys file set ENOENT once). */
long qm_os_read_file(const char *path, char *buf, size_t cap) {
  int saved = errno;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    errno = saved;
    return -1;
  }
  size_t n = 0;
  while (n + 1 < cap) {
    ssize_t r = read(fd, buf + n, cap - 1 - n);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      break;
    n += (size_t)r;
  }
  close(fd);
  buf[n] = 0;
  errno = saved;
  return (long)n;
}

long long qm_os_read_number(const char *path) {
  char buf[64];
  int saved = errno;
  long n = qm_os_read_file(path, buf, sizeof buf);
  errno = saved;
  if (n <= 0)
    return -1;
  long long v = -1;
  for (const char *s = buf; *s; s++) {
    if (*s >= '0' && *s <= '9')
      v = (v < 0 ? 0 : v * 10) + (*s - '0');
    else if (v >= 0)
      break;
  }
  return v;
}

long qm_os_count_mappings(void) {
  int saved = errno;
  int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    errno = saved;
    return -1;
  }
  char buf[4096]; /* a read buffer, not a page */
  long lines = 0;
  for (;;) {
    ssize_t r = read(fd, buf, sizeof buf);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      break;
    for (ssize_t i = 0; i < r; i++)
      lines += buf[i] == '\n';
  }
  close(fd);
  errno = saved;
  return lines;
}

/* The page size, from the auxiliary vector: here in the OS layer, below
 * both init and the probe, which calls it when it runs before init; every
 * page computation of qmalloc uses it (qm__page, qm__page_shift). Without
 * AT_PAGESZ (no kernel omits it), sysconf's answer; failing that, the
 * largest page size of the kernels qmalloc runs on (QM_RO_ALIGN, arm64's
 * 64 KiB): ranges aligned to it are aligned to any smaller page. */
void qm__init_page_size(void) {
  size_t pg = (size_t)getauxval(AT_PAGESZ);
  if (!qm_is_pow2(pg)) {
    long sc = sysconf(_SC_PAGESIZE);
    pg = sc > 0 && qm_is_pow2((size_t)sc) ? (size_t)sc : QM_RO_ALIGN;
  }
  qm__page_shift = (unsigned)__builtin_ctzll(pg);
  qm__page = pg;
}
