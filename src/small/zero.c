/* zero.c: slots of the zero-size region, 16 bytes apart, handed out by a
 * bump index and recycled through a FIFO of freed slots (an aging queue,
 * age.h), so a freed pointer is not the next one handed out. Which slots
 * are live, and which wait in the FIFO, are two bitmaps kept out of band in
 * meta memory, one 64 KiB leaf per 2^18 slots (live bits, then waiting
 * bits), made on first use.
 * A slot freed when the FIFO is full pushes its oldest out: that one is
 * loose (neither live nor waiting), and once the bump has reached the end
 * of the region a sweep hands loose slots out again, so every slot of the
 * region can be live at once. Invariant: loose == the slots below next with
 * neither bit set, per leaf in nloose[].
 * Everything is under one lock: malloc(0) is rare and never on a fast path.
 */
#include "zero.h"

#include <errno.h>

#include "age.h"
#include "lock.h"
#include "meta.h"
#include "os.h"
#include "primary.h"
#include "report.h"

#define LEAF_BITS ((size_t)1 << 18)
#define LEAF_WORDS (LEAF_BITS / 64)
#define MAX_LEAVES 2048 /* 2^29 slots: an 8 GiB region */
#define RING 4096       /* freed slots waiting to be reused */
#define RING_KEEP 1024  /* and at least this many wait while others can be had */

static qm_lock_t lock = QM_LOCK_INIT;
static uint64_t *leaf[MAX_LEAVES]; /* LEAF_WORDS live words, then as many waiting */
static uint32_t nloose[MAX_LEAVES];
static size_t loose;
static size_t sweep;        /* the slot the sweep for loose ones goes on from */
static size_t next;         /* slots ever handed out by the bump */
static uint32_t ring[RING]; /* the FIFO's slot numbers, positions of q */
/* the region's address space, claimed PROT_NONE as the bump reaches it:
 * a slot's address is never someone else's mapping */
static qm_os_grow_t space;
static qm_age_t q;
#ifdef QM_TEST_HOOKS
static size_t cap = SIZE_MAX;
#endif

static size_t nslots(void) {
  size_t n = ((size_t)1 << qm__rshift) / QM_MIN_ALIGN;
#ifdef QM_TEST_HOOKS
  if (n > cap)
    n = cap;
#endif
  return n < LEAF_BITS * MAX_LEAVES ? n : LEAF_BITS * MAX_LEAVES;
}

static uint64_t *word_of(size_t i, bool make) {
  uint64_t **l = &leaf[i / LEAF_BITS];
  if (!*l && (!make || !(*l = qm__meta_alloc(2 * LEAF_BITS / 8))))
    return NULL;
  return &(*l)[(i % LEAF_BITS) / 64];
}
/* The waiting bits' word of slot i, whose leaf exists. */
static uint64_t *waiting_of(size_t i) { return word_of(i, false) + LEAF_WORDS; }

/* Slots [0, n) claimed (under the lock). */
static bool grow_to(size_t n) {
  if (!space.base)
    space = (qm_os_grow_t){
        .base = qm_region(QM_ZCLASS), .len = (size_t)1 << qm__rshift, .top = qm_region(QM_ZCLASS)};
  return !qm_os_grow(&space, n * QM_MIN_ALIGN);
}

static size_t fifo_pop(void) {
  size_t i = ring[qm_age_pop(&q, RING)];
  *waiting_of(i) &= ~((uint64_t)1 << (i % 64));
  return i;
}

/* A loose slot, from the sweep's place on; loose > 0. Whole leaves with
 * none are skipped, so a sweep reads at most every leaf's count and one
 * leaf's words. */
static size_t take_loose(void) {
  size_t nleaves = (next + LEAF_BITS - 1) / LEAF_BITS;
  size_t l = sweep / LEAF_BITS, w = (sweep % LEAF_BITS) / 64;
  for (size_t seen = 0; seen <= nleaves; seen++, l = (l + 1) % nleaves, w = 0) {
    if (!nloose[l])
      continue;
    for (; w < LEAF_WORDS; w++) {
      uint64_t avail = ~(leaf[l][w] | leaf[l][LEAF_WORDS + w]);
      size_t base = l * LEAF_BITS + w * 64;
      if (base + 64 > next) /* bits past the bump are neither, but not loose */
        avail &= base >= next ? 0 : ((uint64_t)1 << (next - base)) - 1;
      if (avail) {
        size_t i = base + (size_t)__builtin_ctzll(avail);
        nloose[l]--;
        loose--;
        sweep = i + 1 < next ? i + 1 : 0;
        return i;
      }
    }
  }
  QM_CHECK_OP(loose, ==, 0); /* the counts said there was one */
  return SIZE_MAX;
}

