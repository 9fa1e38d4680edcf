/* os.c: the only file that calls mmap, munmap, mprotect, madvise and mremap.
 * Invariants: every range is page-aligned and non-empty when a syscall is
 * made; every syscall is counted; errno policy as written in os.h (ENOMEM to
 * the caller, feature-probe EINVAL to the caller, the rest fatal).
 */
#include "os.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "qm.h"
#include "report.h"
#include "seal.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
#ifndef MADV_GUARD_INSTALL
#define MADV_GUARD_INSTALL 102 /* Linux 6.13, commit 662df3e5c376 */
#endif
#ifndef MADV_GUARD_REMOVE
#define MADV_GUARD_REMOVE 103
#endif
#ifndef MREMAP_DONTUNMAP
#define MREMAP_DONTUNMAP 4 /* Linux 5.7 */
#endif

qm_os_counters_t qm__os_counts;

#define COUNT(field) atomic_fetch_add_explicit(&qm__os_counts.field, 1, memory_order_relaxed)

/* Classifies a failed call's errno and puts back the caller's errno: the
 * layers above decide what errno the application finally sees. */
static int check(const char *call, void *p, size_t len, bool einval_ok, int saved) {
  int err = errno;
  errno = saved;
  /* EAGAIN: RLIMIT_MEMLOCK under mlockall(MCL_FUTURE), out of memory that
   * may be locked */
  if (err == EAGAIN)
    err = ENOMEM;
  if (err == ENOMEM || (einval_ok && err == EINVAL))
    return err;
  qm__report_os_failure(call, p, len, err);
}

#ifdef QM_TEST_HOOKS
/* Test hook: ranges given to the kernel that are not whole pages of the
 * page size the process runs with (a 4 KiB assumption on a 16 or 64 KiB
 * kernel), counted where release builds check nothing */
static atomic_size_t off_page;
size_t qm__os_off_page(void) { return atomic_load(&off_page); }
#define WHOLE_PAGES(p, len)                                                                        \
  ((((uintptr_t)(p) | (len)) & (qm__page - 1)) || !(len) ? (void)atomic_fetch_add(&off_page, 1)    \
                                                         : (void)0)
#else
#define WHOLE_PAGES(p, len) ((void)0)
#endif

static void check_range(void *p, size_t len) {
  WHOLE_PAGES(p, len);
  QM_DCHECK(((uintptr_t)p & (qm__page - 1)) == 0);
  QM_DCHECK(len && (len & (qm__page - 1)) == 0);
  (void)p;
  (void)len;
}

int qm_os_map(size_t len, size_t align, qm_prot_t prot, void **out) {
  int pr = prot == QM_PROT_RW ? PROT_READ | PROT_WRITE : PROT_NONE;
  int flags = MAP_PRIVATE | MAP_ANONYMOUS;
  if (align < qm__page)
    align = qm__page;
  size_t span = len + (align > qm__page ? align - qm__page : 0);
  if (span < len)
    return ENOMEM;
  WHOLE_PAGES(0, span);
  COUNT(mmap);
  int saved = errno;
  void *p = mmap(NULL, span, pr, flags, -1, 0);
  if (p == MAP_FAILED) {
    /* a length this address space cannot hold is EINVAL under some
     * emulators (valgrind): the same answer as ENOMEM for the caller */
    int err = check("mmap", NULL, span, true, saved);
    return err == EINVAL ? ENOMEM : err;
  }
  if (span != len) { /* trim the unaligned head and tail */
    uintptr_t a = qm_align_up((uintptr_t)p, align);
    size_t head = a - (uintptr_t)p, tail = span - head - len;
    if (head)
      qm_os_unmap(p, head);
    if (tail)
      qm_os_unmap((void *)(a + len), tail);
    p = (void *)a;
  }
  *out = p;
  return 0;
}

int qm_os_map_guarded(size_t len, qm_prot_t prot, void **out) {
  void *p;
  int err = qm_os_map(len + 2 * qm__page, 0, QM_PROT_NONE, &p);
  if (err)
    return err;
  char *mid = (char *)p + qm__page;
  err = qm_os_protect(mid, len, QM_PROT_NONE, prot);
  if (err) {
    qm_os_unmap(p, len + 2 * qm__page);
    return err;
  }
  *out = mid;
  return 0;
}

int qm_os_unmap_guarded(void *p, size_t len) {
  return qm_os_unmap((char *)p - qm__page, len + 2 * qm__page);
}

/* MAP_NORESERVE: the reservation is address space only, and a part made
 * writable is not charged to the commit limit either (under overcommit
 * mode 2 the kernel ignores the flag and charges it at mprotect, as for
 * qm_os_map); without VM_ACCOUNT a part made inaccessible again has the
 * same flags as its neighbours and merges back with them. */
