/* smallstate.c: the small chunk's state machine (NONE -> ALLOC <-> FREE, in
 * the tables of smallstate.h) past the fast paths, on this thread's side:
 * validation, hand-out, release into the cache, frees parked for their
 * canary check and their batch, checked mode's own malloc and free (its
 * zeroing and neighbour checks), fresh generations in a fork child. It
 * changes only entries of chunks this thread owns or takes from its bins,
 * and of chunks nobody owns (by compare-and-swap); a free of another
 * thread's chunk goes to inbox.c, every report to small_report.c.
 */
#include "smallstate.h"

#include <errno.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "cache.h"
#include "options.h"
#include "report.h"
#include "smallstate_int.h"
#include "up.h"

/* the calling thread's hot state (thread.h): it owns nothing, and its
 * first malloc sets its sampling countdown */
__thread qm_thread_t qm__t
    __attribute__((tls_model("initial-exec"))) = {.me = QM_E_NOBODY, .sample_left = 1};

/* ---- checked mode's zeroing, zero check and neighbour check ---- */

#if defined(__x86_64__)
/* Checked mode's zeroing at free and zero check at hand-out, by the widest
 * vectors the CPU runs: steps of four vectors (128 bytes with AVX2, 256
 * with AVX-512F) through the chunk, then one more of four over its last
 * bytes, overlapping the steps before, instead of a loop over what is left
 * (a chunk below a step takes four vectors that overlap). A chunk is a
 * multiple of 16 bytes, at least 16. The check returns an offset at or
 * before the first byte not zero (qm__small_zero_error finds the byte), or size. In
 * small churn under hardening=max (AVX2: callgrind does not run AVX-512)
 * the check took 89 instructions a malloc, now 64. With AVX2 the zeroing
 * is memset's: the same steps took as many instructions. */
#define OR4(L, a, b, c, d) _mm256_or_si256(_mm256_or_si256(L(a), L(b)), _mm256_or_si256(L(c), L(d)))
#define LD32(q) _mm256_loadu_si256((const __m256i_u *)(q))
__attribute__((target("avx2"))) static size_t nonzero_avx2(uintptr_t ch, size_t size) {
  const char *p = (const char *)ch, *end = p + size;
  if (QM_UNLIKELY(size < 32)) {
    __m128i y = _mm_loadu_si128((const __m128i_u *)p);
    return _mm_testz_si128(y, y) ? size : 0;
  }
  __m256i x;
  if (size < 128) {
    size_t b = size - 32;
    x = OR4(LD32, p, p + (b < 32 ? b : 32), p + (b < 64 ? b : 64), p + b);
    return _mm256_testz_si256(x, x) ? size : 0;
  }
  for (size_t k = size / 128; k; k--, p += 128) {
    x = OR4(LD32, p, p + 32, p + 64, p + 96);
    if (!_mm256_testz_si256(x, x))
      return (size_t)(p - (const char *)ch);
  }
  p = end - 128; /* again if size is a multiple of 128: no branch */
  x = OR4(LD32, p, p + 32, p + 64, p + 96);
  return _mm256_testz_si256(x, x) ? size : size - 128;
}

/* The check and the zeroing with AVX-512F; below 64 bytes (16, 32, 48) by
 * a masked load or store, which does not touch memory past the chunk. */
#define OR4W(L, a, b, c, d)                                                                        \
  _mm512_or_si512(_mm512_or_si512(L(a), L(b)), _mm512_or_si512(L(c), L(d)))
