/* wrappers.c: the libc names libqmalloc exports, and nothing else. Each is
 * the qm_ function of the same name; the shared library is linked with
 * -Bsymbolic-functions, so these calls bind directly inside it. Not built
 * into the prefix-only library that the unit tests link.
 */
#include <errno.h>
#include <malloc.h>
#include <stdlib.h>

#include "alloc.h"
#include "qm.h"
#include "qmalloc.h"

/* C23 and glibc-internal names that Debian 12's headers do not declare */
void free_sized(void *p, size_t n);
void free_aligned_sized(void *p, size_t a, size_t n);
void *__libc_malloc(size_t n);
void __libc_free(void *p);
void *__libc_calloc(size_t n, size_t m);
void *__libc_realloc(void *p, size_t n);
void *__libc_memalign(size_t a, size_t n);
void *__libc_valloc(size_t n);
void *__libc_pvalloc(size_t n);
void _ZdlPv(void *p);
void _ZdaPv(void *p);
void _ZdlPvRKSt9nothrow_t(void *p, const void *nothrow);
void _ZdaPvRKSt9nothrow_t(void *p, const void *nothrow);

QM_EXPORT void *malloc(size_t n) { return qm_malloc(n); }
QM_EXPORT void free(void *p) { qm_free(p); }
QM_EXPORT void *calloc(size_t n, size_t m) { return qm_calloc(n, m); }
QM_EXPORT void *realloc(void *p, size_t n) { return qm_realloc(p, n); }
QM_EXPORT void *reallocarray(void *p, size_t n, size_t m) { return qm_reallocarray(p, n, m); }
QM_EXPORT int posix_memalign(void **out, size_t a, size_t n) {
  return qm_posix_memalign(out, a, n);
}
QM_EXPORT void *aligned_alloc(size_t a, size_t n) { return qm_aligned_alloc(a, n); }
QM_EXPORT void *memalign(size_t a, size_t n) { return qm_memalign(a, n); }
QM_EXPORT void *valloc(size_t n) { return qm_valloc(n); }
QM_EXPORT void *pvalloc(size_t n) { return qm_pvalloc(n); }
QM_EXPORT size_t malloc_usable_size(void *p) { return qm_malloc_usable_size(p); }
size_t malloc_object_size(const void *p);
QM_EXPORT size_t malloc_object_size(const void *p) { return qm_malloc_object_size(p); }
QM_EXPORT void free_sized(void *p, size_t n) { qm_free_sized(p, n); }
QM_EXPORT void free_aligned_sized(void *p, size_t a, size_t n) { qm_free_aligned_sized(p, a, n); }
QM_EXPORT struct mallinfo2 mallinfo2(void) { return qm_mallinfo2(); }
QM_EXPORT int malloc_trim(size_t pad) { return qm_malloc_trim(pad); }
QM_EXPORT void malloc_stats(void) { qm_malloc_stats(); }

/* The old int-sized mallinfo, saturated rather than wrapped. */
QM_EXPORT struct mallinfo mallinfo(void) {
  struct mallinfo2 m = qm_mallinfo2();
  struct mallinfo r;
#define SAT(x) ((x) > 0x7fffffff ? 0x7fffffff : (int)(x))
  r.arena = SAT(m.arena);
  r.ordblks = SAT(m.ordblks);
  r.smblks = SAT(m.smblks);
  r.hblks = SAT(m.hblks);
  r.hblkhd = SAT(m.hblkhd);
  r.usmblks = SAT(m.usmblks);
  r.fsmblks = SAT(m.fsmblks);
  r.uordblks = SAT(m.uordblks);
  r.fordblks = SAT(m.fordblks);
  r.keepcost = SAT(m.keepcost);
#undef SAT
  return r;
}

/* C++'s operator delete, all of its forms, by their Itanium ABI names: the
 * sized and aligned ones are checked as free_sized and free_aligned_sized
 * are (what operator new asked for is what free_sized expects, up to its
 * 0 -> 1 and alignment round-up). Defined here so that no libstdc++ is
 * needed; a program that replaces operator delete itself keeps its own.
 * operator new stays libstdc++'s (it throws), which calls malloc. */
