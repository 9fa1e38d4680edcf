/* zero.c: slots of the zero-size region, 16 bytes apart, handed out by a
 * bump index and recycled through a FIFO of freed slots (so a freed pointer
 * is not the next one handed out). Which slots are live is a bitmap kept out
 * of band in meta memory, one 32 KiB leaf per 2^18 slots, made on first use.
 * Everything is under one lock: malloc(0) is rare and never on a fast path.
 */
#include "zero.h"

#include <errno.h>

#include "lock.h"
#include "meta.h"
#include "primary.h"
#include "report.h"

#define LEAF_BITS ((size_t)1 << 18)
#define MAX_LEAVES 2048 /* 2^29 slots: an 8 GiB region */
#define RING 4096       /* freed slots waiting to be reused */
#define RING_KEEP 1024  /* and at least this many wait */

static qm_lock_t lock = QM_LOCK_INIT;
static uint64_t *leaf[MAX_LEAVES];
static size_t next; /* slots ever handed out by the bump */
static uint32_t ring[RING];
static size_t ring_head, ring_len;

static size_t nslots(void) {
  size_t n = ((size_t)1 << qm__rshift) / QM_MIN_ALIGN;
  return n < LEAF_BITS * MAX_LEAVES ? n : LEAF_BITS * MAX_LEAVES;
}

static uint64_t *word_of(size_t i, bool make) {
  uint64_t **l = &leaf[i / LEAF_BITS];
  if (!*l && (!make || !(*l = qm__meta_alloc(LEAF_BITS / 8))))
    return NULL;
  return &(*l)[(i % LEAF_BITS) / 64];
}

void *qm__zero_alloc(void) {
  qm_lock(&lock);
  size_t i;
  if (ring_len > RING_KEEP) {
    i = ring[ring_head];
    ring_head = (ring_head + 1) % RING;
    ring_len--;
  } else if (next < nslots()) {
    i = next++;
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

static bool live_locked(size_t i) {
  uint64_t *w = i == SIZE_MAX ? NULL : word_of(i, false);
  return w && (*w >> (i % 64) & 1);
}

_Noreturn void qm__zero_error(const char *op, void *p) {
  size_t i = slot_of(p);
  if (i == SIZE_MAX)
    qm__report_fatal(op, p, "not allocated by qmalloc: inside the zero-size region");
  if (i < next && op[0] == 'i') /* "invalid free of" a slot handed out before */
    qm__report_fatal("double free of", p, "zero-size chunk");
  qm__report_fatal(op, p, i < next ? "freed zero-size chunk" : "zero-size chunk never allocated");
}

void qm__zero_free(void *p, const char *op) {
  size_t i = slot_of(p);
  qm_lock(&lock);
  if (!live_locked(i)) {
    qm_unlock(&lock);
    qm__zero_error(op, p);
  }
  *word_of(i, false) &= ~((uint64_t)1 << (i % 64));
  if (ring_len < RING) {
    ring[(ring_head + ring_len) % RING] = (uint32_t)i;
    ring_len++;
  }
  /* else: the slot is never reused; the region has 2^29 of them */
  qm_unlock(&lock);
}

size_t qm__zero_check(const char *op, void *p) {
  size_t i = slot_of(p);
  qm_lock(&lock);
  bool live = live_locked(i);
  qm_unlock(&lock);
  if (!live)
    qm__zero_error(op, p);
  return 0;
}

/* Lock-free: called from the SIGSEGV handler; a racy answer only words the
 * report differently. */
bool qm__zero_describe(uintptr_t a, const char **what, qm_buf_t *d) {
  uintptr_t off = a - qm_region(QM_ZCLASS);
  size_t i = off / QM_MIN_ALIGN;
  uintptr_t base = qm_region(QM_ZCLASS) + i * QM_MIN_ALIGN;
  if (i >= nslots())
    return false;
  uint64_t *l = leaf[i / LEAF_BITS];
  bool live = l && (l[(i % LEAF_BITS) / 64] >> (i % 64) & 1);
  if (live) {
    *what = "heap overflow";
    qm_buf_dec(d, a - base + 1);
    qm_buf_str(d, a == base ? " byte past the end of " : " bytes past the end of ");
    qm_buf_str(d, "zero-size chunk at ");
  } else if (i < next) {
    *what = "use-after-free";
    qm_buf_str(d, "offset ");
    qm_buf_dec(d, a - base);
    qm_buf_str(d, " in freed zero-size chunk at ");
  } else {
    *what = "wild access";
    qm_buf_str(d, "zero-size region, never allocated, at ");
  }
  qm_buf_hex(d, base);
  return true;
}

void qm__zero_fork_prepare(void) { qm_lock(&lock); }
void qm__zero_fork_parent(void) { qm_unlock(&lock); }
void qm__zero_fork_child(void) { qm_lock_reinit(&lock); }