int qm_os_reserve(size_t len, void **out) {
  WHOLE_PAGES(0, len);
  COUNT(mmap);
  int saved = errno;
  void *p = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    int err = check("mmap", NULL, len, true, saved);
    return err == EINVAL ? ENOMEM : err;
  }
  *out = p;
  return 0;
}

int qm_os_claim(void *p, size_t len, qm_prot_t prot) {
  check_range(p, len);
  COUNT(mmap);
  int pr = prot == QM_PROT_RW ? PROT_READ | PROT_WRITE : PROT_NONE;
  int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE;
  if (prot == QM_PROT_NONE)
    flags |= MAP_NORESERVE;
  int saved = errno;
  void *r = mmap(p, len, pr, flags, -1, 0);
  if (r == MAP_FAILED) {
    if (errno == EEXIST) { /* someone else's mapping: never replaced */
      errno = saved;
      return ENOMEM;
    }
    /* EINVAL: past the address space the kernel gives the process */
    int err = check("mmap(MAP_FIXED_NOREPLACE)", p, len, true, saved);
    return err == EINVAL ? ENOMEM : err;
  }
  if (r != p) {
    /* before 4.17 the flag is unknown, ignored: p was a hint and the kernel
     * chose elsewhere, since something is at p */
    qm_os_unmap(r, len);
    return ENOMEM;
  }
  return 0;
}

