/* chunk.h: the small-chunk header. Every primary chunk starts with a 16-byte
 * header; the user pointer is chunk + 16 + offset (offset > 0 only for
 * over-aligned requests). Word 0 holds checksum:16 state:2 offset/16:14
 * size:32, the checksum keyed by a per-process secret and the chunk address,
 * so a header copied from elsewhere or overwritten by an overflow fails.
 * Word 1 is zero. A header of all zeroes is a chunk never handed out or one
 * whose page went back to the kernel.
 */
#ifndef QM_CHUNK_H
#define QM_CHUNK_H

#include <stdint.h>

#include "qm.h"

#define QM_HDR 16u

enum { QM_CHUNK_NONE = 0, QM_CHUNK_ALLOC = 1, QM_CHUNK_FREE = 2 };

extern uint64_t qm__secret;

/* The checksum covers everything but itself and the state bits, so that
 * free() turns ALLOC into FREE by flipping two bits, with no new checksum.
 * One multiply: a flip of any input bit changes the top 16 bits of the
 * product with probability 1 - 2^-16, and the key makes them unguessable. */
QM_INLINE uint64_t qm_hdr_sum(uintptr_t chunk, uint64_t w) {
  return ((w & ~(uint64_t)0x3ffff) ^ chunk ^ qm__secret) * 0x9e3779b97f4a7c15ull >> 48;
}

QM_INLINE uint64_t qm_hdr_make(uintptr_t chunk, unsigned state, uint64_t offset, uint64_t size) {
  uint64_t w = ((uint64_t)state << 16) | ((offset >> 4) << 18) | (size << 32);
  return w | qm_hdr_sum(chunk, w);
}

/* ALLOC (01) -> FREE (10): the checksum stays valid. */
#define QM_HDR_FREE_FLIP ((uint64_t)(QM_CHUNK_ALLOC ^ QM_CHUNK_FREE) << 16)

QM_INLINE unsigned qm_hdr_state(uint64_t w) { return (unsigned)(w >> 16) & 3; }
QM_INLINE uint64_t qm_hdr_offset(uint64_t w) { return ((w >> 18) & 0x3fff) << 4; }
QM_INLINE uint64_t qm_hdr_size(uint64_t w) { return w >> 32; }
QM_INLINE bool qm_hdr_valid(uintptr_t chunk, uint64_t w) {
  return (w & 0xffff) == qm_hdr_sum(chunk, w);
}

#endif
