/* fmt.h: formatting into a fixed stack buffer and writing it with write(2).
 * Used by every message qmalloc prints (reports, warnings, stats), because
 * stdio may allocate and may be the very caller that is allocating.
 */
#ifndef QM_FMT_H
#define QM_FMT_H

#include <stddef.h>
#include <stdint.h>

typedef struct qm_buf {
  char s[1024];
  size_t n; /* bytes used; output past the end is dropped, never overflows */
} qm_buf_t;

void qm_buf_str(qm_buf_t *b, const char *s);
void qm_buf_mem(qm_buf_t *b, const char *s, size_t n); /* n bytes, NULs and all */
/* n bytes of text that came from outside (an option's name or value, a
 * path): control bytes, bytes past 0x7e and backslash as \xNN, so that
 * nothing the environment holds can start a line or steer a terminal. */
void qm_buf_escaped(qm_buf_t *b, const char *s, size_t n);
void qm_buf_dec(qm_buf_t *b, uint64_t v);
void qm_buf_hex(qm_buf_t *b, uint64_t v); /* 0x-prefixed */
/* "offset N" of address a from base, "offset -N" when a lies below it. */
void qm_buf_offset(qm_buf_t *b, uintptr_t a, uintptr_t base);
/* Pads with spaces on the left up to width, counted from mark. */
void qm_buf_pad_from(qm_buf_t *b, size_t mark, size_t width);
/* Writes the whole buffer to fd, retrying on EINTR and short writes. */
void qm_buf_flush(qm_buf_t *b, int fd);

#endif