int qm_os_map_fixed(void *p, size_t len, qm_prot_t prot) {
  check_range(p, len);
  COUNT(mmap);
  int pr = prot == QM_PROT_RW ? PROT_READ | PROT_WRITE : PROT_NONE;
  int saved = errno;
  void *r = mmap(p, len, pr, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
  if (r == MAP_FAILED)
    return check("mmap(MAP_FIXED)", p, len, false, saved);
  QM_CHECK_OP((uintptr_t)r, ==, (uintptr_t)p);
  return 0;
}
int qm_os_reserve_fixed(void *p, size_t len) { return qm_os_map_fixed(p, len, QM_PROT_NONE); }

int qm_os_unmap(void *p, size_t len) {
  if (!len)
    return 0;
  check_range(p, len);
  COUNT(munmap);
  int saved = errno;
  /* munmap of part of a mapping splits it, so it too can hit the map count */
  return munmap(p, len) ? check("munmap", p, len, false, saved) : 0;
}

int qm_os_protect(void *p, size_t len, qm_prot_t from, qm_prot_t to) {
  if (!len || from == to) {
    atomic_fetch_add_explicit(&qm__os_counts.skipped, 1, memory_order_relaxed);
    return 0;
  }
  check_range(p, len);
  COUNT(mprotect);
  int pr = to == QM_PROT_RW ? PROT_READ | PROT_WRITE : PROT_NONE;
  int saved = errno;
  return mprotect(p, len, pr) ? check("mprotect", p, len, false, saved) : 0;
}

static int advise(void *p, size_t len, int advice, const char *name, bool einval_ok) {
  if (!len)
    return 0;
  check_range(p, len);
  COUNT(madvise);
  int saved = errno;
  return madvise(p, len, advice) ? check(name, p, len, einval_ok, saved) : 0;
}

/* What MADV_DONTNEED does, where the kernel refuses it with EINVAL: on
 * locked pages (mlock, mlockall), the only EINVAL a page-aligned range of
 * ours can get. The range is mapped afresh with the protection it has:
 * MAP_FIXED replaces it in one call, so it is never free for another mmap to
 * take (a quarantined range stays reserved and inaccessible), and its pages
 * are gone. MAP_LOCKED keeps the new mapping locked like its neighbours
 * (with MCL_FUTURE it would be anyway), so they can merge again; where
 * RLIMIT_MEMLOCK refuses that (EAGAIN), without. A fresh RW mapping that is
 * locked is faulted in at once: the pages read zero, as after DONTNEED. */
static int remap_fresh(void *p, size_t len, qm_prot_t prot) {
  int pr = prot == QM_PROT_RW ? PROT_READ | PROT_WRITE : PROT_NONE;
  int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED;
  int saved = errno;
  COUNT(mmap);
  void *r = mmap(p, len, pr, flags | MAP_LOCKED, -1, 0);
  if (r == MAP_FAILED && errno == EAGAIN) {
    COUNT(mmap);
    r = mmap(p, len, pr, flags, -1, 0);
  }
  if (r == MAP_FAILED)
    return check("mmap(MAP_FIXED)", p, len, false, saved);
  QM_CHECK_OP((uintptr_t)r, ==, (uintptr_t)p);
  COUNT(remapped);
  return 0;
}

int qm_os_dontneed(void *p, size_t len, qm_prot_t prot) {
  int r = advise(p, len, MADV_DONTNEED, "madvise(MADV_DONTNEED)", true);
  return r == EINVAL ? remap_fresh(p, len, prot) : r;
}
int qm_os_free_lazy(void *p, size_t len, qm_prot_t prot) {
  /* MADV_FREE is 4.5+; where it is missing, DONTNEED does the same and
   * more; on locked pages both are refused */
  int r = advise(p, len, MADV_FREE, "madvise(MADV_FREE)", true);
  return r == EINVAL ? qm_os_dontneed(p, len, prot) : r;
}
int qm_os_nohugepage(void *p, size_t len) {
  return advise(p, len, MADV_NOHUGEPAGE, "madvise(MADV_NOHUGEPAGE)", true);
}
int qm_os_hugepage(void *p, size_t len) {
  return advise(p, len, MADV_HUGEPAGE, "madvise(MADV_HUGEPAGE)", true);
}
#ifdef QM_TEST_HOOKS
static atomic_bool no_populate; /* as before 5.14: MADV_POPULATE_WRITE is EINVAL */
void qm__os_no_populate(bool on) { atomic_store(&no_populate, on); }
#endif

int qm_os_populate(void *p, size_t len) {
  if (!len)
    return 0;
  check_range(p, len);
  COUNT(madvise);
  int saved = errno, r;
#ifdef QM_TEST_HOOKS
  if (atomic_load(&no_populate))
    r = EINVAL;
  else
#endif
    r = madvise(p, len, MADV_POPULATE_WRITE) ? errno : 0;
  errno = saved;
  if (r == EINVAL) {
    /* before 5.14 (5.10): a write to each page, an atomic or of 0 that
     * leaves the word as another thread has it; without it the ring of
     * dead records faulted ~100 pages in 1024 reuses on 5.10.265. The
     * access is volatile: an or of 0 whose result is unused changes
     * nothing in the C model, and clang (19) removed it, so nothing was
     * prefilled (a plain store of the byte read could undo a racing
     * writer's store) */
    for (size_t off = 0; off < len; off += qm__page)
      atomic_fetch_or_explicit((volatile _Atomic uint64_t *)((char *)p + off), 0,
                               memory_order_relaxed);
    r = 0;
  }
  return r;
}
/* Whether guard markers fault: tested once, on a scratch page of our own
 * (RW, so that only the marker can make it fault: a range given to
 * qm_os_guard_install may be PROT_NONE already), by a write(2) from it to
 * a pipe, EFAULT where the marker is there. qemu-user (7.2) answers 0 to
 * every madvise it does not pass through, the markers included, and
 * installs nothing. Where the test cannot be made (no fd, no memory left),
 * the kernel's answer is trusted. */
static bool guard_markers_fault(void) {
  int saved = errno;
  bool faults = true;
  void *p = mmap(NULL, qm__page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  int fd[2];
  if (p != MAP_FAILED) {
    COUNT(mmap);
    COUNT(madvise);
    if (!madvise(p, qm__page, MADV_GUARD_INSTALL) && !pipe2(fd, O_CLOEXEC | O_NONBLOCK)) {
      faults = write(fd[1], p, 1) < 0 && errno == EFAULT;
      close(fd[0]);
      close(fd[1]);
    }
    COUNT(munmap);
    munmap(p, qm__page);
  }
  errno = saved;
  return faults;
}

/* 0 not known yet, 1 the markers work, 2 they do not (EINVAL from then on:
 * the callers fall back to mprotect as on a kernel before 6.13) */
static atomic_int guard_works;

int qm_os_guard_install(void *p, size_t len) {
  int k = atomic_load_explicit(&guard_works, memory_order_relaxed);
  if (k == 2)
    return EINVAL;
  int r = advise(p, len, MADV_GUARD_INSTALL, "madvise(MADV_GUARD_INSTALL)", true);
  if (r || k == 1)
    return r;
  bool ok = guard_markers_fault();
  atomic_store_explicit(&guard_works, ok ? 1 : 2, memory_order_relaxed);
  return ok ? 0 : EINVAL;
}
int qm_os_guard_remove(void *p, size_t len) {
  return advise(p, len, MADV_GUARD_REMOVE, "madvise(MADV_GUARD_REMOVE)", true);
}

#ifdef QM_TEST_HOOKS
/* Test hook: moves as on 5.10 and 5.15 (see qm_os_move_spans_vmas), on any
 * kernel. A move of a range that is not one VMA unmaps the destination and
 * fails with EFAULT, as theirs does, and is counted. */
static atomic_bool one_vma;
static atomic_size_t refused;

/* Whether [p, p+len) lies in one line of /proc/self/maps (the kernel merges
 * neighbours it can, so one line is one VMA). Read in pieces: no
 * allocation; a line is far shorter than the buffer. With `out`, the lines
 * the range touches go to it (a refused move's VMAs, to show which merge
 * the kernel did not make). */
static bool one_vma_range(uintptr_t p, size_t len, qm_buf_t *out) {
  int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return true;
  char buf[4096]; /* a read buffer, not a page */
  size_t have = 0;
  bool found = false, one = false, done = false;
  for (;;) {
    ssize_t r = read(fd, buf + have, sizeof buf - 1 - have);
    if (r < 0 && errno == EINTR)
      continue;
    if (r > 0)
      have += (size_t)r;
    buf[have] = 0;
    char *line = buf, *nl;
    while (!done && (nl = strchr(line, '\n'))) {
      char *e;
      uintptr_t lo = strtoul(line, &e, 16), hi = strtoul(e + 1, NULL, 16);
      if (!found && lo <= p && p < hi) {
        found = true;
        one = p + len <= hi;
      }
      if (out && lo < p + len && hi > p) {
        qm_buf_str(out, "  ");
        qm_buf_mem(out, line, (size_t)(nl + 1 - line));
      }
      done = out ? lo >= p + len : found;
      line = nl + 1;
    }
    have -= (size_t)(line - buf);
    memmove(buf, line, have);
    if (done || r <= 0)
      break;
  }
  close(fd);
  return one;
}

void qm__os_one_vma_moves(bool on) { atomic_store(&one_vma, on); }
size_t qm__os_refused_moves(void) { return atomic_load(&refused); }
#endif

int qm_os_move(void *old, size_t len, void *to, bool dontunmap) {
  check_range(old, len);
  check_range(to, len);
#ifdef QM_TEST_HOOKS
  if (atomic_load(&one_vma) && !one_vma_range((uintptr_t)old, len, NULL)) {
    int saved = errno;
    qm_buf_t b = {.n = 0};
    qm_buf_str(&b, "qmalloc test hook: a move of several VMAs refused, ");
    qm_buf_hex(&b, (uintptr_t)old);
    qm_buf_str(&b, "+");
    qm_buf_dec(&b, len);
    qm_buf_str(&b, " to ");
    qm_buf_hex(&b, (uintptr_t)to);
    qm_buf_str(&b, ":\n");
    one_vma_range((uintptr_t)old, len, &b);
    qm_buf_flush(&b, 2);
    COUNT(munmap);
    munmap(to, len);
    errno = saved;
    atomic_fetch_add(&refused, 1);
    return EFAULT;
  }
#endif
  COUNT(mremap);
  int flags = MREMAP_MAYMOVE | MREMAP_FIXED | (dontunmap ? MREMAP_DONTUNMAP : 0);
  int saved = errno;
  void *r = mremap(old, len, len, flags, to);
  if (r != MAP_FAILED)
    return 0;
  if (errno == EFAULT) { /* several VMAs, where the kernel moves one only */
    errno = saved;
    return EFAULT;
  }
  return check("mremap", old, len, true, saved);
}

/* One mremap() of a range made of several VMAs: 5.10 and 5.15 refuse it
 * with EFAULT (vma_to_resize(): "We can't remap across vm area
 * boundaries"), and only after unmapping the MREMAP_FIXED destination; 6.18
 * moves it. So the test moves two scratch VMAs (RW, then read-only) onto two
 * scratch PROT_NONE pages, and where that fails it leaves the destination
 * alone: the kernel may have unmapped it, and another thread may have
 * mapped something there since. Those two pages of address space are the
 * price of the test where the move is refused. */
bool qm_os_move_spans_vmas(void) {
  static atomic_int known; /* 0 not tested, 1 yes, 2 no */
#ifdef QM_TEST_HOOKS
  if (atomic_load(&one_vma))
    return false;
#endif
  int k = atomic_load_explicit(&known, memory_order_relaxed);
  if (k)
    return k == 1;
  int saved = errno;
  size_t len = 2 * qm__page;
  int flags = MAP_PRIVATE | MAP_ANONYMOUS;
  COUNT(mmap);
  char *src = mmap(NULL, len, PROT_READ | PROT_WRITE, flags, -1, 0);
  COUNT(mmap);
  char *dst = mmap(NULL, len, PROT_NONE, flags, -1, 0);
  COUNT(mprotect);
  if (src != MAP_FAILED && dst != MAP_FAILED && !mprotect(src + qm__page, qm__page, PROT_READ)) {
    COUNT(mremap);
    bool moved =
        mremap(src, len, len, MREMAP_MAYMOVE | MREMAP_FIXED | MREMAP_DONTUNMAP, dst) == (void *)dst;
    if (moved) {
      COUNT(munmap);
      munmap(dst, len);
    }
    k = moved ? 1 : 2;
    atomic_store_explicit(&known, k, memory_order_relaxed);
  } else if (dst != MAP_FAILED) {
    COUNT(munmap);
    munmap(dst, len);
  }
  if (src != MAP_FAILED) {
    COUNT(munmap);
    munmap(src, len);
  }
  errno = saved;
  return k == 1;
}
