/* canary.h: a small chunk's table entry found, and its canary: inline
 * reads keyed by its class (qm__class, sealed), with no state of their own;
 * for the state machine's files and the primary's hand-out alike.
 */
#ifndef QM_CANARY_H
#define QM_CANARY_H

#include <stdint.h>
#include <string.h>

#include "primary.h"
#include "qm.h"

QM_INLINE uint64_t *qm_entry_at(unsigned c, uintptr_t index) { return qm__class[c].table + index; }

/* The 8 canary bytes after a chunk's requested ones: keyed per chunk (the
 * region's keys, the chunk address and its generation, through one 128-bit
 * multiply), so one leaked canary tells nothing of another chunk's or of
 * this chunk's next. Byte 1 is zero, so a string read past the end stops
 * there, having leaked at most byte 0; every other byte has its top bit set,
 * so an overflow by ASCII bytes (an off-by-one NUL included) always changes
 * it. */
QM_INLINE uint64_t qm_canary_of(uint64_t slot, unsigned c) {
  const qm_class_info_t *ci = &qm__class[c];
  uint64_t lo = slot ^ ci->key, hi;
#if defined(__x86_64__)
  /* the same multiply, without the 128-bit temporary that gcc kept on the
   * stack in the batch loop (a store and a reload on the check's path) */
  __asm__("mulq %2" : "+a"(lo), "=d"(hi) : "rm"(ci->ckey) : "cc");
#else
  unsigned __int128 m = (unsigned __int128)lo * ci->ckey;
  lo = (uint64_t)m;
  hi = (uint64_t)(m >> 64);
#endif
  uint64_t v = (hi ^ lo) & ~(uint64_t)0xff00;
  /* kept apart: merged, gcc makes them an and and an or of two 10-byte
   * constants, four instructions; apart, three */
  __asm__("" : "+r"(v));
  return v | 0x8080808080800080ull;
}
/* of chunk ch at generation gen: of its slot word */
QM_INLINE uint64_t qm_canary(uintptr_t ch, uint64_t gen, unsigned c) {
  return qm_canary_of(ch ^ gen << QM_ADDR_BITS, c);
}
/* The canary a parked slot (generation after the free) was written with:
 * of the generation before, by one subtract (generation 0 wraps to
 * 0xffff, the chunk bits below are untouched). */
QM_INLINE uint64_t qm_canary_before(uintptr_t slot, unsigned c) {
  return qm_canary_of(slot - ((uint64_t)1 << QM_ADDR_BITS), c);
}
QM_INLINE uint64_t qm_load8(uintptr_t a) {
  uint64_t v;
  memcpy(&v, (const void *)a, 8);
  return v;
}
QM_INLINE void qm_store8(uintptr_t a, uint64_t v) { memcpy((void *)a, &v, 8); }
/* A canary checked at a free (or moved by a resize) is zeroed: left in
 * place, a later and larger request of the same chunk would hold it in its
 * own bytes, where the program could read it (and a 16-bit generation
 * repeats); its line was just read, so the store costs no miss. */
QM_INLINE void qm_canary_clear(uintptr_t at) { qm_store8(at, 0); }

#endif