#define LD64(q) _mm512_loadu_si512((const void *)(q))
__attribute__((target("avx512f"))) static size_t nonzero_avx512(uintptr_t ch, size_t size) {
  const char *p = (const char *)ch, *end = p + size;
  __m512i x;
  if (QM_UNLIKELY(size < 64)) {
    x = _mm512_maskz_loadu_epi64((__mmask8)((1u << (size / 8)) - 1), p);
    return _mm512_test_epi64_mask(x, x) ? 0 : size;
  }
  if (size < 256) {
    size_t b = size - 64;
    x = OR4W(LD64, p, p + (b < 64 ? b : 64), p + (b < 128 ? b : 128), p + b);
    return _mm512_test_epi64_mask(x, x) ? 0 : size;
  }
  for (size_t k = size / 256; k; k--, p += 256) {
    x = OR4W(LD64, p, p + 64, p + 128, p + 192);
    if (_mm512_test_epi64_mask(x, x))
      return (size_t)(p - (const char *)ch);
  }
  p = end - 256;
  x = OR4W(LD64, p, p + 64, p + 128, p + 192);
  return _mm512_test_epi64_mask(x, x) ? size - 256 : size;
}

__attribute__((target("avx512f"))) static void zero_avx512(uintptr_t ch, size_t size) {
  char *p = (char *)ch, *end = p + size;
  const __m512i z = _mm512_setzero_si512();
  if (QM_UNLIKELY(size < 64)) {
    _mm512_mask_storeu_epi64(p, (__mmask8)((1u << (size / 8)) - 1), z);
    return;
  }
  if (size < 256) {
    size_t b = size - 64;
    _mm512_storeu_si512(p, z);
    _mm512_storeu_si512(p + (b < 64 ? b : 64), z);
    _mm512_storeu_si512(p + (b < 128 ? b : 128), z);
    _mm512_storeu_si512(p + b, z);
    return;
  }
  for (size_t k = size / 256; k; k--, p += 256) {
    _mm512_storeu_si512(p, z);
    _mm512_storeu_si512(p + 64, z);
    _mm512_storeu_si512(p + 128, z);
    _mm512_storeu_si512(p + 192, z);
  }
  p = end - 256;
  _mm512_storeu_si512(p, z);
  _mm512_storeu_si512(p + 64, z);
  _mm512_storeu_si512(p + 128, z);
  _mm512_storeu_si512(p + 192, z);
}
#endif

/* Checked mode, at free (zero_on_free): chunk ch, size bytes, zeroed. */
QM_INLINE void zero_chunk(uintptr_t ch, size_t size) {
#if defined(__x86_64__)
  if (QM_LIKELY(qm__vec == 2)) {
    zero_avx512(ch, size);
    return;
  }
#endif
  memset((void *)ch, 0, size);
}

/* Checked mode: a chunk zeroed at free must still be zero. 64 bytes per
 * step, ORed in 16-byte vectors (32-byte ones with AVX2): a word at a
 * time cost 4 instructions per 8 bytes, the largest cost of hardening=max
 * in small churn. */
QM_INLINE void check_zero(uintptr_t ch, unsigned c) {
#if defined(__x86_64__)
  if (QM_LIKELY(qm__vec)) {
    size_t size = qm__class[c].size;
    size_t at = qm__vec == 2 ? nonzero_avx512(ch, size) : nonzero_avx2(ch, size);
    if (QM_UNLIKELY(at < size))
      qm__small_zero_error(ch, c, at);
    return;
  }
#endif
  typedef uint64_t v2 __attribute__((vector_size(16), may_alias));
  const v2 *v = (const v2 *)ch;
  size_t nv = qm__class[c].size / 16, i = 0;
  for (; i + 4 <= nv; i += 4) {
    v2 x = v[i] | v[i + 1] | v[i + 2] | v[i + 3];
    if (QM_UNLIKELY(x[0] | x[1]))
      break;
  }
  for (; i < nv; i++) {
    v2 x = v[i];
    if (x[0] | x[1])
      break;
  }
  if (QM_UNLIKELY(i < nv))
    qm__small_zero_error(ch, c, i * 16);
}

/* Checked mode, at free: the live neighbours this thread owns must have
 * intact canaries, so an overflow out of one chunk that skips its own
 * canary (a stale or computed pointer) is caught at its neighbour's free
 * too. Only this thread's: another thread may be writing its chunk's entry
 * and canary right now. */