#define DELETE_PLAIN(name)                                                                         \
  QM_EXPORT void name(void *p) { qm_free(p); }
#define DELETE_NOTHROW(name)                                                                       \
  QM_EXPORT void name(void *p, const void *nothrow) { (void)nothrow, qm_free(p); }
DELETE_PLAIN(_ZdlPv)                 /* operator delete(void*) */
DELETE_PLAIN(_ZdaPv)                 /* operator delete[](void*) */
DELETE_NOTHROW(_ZdlPvRKSt9nothrow_t) /* (void*, nothrow_t const&) */
DELETE_NOTHROW(_ZdaPvRKSt9nothrow_t)
void _ZdlPvm(void *p, size_t n);
void _ZdaPvm(void *p, size_t n);
void _ZdlPvSt11align_val_t(void *p, size_t a);
void _ZdaPvSt11align_val_t(void *p, size_t a);
void _ZdlPvmSt11align_val_t(void *p, size_t n, size_t a);
void _ZdaPvmSt11align_val_t(void *p, size_t n, size_t a);
void _ZdlPvSt11align_val_tRKSt9nothrow_t(void *p, size_t a, const void *nt);
void _ZdaPvSt11align_val_tRKSt9nothrow_t(void *p, size_t a, const void *nt);
QM_EXPORT void _ZdlPvm(void *p, size_t n) {
  qm__free_checked("operator delete", p, 0, n, QM_FREE_SIZED | QM_FREE_CXX);
}
QM_EXPORT void _ZdaPvm(void *p, size_t n) {
  qm__free_checked("operator delete[]", p, 0, n, QM_FREE_SIZED | QM_FREE_CXX);
}
QM_EXPORT void _ZdlPvSt11align_val_t(void *p, size_t a) {
  qm__free_checked("operator delete", p, a, 0, QM_FREE_ALIGNED | QM_FREE_CXX);
}
QM_EXPORT void _ZdaPvSt11align_val_t(void *p, size_t a) {
  qm__free_checked("operator delete[]", p, a, 0, QM_FREE_ALIGNED | QM_FREE_CXX);
}
QM_EXPORT void _ZdlPvmSt11align_val_t(void *p, size_t n, size_t a) {
  qm__free_checked("operator delete", p, a, n, QM_FREE_SIZED | QM_FREE_ALIGNED | QM_FREE_CXX);
}
QM_EXPORT void _ZdaPvmSt11align_val_t(void *p, size_t n, size_t a) {
  qm__free_checked("operator delete[]", p, a, n, QM_FREE_SIZED | QM_FREE_ALIGNED | QM_FREE_CXX);
}
QM_EXPORT void _ZdlPvSt11align_val_tRKSt9nothrow_t(void *p, size_t a, const void *nt) {
  (void)nt;
  qm__free_checked("operator delete", p, a, 0, QM_FREE_ALIGNED | QM_FREE_CXX);
}
QM_EXPORT void _ZdaPvSt11align_val_tRKSt9nothrow_t(void *p, size_t a, const void *nt) {
  (void)nt;
  qm__free_checked("operator delete[]", p, a, 0, QM_FREE_ALIGNED | QM_FREE_CXX);
}

/* glibc's internal names, which some programs and libraries call directly */
QM_EXPORT void *__libc_malloc(size_t n) { return qm_malloc(n); }
QM_EXPORT void __libc_free(void *p) { qm_free(p); }
QM_EXPORT void *__libc_calloc(size_t n, size_t m) { return qm_calloc(n, m); }
QM_EXPORT void *__libc_realloc(void *p, size_t n) { return qm_realloc(p, n); }
QM_EXPORT void *__libc_memalign(size_t a, size_t n) { return qm_memalign(a, n); }
QM_EXPORT void *__libc_valloc(size_t n) { return qm_valloc(n); }
QM_EXPORT void *__libc_pvalloc(size_t n) { return qm_pvalloc(n); }
