/* qm.h: definitions every qmalloc source file shares: branch hints, checks,
 * alignment arithmetic and the page size. Nothing here allocates or makes a
 * syscall; it is safe to include from any layer.
 */
#ifndef QM_QM_H
#define QM_QM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define QM_LIKELY(x) __builtin_expect(!!(x), 1)
#define QM_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define QM_COLD __attribute__((cold, noinline))
#define QM_INLINE static inline __attribute__((always_inline))
#define QM_HIDDEN __attribute__((visibility("hidden")))
/* 1 in a build under AddressSanitizer (gcc defines the macro, clang the
 * feature) */
#if defined(__SANITIZE_ADDRESS__)
#define QM_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define QM_ASAN 1
#endif
#endif
#ifndef QM_ASAN
#define QM_ASAN 0
#endif
#define QM_EXPORT __attribute__((visibility("default")))

/* Every chunk qmalloc returns is aligned to this, as glibc's are on x86-64. */
#define QM_MIN_ALIGN 16u

/* Largest request anything will try to serve: larger is ENOMEM at once, so
 * that size arithmetic below can never overflow. */
#define QM_MAX_REQUEST ((size_t)1 << 46)

/* Bits of a chunk address in the small allocator's words (bin slots, parked
 * frees, table entries): the bits above carry a generation or a class. The
 * primary's reservation is checked to end below it (primary.c); the kernel
 * maps above 47 bits only at a hint past them (5-level paging, Linux 4.14). */
#define QM_ADDR_BITS 48
#define QM_ADDR_MASK (((uintptr_t)1 << QM_ADDR_BITS) - 1)

/* The page size, read from the auxiliary vector at init (4 KiB on x86-64,
 * 4/16/64 KiB on arm64). Zero until qm__init_page_size() ran. */
extern QM_HIDDEN size_t qm__page;
extern QM_HIDDEN unsigned qm__page_shift;
void qm__init_page_size(void);

QM_INLINE uintptr_t qm_align_up(uintptr_t x, uintptr_t a) { return (x + a - 1) & ~(a - 1); }
QM_INLINE uintptr_t qm_align_down(uintptr_t x, uintptr_t a) { return x & ~(a - 1); }
QM_INLINE bool qm_is_pow2(size_t x) { return x && !(x & (x - 1)); }
QM_INLINE size_t qm_page_up(size_t x) { return qm_align_up(x, qm__page); }
QM_INLINE size_t qm_pages(size_t bytes) { return qm_page_up(bytes) >> qm__page_shift; }

/* Always-on check: a broken invariant is a bug in qmalloc or memory
 * corruption, reported with both operands and the place, then abort. */
#define QM_CHECK(cond)                                                                             \
  do {                                                                                             \
    if (QM_UNLIKELY(!(cond)))                                                                      \
      qm__check_failed(__FILE__, __LINE__, #cond, 0, 0);                                           \
  } while (0)
#define QM_CHECK_OP(a, op, b)                                                                      \
  do {                                                                                             \
    uint64_t qm_a_ = (uint64_t)(a), qm_b_ = (uint64_t)(b);                                         \
    if (QM_UNLIKELY(!(qm_a_ op qm_b_)))                                                            \
      qm__check_failed(__FILE__, __LINE__, #a " " #op " " #b, qm_a_, qm_b_);                       \
  } while (0)

/* Debug-only check: still type-checked in release builds, costs nothing. */
#ifdef QM_DEBUG
#define QM_DCHECK(cond) QM_CHECK(cond)
#else
#define QM_DCHECK(cond)                                                                            \
  do {                                                                                             \
    while (0 && (cond)) {                                                                          \
    }                                                                                              \
  } while (0)
#endif

_Noreturn void qm__check_failed(const char *file, int line, const char *what, uint64_t a,
                                uint64_t b) QM_COLD;

#endif