static QM_COLD void check_neighbours(uintptr_t ch, unsigned c) {
  const qm_class_info_t *ci = &qm__class[c];
  uintptr_t base = qm_region(c), top = base + qm_committed(c);
  uintptr_t side[2] = {ch - ci->size, ch + ci->size};
  unsigned me = my_id();
  for (int i = 0; i < 2; i++) {
    uintptr_t n = side[i];
    if (!me || n < base || n + ci->size > top || qm_slot_dead(n - base, ci->size))
      continue;
    uint64_t w = qm_entry_load(qm_entry_at(c, (n - base) / ci->size));
    if (qm_e_state(w) != QM_CHUNK_ALLOC || qm_e_owner(w) != me)
      continue;
    uintptr_t user = n + qm_e_offset(w), end = user + qm_e_size(w);
    uint64_t bad = qm_load8(end) ^ qm_canary(n, qm_e_gen(w), c);
    if (bad)
      qm__small_neighbour_error(n, w, bad, i ? -1 : 1, ch);
  }
}

/* ---- validation and hand-out ---- */

uintptr_t qm__small_check(qm_op_t op, void *p, uintptr_t off, unsigned *cls, uint64_t **entry,
                          uint64_t *word) {
  uintptr_t a = (uintptr_t)p, roff, index;
  uintptr_t ch = chunk_of(a, off, cls, &roff, &index);
  unsigned c = *cls;
  const qm_class_info_t *ci = &qm__class[c];
  if (QM_UNLIKELY(c == QM_ZCLASS || roff >= qm_committed(c) ||
                  qm_slot_dead(ch - qm_region(c), ci->size)))
    qm__small_error(op, p, ch, c, roff, index);
  uint64_t *e = qm_entry_at(c, index), w = qm_entry_load(e);
  if (QM_UNLIKELY(qm_e_state(w) != QM_CHUNK_ALLOC || a != ch + qm_e_offset(w) ||
                  qm_load8(a + qm_e_size(w)) != qm_canary(ch, qm_e_gen(w), c)))
    qm__small_error(op, p, ch, c, roff, index);
  *entry = e;
  *word = w;
  return ch;
}

QM_INLINE void *hand_out(uintptr_t s, unsigned c, size_t n, size_t align) {
  const qm_class_info_t *ci = &qm__class[c];
  uintptr_t ch = qm_slot_chunk(s), roff = ch - qm_region(c);
  if (QM_UNLIKELY(roff >= qm_committed(c)))
    qm__small_bad_pop(ch, c);
  uint64_t *e = qm_entry_at(c, qm_chunk_index(roff, c)), w = qm_entry_load(e);
  if (QM_UNLIKELY(qm_e_state(w) == QM_CHUNK_ALLOC || qm_e_state(w) == QM_CHUNK_SENT))
    qm__report_bad_entry(ci->size, ch, "chunk in use");
  if (qm__cache_checked && qm__opt.zero_on_free)
    check_zero(ch, c);
  uintptr_t user = qm_align_up(ch, align > QM_MIN_ALIGN ? align : QM_MIN_ALIGN);
  uint64_t gen = qm_e_gen(w);
  /* a thread with no cache owns nothing: any thread may free this chunk,
   * by compare-and-swap */
  qm_entry_store(e, qm_e_make(QM_CHUNK_ALLOC, my_id(), gen, user - ch, n) | qm_e_align_code(align));
  qm_store8(user + n, qm_canary(ch, gen, c));
  return (void *)user;
}

void *qm__small_hand_out(uintptr_t s, unsigned c, size_t n, size_t align) {
  qm__took = true;
  return hand_out(s, c, n, align);
}

