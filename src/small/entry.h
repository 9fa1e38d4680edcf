/* entry.h: the format of a small chunk's table entry and of the slots the
 * bins and central lists carry: bit fields and pure functions of them, with
 * no state. The chunks' state machine (smallstate.c, and inbox.c for frees
 * that cross threads) owns the tables and alone changes their entries; the
 * primary reads an entry when it hands a chunk out of a central list.
 */
#ifndef QM_ENTRY_H
#define QM_ENTRY_H

#include <stdint.h>

#include "qm.h"

/* An entry: size:18 offset/16:12 state:2 owner:12 align:4 generation:16
 * (low to high). The generation moves on at every free: a free sent to the
 * owner names the generation it saw, so a chunk freed and handed out again
 * in between is not freed a second time, and the canary changes with it.
 * align is the alignment the chunk was asked for, log2 - 4 (0: malloc's 16,
 * 1..12: 32 to 64 KiB), so an aligned free names exactly what was
 * allocated; it is never 15, so no entry has QM_E_NOBODY's all-ones. */
#define QM_E_SIZE ((uint64_t)0x3ffff)
#define QM_E_OFF_SHIFT 18
#define QM_E_OFF ((uint64_t)0xfff << QM_E_OFF_SHIFT)
#define QM_E_STATE_SHIFT 30
#define QM_E_STATE ((uint64_t)3 << QM_E_STATE_SHIFT)
#define QM_E_OWNER_SHIFT 32
/* owner and alignment together: the free fast path compares both with
 * the thread's identity, whose alignment is malloc's (0), so a chunk asked
 * for more takes the slow path */
#define QM_E_OWNER ((uint64_t)0xffff << QM_E_OWNER_SHIFT)
#define QM_E_ID ((uint64_t)0xfff << QM_E_OWNER_SHIFT)
#define QM_E_ALIGN_SHIFT 44
#define QM_E_ALIGN ((uint64_t)0xf << QM_E_ALIGN_SHIFT)
#define QM_E_GEN_SHIFT 48
#define QM_E_GEN ((uint64_t)0xffff << QM_E_GEN_SHIFT)

/* SENT: freed by a thread that is not the owner, which made the change by
 * compare-and-swap and sent the chunk to the owner; the owner makes it
 * FREE. Of two such frees the second finds SENT and reports at once. */
enum { QM_CHUNK_NONE = 0, QM_CHUNK_ALLOC = 1, QM_CHUNK_FREE = 2, QM_CHUNK_SENT = 3 };
/* the identity of a thread that owns nothing: an owner no entry has */
#define QM_E_NOBODY ((uint64_t)QM_CHUNK_ALLOC << QM_E_STATE_SHIFT | QM_E_OWNER)
/* Thread ids (1..QM_MAX_OWNERS-1) that can own chunks; 0 is "nobody". */
#define QM_MAX_OWNERS 4096u /* QM_E_ID's 12 bits */

QM_INLINE unsigned qm_e_state(uint64_t w) { return (unsigned)(w >> QM_E_STATE_SHIFT) & 3; }
QM_INLINE size_t qm_e_size(uint64_t w) { return (size_t)(w & QM_E_SIZE); }
QM_INLINE size_t qm_e_offset(uint64_t w) { return (size_t)((w & QM_E_OFF) >> QM_E_OFF_SHIFT) << 4; }
QM_INLINE unsigned qm_e_owner(uint64_t w) { return (unsigned)(w >> QM_E_OWNER_SHIFT) & 0xfff; }
/* the alignment a chunk was asked for (16 for malloc's), and the code of
 * one (a power of two, 16 to 64 KiB) */
QM_INLINE size_t qm_e_align(uint64_t w) {
  return (size_t)QM_MIN_ALIGN << ((w & QM_E_ALIGN) >> QM_E_ALIGN_SHIFT);
}
QM_INLINE uint64_t qm_e_align_code(size_t align) {
  return align > QM_MIN_ALIGN ? (uint64_t)(__builtin_ctzll(align) - 4) << QM_E_ALIGN_SHIFT : 0;
}
QM_INLINE uint64_t qm_e_gen(uint64_t w) { return w >> QM_E_GEN_SHIFT; }
QM_INLINE uint64_t qm_e_make(unsigned state, unsigned owner, uint64_t gen, size_t off, size_t n) {
  return (uint64_t)n | (uint64_t)(off >> 4) << QM_E_OFF_SHIFT |
         (uint64_t)state << QM_E_STATE_SHIFT | (uint64_t)owner << QM_E_OWNER_SHIFT |
         (gen & 0xffff) << QM_E_GEN_SHIFT;
}
/* The FREE entry that follows ALLOC (or SENT) entry w: the next generation;
 * owner, size and offset kept for the report of a second free. */
QM_INLINE uint64_t qm_e_freed(uint64_t w) {
  return ((w & ~QM_E_STATE) | (uint64_t)QM_CHUNK_FREE << QM_E_STATE_SHIFT) +
         ((uint64_t)1 << QM_E_GEN_SHIFT);
}
/* The same for an ALLOC entry, by one add: state 1 + 1 is FREE (2), and
 * the generation's carry leaves the word. */
QM_INLINE uint64_t qm_e_freed_alloc(uint64_t w) {
  return w + ((uint64_t)(QM_CHUNK_FREE - QM_CHUNK_ALLOC) << QM_E_STATE_SHIFT) +
         ((uint64_t)1 << QM_E_GEN_SHIFT);
}
QM_INLINE uint64_t qm_e_sent(uint64_t w) {
  return (w & ~QM_E_STATE) | (uint64_t)QM_CHUNK_SENT << QM_E_STATE_SHIFT;
}

QM_INLINE uint64_t qm_entry_load(const uint64_t *e) { return __atomic_load_n(e, __ATOMIC_RELAXED); }
QM_INLINE void qm_entry_store(uint64_t *e, uint64_t w) { __atomic_store_n(e, w, __ATOMIC_RELAXED); }

/* Thread-cache bins and the central lists carry chunk | generation << 48:
 * malloc then writes the entry without reading it first. */
#define QM_SLOT_ADDR QM_ADDR_MASK
QM_INLINE uintptr_t qm_slot_chunk(uintptr_t s) { return s & QM_SLOT_ADDR; }
QM_INLINE uint64_t qm_slot_gen(uintptr_t s) { return (uint64_t)s >> QM_ADDR_BITS; }
_Static_assert(QM_E_GEN_SHIFT == QM_ADDR_BITS, "a slot's generation sits where an entry's does");
QM_INLINE uintptr_t qm_slot_make(uintptr_t ch, uint64_t gen) {
  return ch | (uintptr_t)(gen & 0xffff) << QM_ADDR_BITS;
}

#endif
