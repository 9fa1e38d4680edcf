/* fuzz_api.c: libFuzzer harness that drives random sequences of the whole
 * qm_ API (sizes from 0 to several MiB, across the 128 KiB large threshold)
 * against a shadow model of the live chunks: no two overlap, each keeps its
 * pattern until freed and through realloc, alignment and usable size hold
 * (exactly the request for a small chunk), malloc_object_size names the
 * request and a freed chunk, calloc memory is zero, errors give NULL and the
 * documented errno, and a successful call leaves errno alone; with
 * free_delay = D, a freed small chunk comes back only after more than D
 * hand-outs of its class (unless a delay ring overflowed or the rings held
 * free_delay_kb: counted). A zero-size
 * chunk is never read or written (it faults). Live memory is bounded, so one
 * input never holds more than LIVE_MAX bytes; every input frees all it
 * allocated. Run under QMALLOC_OPTIONS=hardening=max too (the fuzz suite). */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cache.h"
#include "options.h"
#include "primary.h"
#include "qmalloc.h"

#define LIVE_CHUNKS 192
#define LIVE_MAX ((size_t)48 << 20)
#define ERRNO_MARK 7919 /* no errno value: a call that sets errno is seen */
/* 1: realloc must keep what was written in the usable slack past the size
 * asked for (a large chunk's, up to its page end), on every path. */
#ifndef REALLOC_KEEPS_SLACK
#define REALLOC_KEEPS_SLACK 1
#endif

typedef struct chunk {
  unsigned char *p;
  size_t req;    /* bytes asked for (what free_sized must be passed) */
  size_t usable; /* malloc_usable_size when it was handed out */
  size_t align;  /* alignment asked for, 0 if none; free_aligned_sized takes it */
  uint64_t tag;  /* seed of the pattern written over [0, usable) */
  int zeroed;    /* from calloc: [0, req) was checked zero */
  int sized;     /* free_sized (or free_aligned_sized) may be passed req */
} chunk_t;

static chunk_t live[LIVE_CHUNKS];
static size_t nlive, live_bytes;
static uint64_t next_tag = 1;

/* ---- the input ---- */

typedef struct in {
  const uint8_t *d;
  size_t n, i;
} in_t;

static unsigned byte(in_t *in) { return in->i < in->n ? in->d[in->i++] : 0; }
static unsigned u16(in_t *in) { return byte(in) | byte(in) << 8; }
static unsigned u24(in_t *in) { return u16(in) | byte(in) << 16; }

/* A size from one of the ranges that matter: tiny, the small classes, the
 * 128 KiB threshold (and the page multiples around it), large, multi-MiB. */
static size_t pick_size(in_t *in) {
  unsigned sel = byte(in);
  switch (sel % 20) {
  case 0:
  case 1:
    return byte(in) % 33;
  case 2:
  case 3:
  case 4:
  case 5:
  case 6:
    return 1 + u16(in) % 2048;
  case 7:
  case 8:
  case 9:
    return u24(in) % (128 << 10);
  case 10:
  case 11:
    return (128 << 10) - 4096 + u16(in) % 8193; /* 124..132 KiB */
  case 12:
  case 13:
    return (size_t)(1 + byte(in) % 64) * 4096 - 16 + byte(in) % 33;
  case 14:
  case 15:
  case 16:
    return (128 << 10) + u24(in) % (1 << 20);
  case 17:
    return ((size_t)2 << 20) + (size_t)(byte(in) % 6) * (1 << 20) + u16(in);
  default:
    return ((size_t)1 << (byte(in) % 23)) + (sel & 32 ? 0 : (sel & 64 ? 1 : (size_t)-1));
  }
}

static size_t pick_align(in_t *in) { return (size_t)1 << (byte(in) % 25); }

/* ---- patterns ---- */