bool qm__small_resize(void *p, uintptr_t ch, unsigned c, uint64_t *e, uint64_t w, size_t n) {
  unsigned owner = qm_e_owner(w);
  /* realloc hands out malloc's kind of chunk, as a move would */
  uint64_t nw = (w & ~(QM_E_SIZE | QM_E_ALIGN)) | n;
  if (owner && owner == my_id())
    qm_entry_store(e, nw);
  else if (owner ||
           !__atomic_compare_exchange_n(e, &w, nw, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
    return false; /* another thread's, or a racing free: moved instead */
  /* the old canary lies inside the grown request, or past the shrunk one
   * where a later, larger allocation of the chunk would find it: cleared
   * first (a new canary overlapping it is written over the zeros) */
  qm_canary_clear((uintptr_t)p + qm_e_size(w));
  qm_store8((uintptr_t)p + n, qm_canary(ch, qm_e_gen(w), c));
  return true;
}

/* ---- busy marks left by calls that are not refills ---- */

#ifdef QM_TEST_HOOKS
void (*qm__busy_leaving_hook)(void);

/* lock.h's note of a lock taken unmarked, by the thread that asked (a
 * test's own: what gtest's threads do is not counted), to its exit's
 * destructors included: the count outlives it */
static __thread bool lock_watch;
static _Atomic unsigned lock_unmarked;
static const char *lock_first_file;
static int lock_first_line;
void qm__lock_note(const char *file, int line) {
  if (!lock_watch || qm__freeing)
    return;
  if (!atomic_fetch_add(&lock_unmarked, 1)) {
    lock_first_file = file;
    lock_first_line = line;
  }
}
void qm__lock_watch(bool on) {
  lock_watch = on;
  atomic_store(&lock_unmarked, 0);
}
unsigned qm__lock_unmarked(const char **file, int *line) {
  *file = lock_first_file;
  *line = lock_first_line;
  return lock_unmarked;
}
#endif

void qm__busy_leave_applying(uintptr_t was) {
  if (was) /* inside another call's mark: that call applies them */
    return;
  for (;;) {
    if (qm__nested_head != qm__nested_tail)
      qm__state_drain();
#ifdef QM_TEST_HOOKS
    if (qm__busy_leaving_hook)
      qm__busy_leaving_hook();
#endif
    qm_busy_leave(0);
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    if (qm__nested_head == qm__nested_tail)
      return;
    qm_busy_enter();
  }
}

void qm__free_leave_late(void) {
  qm_freeing_set(QM_BUSY);
  qm__state_drain_due();
  qm__busy_leave_applying(0);
}

/* ---- release ---- */

void qm__small_zero_sent(uintptr_t ch, unsigned c, uintptr_t canary) {
  size_t size = qm__class[c].size;
  /* from the entry: never past the chunk, whatever it says */
  if (QM_UNLIKELY(canary < ch || canary - ch > size - 8))
    qm__report_bad_entry(size, ch, "canary outside its chunk");
  memset((void *)ch, 0, canary - ch);
  memset((void *)(canary + 8), 0, ch + size - canary - 8);
}

void qm__small_check_sent(uintptr_t ch, unsigned c) { check_zero(ch, c); }

void qm__small_check_sent_but(uintptr_t ch, unsigned c, uintptr_t canary) {
  size_t size = qm__class[c].size;
  const unsigned char *q = (const unsigned char *)ch;
  for (size_t i = 0; i < size; i++)
    if (q[i] && (ch + i < canary || ch + i >= canary + 8))
      qm__small_zero_error(ch, c, i);
}

static void release(uintptr_t slot, unsigned c, bool zeroed) {
  if (qm__cache_checked) {
    uintptr_t ch = qm_slot_chunk(slot);
    size_t size = qm__class[c].size;
    /* the neighbours' canaries are cold lines: fetched while the chunk is
     * zeroed rather than after */
    __builtin_prefetch((void *)(ch - 8));
    __builtin_prefetch((void *)(ch + 2 * size - 8));
    if (qm__opt.zero_on_free && !zeroed)
      zero_chunk(ch, size);
    check_neighbours(ch, c);
  } else {
    qm_bin_t *b = &qm__bin[c];
    if (QM_LIKELY(b->count < b->max)) {
      b->count = qm_bin_insert(qm__bin_slot[c], b->count, slot);
      return;
    }
  }
  qm__cache_give_slow(slot, c);
}

void qm__small_release(uintptr_t slot, unsigned c) { release(slot, c, false); }

void qm__small_release_sent(uintptr_t slot, unsigned c) {
  bool zeroed = qm__cache_checked && qm__opt.zero_on_free;
  if (zeroed)
    check_zero(qm_slot_chunk(slot), c);
  release(slot, c, zeroed);
}

/* ---- frees parked for their canary check ---- */

/* The canary of user pointer p (n bytes, at p + n) is not expect. */
/* by: the return address of the free that parked the chunk, or 0 */
void qm__small_canary_error(uintptr_t p, uintptr_t at, uint64_t expect, uintptr_t by) {
  size_t n = at - p;
  uint64_t bad = qm_load8(at) ^ expect;
  qm__report_small_overflow((void *)p, QM_CK_SMALL, n, n + (size_t)__builtin_ctzll(bad) / 8, 0, 0,
                            by);
}

void qm__small_pend_error(unsigned i) {
  uintptr_t s = qm__pend_slot[i], at = qm__pend_at[i];
  qm__small_canary_error(qm_slot_chunk(s), QM_PEND_AT(at), qm_canary_before(s, QM_PEND_CLASS(at)),
                         qm__pend_by[i]);
}

/* Checks parked free i and puts its chunk in its bin at a random place (r:
 * 16 bits of a draw; malloc takes the top one), or on to the central list
 * when the bin is full. The canary is the one its malloc wrote, of the
 * generation before the free's. */
static inline void pend_settle(unsigned i, uint64_t r) {
  uintptr_t s = qm__pend_slot[i], at = QM_PEND_AT(qm__pend_at[i]);
  unsigned c = QM_PEND_CLASS(qm__pend_at[i]);
  if (QM_UNLIKELY(qm_load8(at) != qm_canary_before(s, c)))
    qm__small_pend_error(i);
  qm_canary_clear(at);
  qm_bin_t *b = &qm__bin[c];
  uint32_t n = b->count;
  if (QM_UNLIKELY(n >= b->max)) {
    qm__small_release(s, c);
    return;
  }
  /* bins hold at most 128, so the bias of a 16-bit draw is below 1/512 */
  uint32_t j = (uint32_t)(((r & 0xffff) * (n + 1)) >> 16);
  uintptr_t *slot = qm__bin_slot[c];
  slot[n] = slot[j];
  slot[j] = s;
  b->count = n + 1;
}

void qm__small_pend_batch(uint64_t k) {
  take_due();
  /* the half to check was filled QM_PEND_HALF frees before the one just
   * filled: nothing in it yet since the ring was last emptied */
  if (QM_UNLIKELY(k < QM_PEND_N))
    return;
  unsigned q = (unsigned)(k / QM_PEND_HALF) % 2 * QM_PEND_HALF;
  /* unrolled whole: the loop's counters and the spills of its registers
   * were 6 of the 38 instructions a chunk took */
#pragma GCC unroll 4
  for (unsigned i = 0; i < QM_PEND_HALF; i += 4) {
    /* four places to a draw */
    uint64_t r = qm_rand();
#pragma GCC unroll 4
    for (unsigned j = i; j < i + 4; j++, r >>= 16)
      pend_settle(q + j, r);
  }
}

/* The first parked free not yet checked, of n parked since the ring was
 * last emptied (see smallstate.h). */
static uint64_t pend_first(uint64_t n) {
  return n < QM_PEND_N ? 0 : n / QM_PEND_HALF * QM_PEND_HALF - QM_PEND_HALF;
}

void qm__small_pend_flush(void) {
  /* nothing parked since the last flush (always so in checked mode) */
  if (!qm__pend_i)
    return;
  /* Marked busy (fork's prepare handler and the exit hook call this
   * unmarked): the entries are settled where they stand and the count is
   * reset only at the end, so a free from a signal handler landing in the
   * loop would park behind n, be lost to the reset, and, at a multiple of
   * QM_PEND_HALF, run a batch over entries this loop settles too: the same
   * chunk twice in a bin, handed out twice. Marked, it takes the nested
   * path. The count is read under the mark. */
  uintptr_t was = qm_busy_enter();
  uint64_t n = qm__pend_i;
  uint64_t r = 0;
  for (uint64_t k = pend_first(n), i = 0; k < n; k++, i++, r >>= 16) {
    if (!(i % 4))
      r = qm_rand();
    pend_settle((unsigned)(k % QM_PEND_N), r);
  }
  qm__pend_i = 0;
  qm_busy_leave(was);
}

/* ---- checked mode's own malloc and free ----
 * Every malloc and free of checked mode misses the fast paths (its bins
 * stay empty); these take it the shortest way: each check done once, the
 * steering work only when there is some. */

/* Checked mode's hand-out of bin slot s of class c for n bytes (no
 * over-alignment) by a thread with a cache: hand_out's checks, with the
 * owner and state bits from qm__me, as the default fast path has them. */
QM_INLINE void *hand_out_checked(uintptr_t s, unsigned c, size_t n) {
  uintptr_t ch = qm_slot_chunk(s), roff = ch - qm_region(c);
  qm__took = true; /* its id on a chunk: see cache.h */
  if (QM_UNLIKELY(roff >= qm_committed(c)))
    qm__small_bad_pop(ch, c);
  uint64_t *e = qm_entry_at(c, qm_chunk_index(roff, c)), w = qm_entry_load(e);
  /* ALLOC (1) and SENT (3): the state's low bit */
  if (QM_UNLIKELY(w & (uint64_t)1 << QM_E_STATE_SHIFT))
    qm__report_bad_entry(qm__class[c].size, ch, "chunk in use");
  if (qm__opt.zero_on_free)
    check_zero(ch, c);
  uint64_t gen = qm_e_gen(w);
  qm_entry_store(e, qm__me | gen << QM_E_GEN_SHIFT | (uint64_t)n);
  qm_store8(ch + n, qm_canary(ch, gen, c));
  return (void *)ch;
}

void *qm__small_malloc_checked_fast(size_t n, unsigned c, uintptr_t was) {
  uintptr_t s;
  /* an exhausted class: the slow path tries larger ones */
  if (QM_UNLIKELY(c >= QM_NCLASS || drain_due() || qm__opt.guard_all || !qm__cc[c].slot ||
                  !(s = qm_cache_take_checked(c)))) {
    qm_freeing_restore(was);
    return qm__small_up.malloc_slow(n);
  }
  void *p = hand_out_checked(s, c, n);
  qm_freeing_restore(was);
  return p;
}

/* A free of chunk a (off = a - qm__pbase) this thread owns, live, at
 * offset 0, canary intact: made FREE, zeroed (zero_on_free), its live
 * neighbours of this thread checked, given to the ring; false, having
 * changed nothing, for any other (qm__small_free_slow then takes it, and
 * reports what is wrong). The neighbours' entries and canaries are read
 * ahead of the chunk's own canary, so that the three cold lines arrive
 * together. */
QM_INLINE bool free_checked(uintptr_t a, uintptr_t off) {
  unsigned c = (unsigned)(off >> qm__rshift);
  uintptr_t roff = off & qm__rmask;
  if (c == QM_ZCLASS)
    return false;
  size_t top = qm_committed(c);
  if ((a & (QM_MIN_ALIGN - 1)) || roff >= top)
    return false;
  const qm_class_info_t *ci = &qm__class[c];
  size_t size = ci->size;
  uintptr_t i = qm_chunk_index(roff, c);
  if (i * size != roff)
    return false;
  /* the whole chunk is written (zeroed) below: its lines, its canary's
   * among them, start coming now, together */
  if (qm__opt.zero_on_free)
    QM_PREFETCH_SPAN(a, size, QM_PF_W);
  uint64_t *e = qm_entry_at(c, i), w = qm_entry_load(e);
  const uint64_t mine = qm__me;
  if ((w & (QM_E_STATE | QM_E_OFF | QM_E_OWNER)) != mine)
    return false; /* not live, not at offset 0, or not this thread's */
  /* the live neighbours this thread owns (a dead slot beside a guard page
   * is never carved: its entry stays NONE); their canaries' lines start
   * coming now */
  const uint64_t live = mine & (QM_E_STATE | QM_E_ID);
  uint64_t lw = roff >= size ? qm_entry_load(e - 1) : 0;
  uint64_t rw = roff + 2 * size <= top ? qm_entry_load(e + 1) : 0;
  bool lhas = (lw & (QM_E_STATE | QM_E_ID)) == live;
  bool rhas = (rw & (QM_E_STATE | QM_E_ID)) == live;
  /* each side by name, not in arrays: looped over, they went through the
   * stack */
  uintptr_t lend = a - size + qm_e_offset(lw) + qm_e_size(lw);
  uintptr_t rend = a + size + qm_e_offset(rw) + qm_e_size(rw);
  if (lhas)
    __builtin_prefetch((void *)lend);
  if (rhas)
    __builtin_prefetch((void *)rend);
  uint64_t gen = qm_e_gen(w);
  if (QM_UNLIKELY(qm_load8(a + qm_e_size(w)) != qm_canary(a, gen, c)))
    return false;
  uint64_t fw = qm_e_freed_alloc(w);
  qm_entry_store(e, fw);
  if (qm__opt.zero_on_free)
    zero_chunk(a, size);
  else
    qm_canary_clear(a + qm_e_size(w));
  if (lhas) {
    uint64_t bad = qm_load8(lend) ^ qm_canary(a - size, qm_e_gen(lw), c);
    if (QM_UNLIKELY(bad))
      qm__small_neighbour_error(a - size, lw, bad, 1, a);
  }
  if (rhas) {
    uint64_t bad = qm_load8(rend) ^ qm_canary(a + size, qm_e_gen(rw), c);
    if (QM_UNLIKELY(bad))
      qm__small_neighbour_error(a + size, rw, bad, -1, a);
  }
  qm_cache_give_checked(qm_slot_make(a, qm_e_gen(fw)), c, size);
  return true;
}

void qm__small_free_slow(void *p, uintptr_t off) {
  if (qm__cache_checked && QM_LIKELY(free_checked((uintptr_t)p, off))) {
    free_leave();
    return;
  }
  qm__small_up.free_general(p, off);
}

/* ---- fresh generations in a fork child ---- */

uintptr_t qm__small_regen(uintptr_t s, unsigned c) {
  uintptr_t ch = qm_slot_chunk(s), roff = ch - qm_region(c);
  if (roff >= qm_committed(c))
    qm__small_bad_pop(ch, c);
  uint64_t *e = qm_entry_at(c, qm_chunk_index(roff, c)), w = qm_entry_load(e);
  /* FREE, or NONE: carved, never handed out */
  if (qm_e_state(w) == QM_CHUNK_ALLOC || qm_e_state(w) == QM_CHUNK_SENT)
    qm__report_bad_entry(qm__class[c].size, ch, "chunk in use");
  uint64_t gen = qm_rand() & 0xffff;
  qm_entry_store(e, (w & ~QM_E_GEN) | gen << QM_E_GEN_SHIFT);
  return qm_slot_make(ch, gen);
}

void qm__small_pend_regen(void) {
  /* marked busy, as the flush is: a handler's free parking (and batching)
   * here would settle entries half given their new generation */
  uintptr_t was = qm_busy_enter();
  uint64_t n = qm__pend_i;
  for (uint64_t k = pend_first(n); k < n; k++) {
    unsigned i = (unsigned)(k % QM_PEND_N);
    uintptr_t s = qm__pend_slot[i], at = QM_PEND_AT(qm__pend_at[i]);
    unsigned c = QM_PEND_CLASS(qm__pend_at[i]);
    /* checked against the canary its malloc wrote, then given the one the
     * new generation expects */
    if (qm_load8(at) != qm_canary_before(s, c))
      qm__small_pend_error(i);
    s = qm__small_regen(s, c);
    qm_store8(at, qm_canary_before(s, c));
    qm__pend_slot[i] = s;
  }
  qm_busy_leave(was);
}
