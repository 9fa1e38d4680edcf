/* os_layout.c: the randomized layout: the part of the address space the
 * spans of qmalloc's own placing come from (qm_os_span), at a random base
 * and random gaps, and the spans claimed as they grow (qm_os_grow). Its
 * state is the next free address and the gap stream, both lock-free; it
 * maps nothing itself (qm_os_claim does, in os.c).
 */
#include "os.h"

#include <errno.h>
#include <stdatomic.h>
#include <sys/auxv.h>

#include "qm.h"
#include "random.h"

/* The layout lies in [top/128, top/4) of the address space (1 TiB to
 * 32 TiB with x86-64's 47 bits), its base random in the first third of
 * that. The kernel puts mappings of its own choosing top-down from below
 * the stack (near top), or, in the legacy layout (ulimit -s unlimited,
 * setarch -L), bottom-up from TASK_SIZE/3 (42.7 TiB); PIE programs and
 * their brk lie at 2/3 of it, others at 4 MiB. So nothing lands in the
 * layout unless the address space is nearly full or a program asks for an
 * address there: then a claim meets it and fails (EEXIST), and the caller
 * degrades as on any ENOMEM. top: the power of two above the main thread's
 * initial stack. Under AddressSanitizer, whose shadow holds 0x7fff8000 to
 * 16 TiB on x86-64, the layout lies in [top/4, top*5/16) (32 to 40 TiB)
 * instead, below the legacy layout's start. */
static _Atomic uintptr_t lay_next;
static _Atomic uint64_t lay_rng; /* a wyrand state, stepped atomically */

/* [lo, hi) for this address space, from AT_RANDOM's bytes, which the
 * kernel puts on the main thread's initial stack: the caller's own stack
 * may be anywhere (a coroutine's, taken from malloc, lies in the layout
 * itself), so nothing but lay_next is shared or changes. */
#if defined(__SANITIZE_ADDRESS__)
#define QM_LAYOUT_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define QM_LAYOUT_ASAN 1
#endif
#endif
static void layout_bounds(uintptr_t *lo, uintptr_t *hi) {
  uintptr_t at = (uintptr_t)getauxval(AT_RANDOM);
  if (!at) {
    int here;
    at = (uintptr_t)&here;
  }
  uintptr_t top = (uintptr_t)1 << (64 - __builtin_clzll(at));
#ifdef QM_LAYOUT_ASAN
  *lo = top / 4;
  *hi = top / 16 * 5;
#else
  *lo = top / 128;
  *hi = top / 4;
  /* A small address space: arm64 with 39-bit VA (4 KiB pages, 3 levels:
   * 512 GiB of user space), and qemu-user's aarch64 guest, whose stack and
   * program it puts below 2^39 too. [top/128, top/4) would be 124 GiB, less
   * than the primary's largest span: up to top/2 (256 GiB), still below a
   * PIE program (2/3 of the space, ELF_ET_DYN_BASE) and the mappings the
   * kernel places down from below the stack. */
  if (top <= (uintptr_t)1 << 40)
    *hi = top / 2;
#endif
}

size_t qm_os_layout_bytes(void) {
  uintptr_t lo, hi;
  layout_bounds(&lo, &hi);
  return hi - lo;
}

/* A draw from the layout's stream: one getrandom for the seed, then a
 * wyrand step per span, lock-free (spans are taken under different locks). */
static uint64_t layout_rand(void) {
  uint64_t x = atomic_fetch_add(&lay_rng, 0xa0761d6478bd642full) + 0xa0761d6478bd642full;
  unsigned __int128 t = (unsigned __int128)x * (x ^ 0xe7037ed1a0b428dbull);
  return (uint64_t)(t >> 64) ^ (uint64_t)t;
}

void qm_os_fork_child(void) {
  if (atomic_load(&lay_next))
    atomic_store(&lay_rng, qm_random_u64() | 1);
}

uintptr_t qm_os_span(size_t len, size_t align) {
  if (align < qm__page)
    align = qm__page;
  uintptr_t lo, end;
  layout_bounds(&lo, &end);
  uintptr_t cur = atomic_load(&lay_next);
  if (!cur) {
    uint64_t seed = qm_random_u64(), zero = 0;
    atomic_compare_exchange_strong(&lay_rng, &zero, seed);
    uintptr_t base = lo + qm_align_down(seed % ((end - lo) / 3), qm__page);
    if (atomic_compare_exchange_strong(&lay_next, &cur, base))
      cur = base;
  }
  /* 1 to 4096 pages (a count: 16 MiB with 4 KiB pages, 256 MiB with 64
   * KiB) of gap: a span's address says little of the next one's */
  size_t gap = (1 + layout_rand() % 4096) << qm__page_shift;
  for (;;) {
    uintptr_t start = qm_align_up(cur + gap, align);
    if (start < cur || start > end || len > end - start)
      return 0;
    if (atomic_compare_exchange_weak(&lay_next, &cur, start + len))
      return start;
  }
}

int qm_os_grow_span(qm_os_grow_t *g, size_t len, size_t align, bool guards) {
  size_t pg = guards ? qm__page : 0;
  if (align < qm__page)
    align = qm__page;
  /* the guard below lies in the span's first aligned step, base after it */
  uintptr_t s = qm_os_span(len + (guards ? align : 0) + pg, align);
  if (!s)
    return ENOMEM;
  g->base = s + (guards ? align : 0);
  g->top = g->base - pg;
  g->len = len;
  g->guards = guards;
  return 0;
}

int qm_os_grow(qm_os_grow_t *g, size_t upto) {
  size_t pg = g->guards ? qm__page : 0, held = qm_os_grown(g);
  if (upto <= held)
    return 0;
  if (!g->base || upto > g->len)
    return ENOMEM;
  size_t want = held * 2 > upto ? held * 2 : upto;
  if (want < ((size_t)1 << 20))
    want = (size_t)1 << 20;
  want = qm_page_up(want);
  uintptr_t to = want >= g->len ? g->base + g->len + pg : g->base + want;
  int err = qm_os_claim((void *)g->top, to - g->top, QM_PROT_NONE);
  if (err && to - g->top > qm_page_up(upto - held) + pg) { /* at least what is asked */
    /* the upper guard page with the last step, as in the first try */
    to = qm_page_up(upto) >= g->len ? g->base + g->len + pg : g->base + qm_page_up(upto);
    err = qm_os_claim((void *)g->top, to - g->top, QM_PROT_NONE);
  }
  if (!err)
    g->top = to;
  return err;
}

size_t qm_os_grown(const qm_os_grow_t *g) {
  if (!g->base || g->top <= g->base)
    return 0;
  size_t n = g->top - g->base;
  return n > g->len ? g->len : n;
}
