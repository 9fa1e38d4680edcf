/* primary_limbo.c: delayed free where no thread's ring can age a chunk:
 * each class's limbo (central_t.limbo, primary_state.h), stamped on the
 * class's clock, adopted into a cache's ring or released into the free set
 * after free_delay mallocs, its bytes in all classes at most free_delay_kb.
 * Changed under the class's lock; its counts are atomics of its own.
 */
#include "primary.h"

#include "lock.h"
#include "options.h"
#include "primary_state.h"

static _Atomic size_t limbo_early; /* chunks that left a full limbo early */
/* Bytes of the chunks in every class's limbo (changed under the class's
 * lock, summed over classes): at most free_delay_kb, as a thread's rings.
 * Without it a program whose threads come and go (mstress under
 * hardening=max) kept 16 MiB of each large class here. */
static _Atomic size_t limbo_bytes;
static _Atomic size_t limbo_over; /* chunks that left early for it */

/* n chunks left class c's limbo (lock held): its bytes and count after. */
static void limbo_left(unsigned c, central_t *cl, uint32_t n) {
  atomic_fetch_sub_explicit(&limbo_bytes, (size_t)n * qm_chunk_size_of(c), memory_order_relaxed);
  atomic_store_explicit(&cl->held, cl->lq.n, memory_order_relaxed);
}

/* The oldest chunk of class c's limbo into group g's set (lock held). */
static void limbo_release_oldest(unsigned c, central_t *cl, unsigned g, unsigned others) {
  qm__central_put_locked(c, cl, g, others, cl->limbo[qm_age_pop(&cl->lq, qm_limbo_cap(c))].item);
  limbo_left(c, cl, 1);
}

/* A malloc of a thread without a cache, about to take its chunk: the
 * limbo's clock ticks, and its chunks that have waited out free_delay join
 * group g's set. Called with the class lock held. */
void qm__limbo_tick_locked(unsigned c, central_t *cl, unsigned g) {
  uint32_t now = ++cl->clock, cap = qm_limbo_cap(c), n = cl->lq.n;
  unsigned others = qm_groups_used(cl) & ~(1u << g);
  while (qm_age_due(&cl->lq, cl->limbo, now, (uint32_t)qm__opt.free_delay))
    qm__central_put_locked(c, cl, g, others, cl->limbo[qm_age_pop(&cl->lq, cap)].item);
  limbo_left(c, cl, n - cl->lq.n);
}

unsigned qm__central_adopt(unsigned c, uintptr_t *items, uint32_t *ages, unsigned room) {
  central_t *cl = &central[c];
  if (!cl->limbo || !atomic_load_explicit(&cl->held, memory_order_relaxed))
    return 0; /* read unlocked: a hint; one missed is adopted at the next refill */
  uint32_t cap = qm_limbo_cap(c), d = (uint32_t)qm__opt.free_delay;
  unsigned n = 0;
  qm_lock(&cl->lock);
  for (; n < room && cl->lq.n; n++) {
    qm_aged_t e = cl->limbo[qm_age_pop(&cl->lq, cap)];
    uint32_t age = cl->clock - e.at;
    items[n] = e.item;
    ages[n] = age < d ? age : d;
  }
  limbo_left(c, cl, n);
  qm_unlock(&cl->lock);
  return n;
}

void qm__central_hold(unsigned c, unsigned group, uintptr_t s, uint32_t age) {
  central_t *cl = &central[c];
  if (!cl->limbo) { /* no delay, or before init */
    qm__central_give(c, group, &s, 1);
    return;
  }
  uint32_t cap = qm_limbo_cap(c);
  unsigned g = group % QM_GROUPS;
  size_t size = qm_chunk_size_of(c), budget = (size_t)qm__opt.free_delay_kb << 10, over = 0;
  qm_lock(&cl->lock);
  unsigned others = qm_groups_used(cl) & ~(1u << g);
  if (qm_age_full(&cl->lq, cap)) {
    limbo_release_oldest(c, cl, g, others);
    atomic_fetch_add_explicit(&limbo_early, 1, memory_order_relaxed);
  }
  /* over the budget: this class's oldest go first; if that is not enough,
   * this chunk goes back into use now (the other classes' chunks are under
   * their own locks, which no class lock may wait for) */
  while (cl->lq.n && atomic_load_explicit(&limbo_bytes, memory_order_relaxed) + size > budget) {
    limbo_release_oldest(c, cl, g, others);
    over++;
  }
  if (atomic_load_explicit(&limbo_bytes, memory_order_relaxed) + size > budget) {
    qm__central_put_locked(c, cl, g, others, s);
    over++;
  } else {
    cl->limbo[qm_age_push(&cl->lq, cap)] = (qm_aged_t){s, cl->clock - age};
    atomic_fetch_add_explicit(&limbo_bytes, size, memory_order_relaxed);
  }
  atomic_store_explicit(&cl->held, cl->lq.n, memory_order_relaxed);
  qm_unlock(&cl->lock);
  if (over)
    atomic_fetch_add_explicit(&limbo_over, over, memory_order_relaxed);
}

size_t qm__central_limbo_early(void) {
  return atomic_load_explicit(&limbo_early, memory_order_relaxed);
}
size_t qm__central_limbo_over(void) {
  return atomic_load_explicit(&limbo_over, memory_order_relaxed);
}
#ifdef QM_TEST_HOOKS
size_t qm__central_limbo_bytes(void) {
  return atomic_load_explicit(&limbo_bytes, memory_order_relaxed);
}
#endif