static void die(const char *what, const chunk_t *c, size_t off) {
  fprintf(stderr, "fuzz-api: %s: chunk %p req %zu usable %zu align %zu, offset %zu\n", what,
          c ? (void *)c->p : NULL, c ? c->req : 0, c ? c->usable : 0, c ? c->align : 0, off);
  abort();
}

static uint64_t word_at(uint64_t tag, size_t k) {
  return tag * 0x9E3779B97F4A7C15u + k * 0xD1B54A32D192ED03u;
}

/* The 8-byte words of [0, len) that a pattern covers: all of them up to
 * 8 KiB; above, the first and last 2 KiB in full and every 32nd word in
 * between (each page is still written, a large chunk costs its faults and
 * not a full pass). The bytes of a last partial word are covered too. */
typedef int (*visit_fn)(unsigned char *p, size_t off, size_t n, uint64_t tag, void *arg);

static int visit(unsigned char *p, size_t len, uint64_t tag, visit_fn fn, void *arg) {
  size_t words = len / 8, full_head = words, tail_from = words;
  if (len > (8 << 10)) {
    full_head = 256;
    tail_from = words - 256;
  }
  for (size_t k = 0; k < words;) {
    if (fn(p, k * 8, 8, tag, arg))
      return 1;
    if (k + 1 >= full_head && k + 1 < tail_from) {
      size_t next = (k / 32 + 1) * 32;
      k = next < tail_from ? next : tail_from;
    } else {
      k++;
    }
  }
  if (len % 8 && fn(p, words * 8, len % 8, tag, arg))
    return 1;
  return 0;
}

/* Fixed-size memcpy compiles to a plain (unaligned) access, not a call. */
static int put_fn(unsigned char *p, size_t off, size_t n, uint64_t tag, void *arg) {
  (void)arg;
  uint64_t w = word_at(tag, off / 8);
  if (n == 8)
    memcpy(p + off, &w, 8);
  else
    memcpy(p + off, &w, n);
  return 0;
}

static int check_fn(unsigned char *p, size_t off, size_t n, uint64_t tag, void *arg) {
  size_t limit = *(size_t *)arg;
  if (off >= limit)
    return 0;
  if (off + n > limit)
    n = limit - off;
  uint64_t w = word_at(tag, off / 8), got;
  if (n == 8)
    return memcpy(&got, p + off, 8), got != w;
  return memcmp(p + off, &w, n) != 0;
}

static int zero_fn(unsigned char *p, size_t off, size_t n, uint64_t tag, void *arg) {
  (void)tag;
  size_t limit = *(size_t *)arg;
  if (off >= limit)
    return 0;
  if (off + n > limit)
    n = limit - off;
  uint64_t got = 0;
  memcpy(&got, p + off, n);
  return got != 0;
}

/* Checks that [0, limit) of p still holds the pattern of a chunk of
 * `usable` bytes written with tag (limit <= usable). */
static void check_pattern(const chunk_t *c, unsigned char *p, size_t usable, uint64_t tag,
                          size_t limit, const char *what) {
  if (visit(p, usable, tag, check_fn, &limit)) {
    for (size_t off = 0; off < limit; off++) {
      uint64_t w = word_at(tag, off / 8);
      if (p[off] != ((unsigned char *)&w)[off % 8])
        die(what, c, off);
    }
    die(what, c, 0);
  }
}

/* ---- the shadow ---- */

static void check_no_overlap(unsigned char *p, size_t len, const chunk_t *self) {
  uintptr_t a = (uintptr_t)p, e = a + (len ? len : 1);
  for (size_t i = 0; i < nlive; i++) {
    const chunk_t *c = &live[i];
    if (c == self)
      continue;
    uintptr_t b = (uintptr_t)c->p, f = b + (c->usable ? c->usable : 1);
    if (a < f && b < e) {
      fprintf(stderr, "fuzz-api: new chunk %p (+%zu) overlaps live chunk %p (+%zu)\n", (void *)p,
              len, (void *)c->p, c->usable);
      abort();
    }
  }
}