void *qm__zero_alloc(void) {
  qm_lock(&lock);
  size_t i;
  if (q.n > RING_KEEP) {
    i = fifo_pop();
  } else if (next < nslots() && grow_to(next + 1)) {
    i = next++;
  } else if (loose) {
    i = take_loose();
  } else if (q.n) { /* every other slot is live: the region is full */
    i = fifo_pop();
  } else {
    qm_unlock(&lock);
    errno = ENOMEM;
    return NULL;
  }
  uint64_t *w = word_of(i, true);
  if (!w) {
    if (i == next - 1)
      next--;
    qm_unlock(&lock);
    errno = ENOMEM;
    return NULL;
  }
  *w |= (uint64_t)1 << (i % 64);
  qm_unlock(&lock);
  return (void *)(qm_region(QM_ZCLASS) + i * QM_MIN_ALIGN);
}

/* Slot of p, or SIZE_MAX if p is not a slot's address. */
static size_t slot_of(const void *p) {
  uintptr_t off = (uintptr_t)p - qm_region(QM_ZCLASS);
  if (off % QM_MIN_ALIGN || off / QM_MIN_ALIGN >= nslots())
    return SIZE_MAX;
  return off / QM_MIN_ALIGN;
}

static bool slot_live(size_t i) {
  uint64_t *w = i == SIZE_MAX ? NULL : word_of(i, false);
  return w && (*w >> (i % 64) & 1);
}

/* p, passed to op, is no live zero-size chunk's pointer: reported as the
 * region describes it (an address in it is the region's alone). */
static _Noreturn QM_COLD void bad_pointer(qm_op_t op, const void *p) {
  qm_place_t pl;
  qm__report_pointer(op, p, qm__zero_describe((uintptr_t)p, qm_place_empty(&pl)) ? &pl : NULL,
                     NULL);
}

void qm__zero_free(void *p, qm_op_t op) {
  size_t i = slot_of(p);
  qm_lock(&lock);
  if (!slot_live(i)) {
    qm_unlock(&lock);
    bad_pointer(op, p);
  }
  *word_of(i, false) &= ~((uint64_t)1 << (i % 64));
  qm_mark_released((uintptr_t)p);
  if (qm_age_full(&q, RING)) { /* the oldest has waited long enough: loose */
    size_t old = fifo_pop();
    nloose[old / LEAF_BITS]++;
    loose++;
  }
  ring[qm_age_push(&q, RING)] = (uint32_t)i;
  *waiting_of(i) |= (uint64_t)1 << (i % 64);
  qm_unlock(&lock);
}

#ifdef QM_TEST_HOOKS
size_t qm__zero_cap(size_t slots) {
  qm_lock(&lock);
  cap = slots < next ? next : slots;
  size_t n = next;
  qm_unlock(&lock);
  return n;
}
#endif

size_t qm__zero_check(qm_op_t op, void *p) {
  size_t i = slot_of(p);
  qm_lock(&lock);
  bool live = slot_live(i);
  qm_unlock(&lock);
  if (!live)
    bad_pointer(op, p);
  return 0;
}

/* Lock-free: called from the SIGSEGV handler; a racy answer only words the
 * report differently. */
bool qm__zero_describe(uintptr_t a, qm_place_t *pl) {
  qm_buf_t *d = &pl->words;
  uintptr_t off = a - qm_region(QM_ZCLASS);
  size_t i = off / QM_MIN_ALIGN;
  uintptr_t base = qm_region(QM_ZCLASS) + i * QM_MIN_ALIGN;
  if (i >= nslots())
    return false;
  uint64_t *l = leaf[i / LEAF_BITS];
  bool live = l && (l[(i % LEAF_BITS) / 64] >> (i % 64) & 1);
  pl->chunk = live || i < next; /* a slot handed out before */
  pl->kind = QM_CK_ZERO;
  pl->user = base;
  pl->size = 0;
  if (live) {
    pl->access = QM_ACC_OVERFLOW;
    qm_buf_dec(d, a - base + 1);
    qm_buf_str(d, a == base ? " byte past the end of " : " bytes past the end of ");
    qm_buf_str(d, "zero-size chunk at ");
  } else if (i < next) {
    pl->access = QM_ACC_UAF;
    qm_buf_str(d, "offset ");
    qm_buf_dec(d, a - base);
    qm_buf_str(d, " in freed zero-size chunk at ");
  } else {
    pl->access = QM_ACC_WILD;
    qm_buf_str(d, "zero-size region, never allocated, at ");
  }
  qm_buf_hex(d, base);
  return true;
}

void qm__zero_fork_prepare(void) { qm_fork_lock(&lock); }
void qm__zero_fork_parent(void) { qm_unlock(&lock); }
void qm__zero_fork_child(void) { qm_lock_reinit(&lock); }
