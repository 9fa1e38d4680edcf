/* chunk.h: the small-chunk header. Every primary chunk starts with a 16-byte
 * header; the user pointer is chunk + 16 + offset (offset > 0 only for
 * over-aligned requests). Word 0 is the guard word, word 1 the header word:
 * checksum:16 state:2 offset/16:14 size:32. The checksum covers every other
 * bit of the header word (the state included), keyed by its class region's
 * key and the chunk address, so a flipped bit, a header copied from
 * elsewhere or one forged in another class fails. Every state change
 * recomputes it; free makes its change with a compare-and-swap, so two
 * racing frees cannot both succeed. A header word of zero is a chunk whose
 * page went back to the kernel; chunks in free lists otherwise carry a valid
 * FREE header.
 *
 * The guard word and the canary are one keyed byte pattern laid over the
 * region, periodic in 8: the byte at address A is byte A mod 8 of the
 * region's guard key, so every 8-aligned word reads the key itself. A
 * chunk's guard word holds it, and so do the 8 bytes after its requested
 * ones (written at malloc): a 1- to 8-byte overflow changes them whether
 * they lie in the chunk's slack or, for a chunk with less than 8 bytes of
 * room, reach the next chunk's guard word, which holds the same pattern.
 * Position alone decides the pattern (a rotation of the key), so both checks
 * are one load and one compare. The key differs per class region; binding it
 * to the address as well would add nothing against a leak, since one leaked
 * word and its address give the key either way.
 */
#ifndef QM_CHUNK_H
#define QM_CHUNK_H

#include <stdint.h>

#include "qm.h"

#define QM_HDR 16u

enum { QM_CHUNK_NONE = 0, QM_CHUNK_ALLOC = 1, QM_CHUNK_FREE = 2 };

#define QM_HDR_SUM_MASK ((uint64_t)0xffff)

/* One multiply, by the key itself (made odd): a flip of any input bit
 * changes the top 16 bits of the product with probability 1 - 2^-16, and
 * the key makes them unguessable. A multiplier shared by every class would
 * not do: the top bits of (x ^ k1) * G and (x ^ k2) * G then collide for a
 * whole run of nearby chunk addresses at once, so a header copied into
 * another class forged many chunks or none. */
QM_INLINE uint64_t qm_hdr_sum(uintptr_t chunk, uint64_t w, uint64_t key) {
  return ((w & ~QM_HDR_SUM_MASK) ^ chunk ^ key) * (key | 1) >> 48;
}

QM_INLINE uint64_t qm_hdr_make(uintptr_t chunk, uint64_t key, unsigned state, uint64_t offset,
                               uint64_t size) {
  uint64_t w = ((uint64_t)state << 16) | ((offset >> 4) << 18) | (size << 32);
  return w | qm_hdr_sum(chunk, w, key);
}

QM_INLINE unsigned qm_hdr_state(uint64_t w) { return (unsigned)(w >> 16) & 3; }
QM_INLINE uint64_t qm_hdr_offset(uint64_t w) { return ((w >> 18) & 0x3fff) << 4; }
QM_INLINE uint64_t qm_hdr_size(uint64_t w) { return w >> 32; }
QM_INLINE bool qm_hdr_valid(uintptr_t chunk, uint64_t w, uint64_t key) {
  return (w & QM_HDR_SUM_MASK) == qm_hdr_sum(chunk, w, key);
}
/* The same header in another state, checksum recomputed. */
QM_INLINE uint64_t qm_hdr_restate(uintptr_t chunk, uint64_t key, uint64_t w, unsigned state) {
  uint64_t v = (w & ~(QM_HDR_SUM_MASK | (uint64_t)3 << 16)) | (uint64_t)state << 16;
  return v | qm_hdr_sum(chunk, v, key);
}

/* The 8 pattern bytes starting at any address x (little-endian: the byte
 * at x + i is byte (x + i) mod 8 of the key). Every byte of the key has its
 * top bit set (see qm_guard_key), so an overflow by any ASCII byte (the NUL
 * of an off-by-one string copy included) always changes it; other bytes
 * match with odds of 1 in 128. */
QM_INLINE uint64_t qm_pattern8(uintptr_t x, uint64_t gkey) {
  unsigned k = (unsigned)(x & 7) * 8;
  return (gkey >> k) | (gkey << ((64 - k) & 63));
}
/* A region's guard key from random bits: the top bit of every byte set. */
QM_INLINE uint64_t qm_guard_key(uint64_t bits) { return bits | 0x8080808080808080ull; }

QM_INLINE uint64_t *qm_hdr_at(uintptr_t chunk) { return (uint64_t *)(chunk + 8); }
QM_INLINE uint64_t *qm_guard_at(uintptr_t chunk) { return (uint64_t *)chunk; }

#endif