/* A chunk of the primary (zero-size ones included), from its address. */
static int is_small(const void *p) { return (uintptr_t)p - qm__pbase < qm__pspan; }

static int is_zero_size(const void *p) {
  return is_small(p) && ((uintptr_t)p - qm__pbase) >> qm__rshift == QM_ZCLASS;
}

/* malloc_object_size of a live chunk: the request from its start, 1 at its
 * last byte; 0 past the end of a small one (its canary) */
static void check_object_size(const chunk_t *c) {
  size_t got = qm_malloc_object_size(c->p);
  if (got != c->req)
    die("malloc_object_size of a live chunk is not its request", c, got);
  if (c->req && (got = qm_malloc_object_size(c->p + c->req - 1)) != 1)
    die("malloc_object_size of the last byte is not 1", c, got);
  if (c->req && is_small(c->p) && (got = qm_malloc_object_size(c->p + c->req)) != 0)
    die("malloc_object_size past the end of a small chunk is not 0", c, got);
}

/* ---- free_delay ---- */

/* Small chunks freed in this input: address, class, the class's hand-out
 * count and the ring's early-pop count at the free. An open-addressed table
 * (an input frees at most 4096 + LIVE_CHUNKS chunks), emptied per input. */
#define FREED_SLOTS 16384
typedef struct freed {
  uintptr_t p;
  uint64_t at, early;
} freed_t;
static freed_t freed[FREED_SLOTS];
static uint64_t handed[QM_NCLASS];
static size_t nfreed;

static unsigned class_at(const void *p) {
  return (unsigned)(((uintptr_t)p - qm__pbase) >> qm__rshift);
}

static freed_t *freed_slot(uintptr_t p) {
  size_t h = (size_t)((p >> 4) * 0x9E3779B97F4A7C15u >> 50) % FREED_SLOTS;
  while (freed[h].p && freed[h].p != p)
    h = (h + 1) % FREED_SLOTS;
  return &freed[h];
}

/* Frees that left a delay ring or the limbo early, as they may: a ring or
 * the limbo was full, or held free_delay_kb. */
static uint64_t delay_early(void) { return qm__cache_delay_early() + qm__cache_delay_over_count(); }

static void note_free(const void *p) {
  if (!qm__opt.free_delay || !is_small(p) || class_at(p) >= QM_NCLASS || nfreed >= FREED_SLOTS / 2)
    return;
  freed_t *f = freed_slot((uintptr_t)p);
  nfreed += !f->p;
  *f = (freed_t){(uintptr_t)p, handed[class_at(p)], delay_early()};
}

/* A small chunk handed out (a realloc that stayed put is not one). */
static void note_handout(const chunk_t *c) {
  if (!qm__opt.free_delay || !is_small(c->p) || class_at(c->p) >= QM_NCLASS)
    return;
  unsigned k = class_at(c->p);
  uint64_t now = ++handed[k];
  freed_t *f = freed_slot((uintptr_t)c->p);
  if (!f->p)
    return;
  /* a ring that overflowed, or the rings over free_delay_kb, pushed their
   * oldest out early: that is allowed, and counted */
  if (f->early == delay_early() && now - f->at <= qm__opt.free_delay)
    die("a freed chunk came back within free_delay hand-outs of its class", c,
        (size_t)(now - f->at));
  f->at = 0, f->early = (uint64_t)-1; /* live again: a tombstone, not a hole */
}

static void reset_freed(void) {
  if (nfreed)
    memset(freed, 0, sizeof freed);
  nfreed = 0;
}

