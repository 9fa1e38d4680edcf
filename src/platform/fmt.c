/* fmt.c: number formatting and a write(2) loop with no allocation and no
 * locale; the only output path of the library. Truncates rather than
 * overflows: a buffer never holds more than sizeof(s) bytes.
 */
#include "fmt.h"

#include <errno.h>
#include <string.h>
#include <unistd.h>

static void put(qm_buf_t *b, char c) {
  if (b->n < sizeof(b->s))
    b->s[b->n++] = c;
}

void qm_buf_str(qm_buf_t *b, const char *s) {
  while (s && *s)
    put(b, *s++);
}

void qm_buf_mem(qm_buf_t *b, const char *s, size_t n) {
  for (size_t i = 0; i < n; i++)
    put(b, s[i]);
}

void qm_buf_escaped(qm_buf_t *b, const char *s, size_t n) {
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      put(b, (char)c);
      continue;
    }
    put(b, '\\');
    put(b, 'x');
    put(b, "0123456789abcdef"[c >> 4]);
    put(b, "0123456789abcdef"[c & 15]);
  }
}

void qm_buf_dec(qm_buf_t *b, uint64_t v) {
  char t[24];
  int i = 0;
  do {
    t[i++] = (char)('0' + v % 10);
    v /= 10;
  } while (v);
  while (i)
    put(b, t[--i]);
}

void qm_buf_offset(qm_buf_t *b, uintptr_t a, uintptr_t base) {
  qm_buf_str(b, a < base ? "offset -" : "offset ");
  qm_buf_dec(b, a < base ? base - a : a - base);
}

void qm_buf_hex(qm_buf_t *b, uint64_t v) {
  char t[16];
  int i = 0;
  qm_buf_str(b, "0x");
  do {
    t[i++] = "0123456789abcdef"[v & 15];
    v >>= 4;
  } while (v);
  while (i)
    put(b, t[--i]);
}

void qm_buf_pad_from(qm_buf_t *b, size_t mark, size_t width) {
  size_t len = b->n - mark;
  if (len >= width || b->n + (width - len) > sizeof(b->s))
    return;
  size_t pad = width - len;
  memmove(b->s + mark + pad, b->s + mark, len);
  memset(b->s + mark, ' ', pad);
  b->n += pad;
}

void qm_buf_flush(qm_buf_t *b, int fd) {
  size_t off = 0;
  int saved = errno; /* printing must not change what the caller sees */
  while (off < b->n) {
    ssize_t w = write(fd, b->s + off, b->n - off);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      break;
    off += (size_t)w;
  }
  b->n = 0;
  errno = saved;
}