/* Takes in a chunk just returned: checks it and writes its pattern. */
static void adopt(chunk_t *c, unsigned char *p, size_t req, size_t align, int zeroed,
                  int in_place) {
  size_t usable = qm_malloc_usable_size(p);
  c->p = p;
  c->req = req;
  c->usable = usable;
  c->align = align;
  c->zeroed = zeroed;
  c->sized = 1;
  if (usable < req)
    die("usable size below the request", c, usable);
  /* the canary sits right after the request: nothing more may be written */
  if (is_small(p) && usable != req)
    die("usable size of a small chunk is not the request", c, usable);
  /* malloc(0) and its like: a distinct address that faults, in the zero
   * region; any other request of 0 (an aligned one) is a real chunk */
  if (!req && !align && !is_zero_size(p))
    die("malloc(0) outside the zero-size region", c, 0);
  check_object_size(c);
  /* 16 bytes for every request of 16 or more, as glibc; more if asked */
  size_t a = align > 16 ? align : req >= 16 ? 16 : 1;
  if (req && ((uintptr_t)p & (a - 1)))
    die("misaligned", c, (uintptr_t)p & (a - 1));
  check_no_overlap(p, usable, c);
  if (!in_place)
    note_handout(c);
  if (zeroed && visit(p, usable, 0, zero_fn, &req))
    die("calloc memory not zero", c, 0);
  c->tag = next_tag++;
  visit(p, usable, c->tag, put_fn, NULL);
}

static int room_for(size_t n) {
  return nlive < LIVE_CHUNKS && n <= LIVE_MAX && live_bytes + n <= LIVE_MAX;
}

static void verify(const chunk_t *c, const char *what) {
  if (qm_malloc_usable_size(c->p) != c->usable)
    die("usable size changed", c, qm_malloc_usable_size(c->p));
  check_pattern(c, c->p, c->usable, c->tag, c->usable, what);
}

static void drop(size_t i) {
  live_bytes -= live[i].usable;
  live[i] = live[--nlive];
}

static void release(size_t i, int how) {
  chunk_t *c = &live[i];
  verify(c, "chunk changed before free");
  errno = ERRNO_MARK;
  if (how == 1 && c->sized && !c->align)
    qm_free_sized(c->p, c->req);
  else if (how == 2 && c->sized && c->align)
    qm_free_aligned_sized(c->p, c->align, c->req);
  else
    qm_free(c->p);
  if (errno != ERRNO_MARK)
    die("free changed errno", c, (size_t)errno);
  note_free(c->p);
  /* freed: no live chunk is there (nothing was handed out since); a large
   * one may be unmapped already, then it is not qmalloc's memory */
  size_t os = qm_malloc_object_size(c->p);
  if (os != 0 && !(os == SIZE_MAX && !is_small(c->p)))
    die("malloc_object_size of a freed chunk is not 0", c, os);
  drop(i);
}

/* Frees the oldest chunks until n more bytes fit the bound. */
static void make_room(size_t n) {
  while (nlive && !room_for(n))
    release(0, 0);
}

static void keep(unsigned char *p, size_t req, size_t align, int zeroed) {
  chunk_t *c = &live[nlive++];
  adopt(c, p, req, align, zeroed, 0);
  live_bytes += c->usable;
}

static void expect_ok(void *p, const char *call, size_t n) {
  if (!p) {
    fprintf(stderr, "fuzz-api: %s(%zu) failed: errno %d, %zu chunks %zu bytes live\n", call, n,
            errno, nlive, live_bytes);
    abort();
  }
  if (errno != ERRNO_MARK) {
    fprintf(stderr, "fuzz-api: %s(%zu) succeeded but changed errno to %d\n", call, n, errno);
    abort();
  }
}

static void expect_fail(void *p, int err, const char *call) {
  if (p || errno != err) {
    fprintf(stderr, "fuzz-api: %s: got %p errno %d, expected NULL errno %d\n", call, p, errno, err);
    abort();
  }
}

/* A realloc-like call over live[i]: checks the bytes that must survive. */
static void after_realloc(size_t i, unsigned char *q, size_t n) {
  chunk_t old = live[i];
  size_t kept = REALLOC_KEEPS_SLACK ? old.usable : old.req;
  size_t keep_n = kept < n ? kept : n;
  live_bytes -= old.usable;
  check_pattern(&old, q, old.usable, old.tag, keep_n, "contents lost by realloc");
  adopt(&live[i], q, n, 0, 0, q == old.p);
  if (q != old.p)
    note_free(old.p);
  live_bytes += live[i].usable;
}

static void one_op(in_t *in) {
  unsigned op = byte(in) % 20;
  size_t n, m, a;
  void *p;
  switch (op) {
  case 0:
  case 1:
  case 2:
    n = pick_size(in);
    make_room(n);
    errno = ERRNO_MARK;
    p = qm_malloc(n);
    expect_ok(p, "malloc", n);
    keep(p, n, 0, 0);
    break;
  case 3:
    m = 1 + byte(in) % 16;
    n = pick_size(in) / m;
    make_room(n * m);
    errno = ERRNO_MARK;
    p = qm_calloc(m, n);
    expect_ok(p, "calloc", n * m);
    keep(p, n * m, 0, 1);
    break;
  case 4:
  case 5:
  case 6: {
    /* realloc, reallocarray; of NULL when nothing is live */
    n = pick_size(in);
    int arr = op == 6;
    m = arr ? 1 + byte(in) % 8 : 1;
    n /= m;
    if (!nlive) {
      make_room(n * m);
      errno = ERRNO_MARK;
      p = arr ? qm_reallocarray(NULL, m, n) : qm_realloc(NULL, n);
      expect_ok(p, "realloc(NULL)", n * m);
      keep(p, n * m, 0, 0);
      break;
    }
    size_t i = byte(in) % nlive;
    if (n * m == 0) { /* glibc: realloc(p, 0) frees p and returns NULL */
      verify(&live[i], "chunk changed before realloc");
      errno = ERRNO_MARK;
      p = arr ? qm_reallocarray(live[i].p, m, 0) : qm_realloc(live[i].p, 0);
      if (p || errno != ERRNO_MARK)
        die("realloc(p, 0) did not free p quietly", &live[i], (size_t)errno);
      note_free(live[i].p);
      drop(i);
      break;
    }
    if (live_bytes - live[i].usable + n * m > LIVE_MAX)
      break;
    verify(&live[i], "chunk changed before realloc");
    errno = ERRNO_MARK;
    p = arr ? qm_reallocarray(live[i].p, m, n) : qm_realloc(live[i].p, n);
    expect_ok(p, arr ? "reallocarray" : "realloc", n * m);
    after_realloc(i, p, n * m);
    break;
  }
  case 7:
  case 8: {
    int which = byte(in) % 3;
    a = pick_align(in);
    n = pick_size(in);
    make_room(n);
    errno = ERRNO_MARK;
    if (which == 0) {
      if (a < sizeof(void *))
        a = sizeof(void *);
      void *out = NULL;
      int err = qm_posix_memalign(&out, a, n);
      if (err)
        errno = err;
      p = out;
    } else if (which == 1) {
      p = qm_aligned_alloc(a, n);
    } else {
      /* memalign rounds an alignment that is not a power of two up */
      size_t asked = a > 1 && byte(in) % 2 ? a + a / 2 : a;
      p = qm_memalign(asked, n);
      a = asked > a ? a * 2 : a;
    }
    expect_ok(p, which == 0 ? "posix_memalign" : which == 1 ? "aligned_alloc" : "memalign", n);
    keep(p, n, a, 0);
    break;
  }
  case 9: {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    int pv = byte(in) % 2;
    n = pick_size(in);
    /* pvalloc rounds up to whole pages, at least one */
    size_t need = !pv ? n : n ? (n + page - 1) / page * page : page;
    make_room(need);
    errno = ERRNO_MARK;
    p = pv ? qm_pvalloc(n) : qm_valloc(n);
    expect_ok(p, pv ? "pvalloc" : "valloc", n);
    keep(p, need, page, 0);
    if ((uintptr_t)p % page)
      die("valloc not page-aligned", &live[nlive - 1], (uintptr_t)p % page);
    break;
  }
  case 10:
  case 11:
  case 12:
  case 13:
  case 14:
  case 15:
    if (nlive)
      release(byte(in) % nlive, (int)(op % 3));
    break;
  case 16:
    if (nlive)
      verify(&live[byte(in) % nlive], "chunk changed while live");
    break;
  case 17: {
    /* requests that must fail, and leave every live chunk as it was */
    int which = byte(in) % 8;
    size_t huge = ((size_t)1 << (47 + byte(in) % 17)) - (byte(in) % 2);
    errno = ERRNO_MARK;
    switch (which) {
    case 0:
      expect_fail(qm_malloc(huge), ENOMEM, "malloc(huge)");
      break;
    case 1:
      expect_fail(qm_calloc(huge, 1u << 20), ENOMEM, "calloc overflow");
      break;
    case 2:
      expect_fail(qm_aligned_alloc(3 << (byte(in) % 12), 64), EINVAL, "aligned_alloc(bad)");
      break;
    case 3: {
      void *out = (void *)1;
      int err = qm_posix_memalign(&out, 24 << (byte(in) % 8), 64);
      if (err != EINVAL || out != (void *)1 || errno != ERRNO_MARK)
        die("posix_memalign(bad alignment) not EINVAL, or touched errno/out", NULL, (size_t)err);
      break;
    }
    case 4:
      /* glibc's contract: EINVAL only past 2^63 (rounding up would
       * overflow); an alignment it rounds up but cannot serve is ENOMEM */
      if (byte(in) & 1)
        expect_fail(qm_memalign(((size_t)1 << 63) + 1, 64), EINVAL,
                    "memalign(alignment past 2^63)");
      else
        expect_fail(qm_memalign(((size_t)1 << 62) + 1, 64), ENOMEM, "memalign(huge alignment)");
      break;
    case 5:
    case 6:
      if (nlive) {
        size_t i = byte(in) % nlive;
        p = which == 5 ? qm_realloc(live[i].p, huge) : qm_reallocarray(live[i].p, huge, 1u << 20);
        expect_fail(p, ENOMEM, which == 5 ? "realloc(huge)" : "reallocarray overflow");
        verify(&live[i], "a failed realloc changed the chunk");
      }
      break;
    default:
      expect_fail(qm_aligned_alloc(64, huge), ENOMEM, "aligned_alloc(huge)");
      break;
    }
    break;
  }
  case 18: {
    errno = ERRNO_MARK;
    qm_free(NULL);
    qm_free_sized(NULL, byte(in));
    if (qm_malloc_usable_size(NULL) != 0)
      die("malloc_usable_size(NULL) != 0", NULL, 0);
    if (errno != ERRNO_MARK)
      die("free(NULL) changed errno", NULL, (size_t)errno);
    struct mallinfo2 mi = qm_mallinfo2();
    /* in use: small chunks whole, large ones by the size asked for */
    size_t req = 0;
    for (size_t i = 0; i < nlive; i++)
      req += live[i].req;
    if (mi.uordblks < req)
      die("mallinfo2 counts fewer bytes in use than were asked for", NULL, mi.uordblks);
    break;
  }
  default:
    if (byte(in) % 64 == 0) /* rare: it unmaps and refaults whole classes */
      qm_malloc_trim(0);
    for (size_t i = 0; i < nlive; i++)
      verify(&live[i], "chunk changed");
    break;
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  in_t in = {data, size, 0};
  reset_freed();
  for (unsigned ops = 0; in.i < in.n && ops < 4096; ops++)
    one_op(&in);
  while (nlive)
    release(nlive - 1, 0);
  qm_stats_t s;
  qm_stats(&s);
  if (s.large_live_chunks || s.large_live_bytes) {
    fprintf(stderr, "fuzz-api: everything freed, but %llu large chunks (%llu bytes) live\n",
            (unsigned long long)s.large_live_chunks, (unsigned long long)s.large_live_bytes);
    abort();
  }
  return 0;
}
