/* report.c: the catalogue of fatal reports, one function per kind, and the
 * one formatter they share (emit_head, emit_summary: the kind's words are
 * facts, never read back from formatted text). Callers hand in all that is
 * printed (an address's place, a large chunk's kept stacks): this file
 * calls nothing of qmalloc's but the stack printer, out.c and fmt.c, so
 * that any part down to os.c may report. Fatal reports end in abort() so that a core dump and
 * the SIGABRT reach whoever watches the process; a second fatal error while
 * reporting aborts at once.
 */
#include "report.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "options.h"
#include "out.h"
#include "stack.h"

static atomic_int reporting;

/* ---- the one formatter ---- */

/* A fatal report's facts, as the catalogue below fills them. */
typedef struct head {
  const char *kind[3]; /* the kind's words, concatenated: SUMMARY names them */
  const char *mode;    /* after the kind on the first line only: " (write)" */
  const char *join;    /* between the kind and the pointer: " of", " at", ":" */
  const void *ptr;
  const qm_buf_t *details; /* NULL: none */
  const qm_kept_t *kept;   /* a large chunk's kept stacks follow; NULL: none */
  uintptr_t freed_at;      /* the free that parked a small chunk found bad later; 0: none */
} head_t;

static void put_kind(qm_buf_t *b, const head_t *h) {
  for (unsigned k = 0; k < 3; k++)
    if (h->kind[k])
      qm_buf_str(b, h->kind[k]);
}

/* "qmalloc: ERROR: <kind><mode><join> 0x<ptr> (<details>)": the pointer
 * is left out only for a report with details and no pointer (a failed
 * internal check). */
static void emit_head(const head_t *h) {
  qm_buf_t b;
  b.n = 0;
  qm_buf_str(&b, "qmalloc: ERROR: ");
  put_kind(&b, h);
  if (h->mode)
    qm_buf_str(&b, h->mode);
  if (h->join)
    qm_buf_str(&b, h->join);
  bool has_details = h->details && h->details->n;
  if (h->ptr || !has_details) {
    qm_buf_str(&b, " ");
    qm_buf_hex(&b, (uintptr_t)h->ptr);
  }
  if (has_details) {
    qm_buf_str(&b, " (");
    qm_buf_mem(&b, h->details->s, h->details->n);
    qm_buf_str(&b, ")");
  }
  qm_buf_str(&b, "\n");
  qm__out(&b);
}

/* How to turn the frames into functions and lines: before SUMMARY, which
 * stays the last line (the symbolizer drops this one once it named them). */
static void emit_hint(void) {
  qm_buf_t b;
  b.n = 0;
  qm_buf_str(&b, "  (qmalloc-symbolize: this report saved to a file, `qmalloc-symbolize FILE` "
                 "names each frame's function and line)\n");
  qm__out(&b);
}

/* "SUMMARY: qmalloc: <kind> (module+0xOFF) symbol+0xN", the first frame in
 * the program's own code (past libc's and the loader's): the last line of
 * every error report. */
static void emit_summary(const head_t *h, const uintptr_t *pc, unsigned n) {
  emit_hint();
  qm_buf_t b;
  b.n = 0;
  qm_buf_str(&b, "SUMMARY: qmalloc: ");
  put_kind(&b, h);
  if (h->freed_at) {
    qm_buf_str(&b, " ");
    qm__frame_where(&b, h->freed_at);
  } else if (n) {
    qm_buf_str(&b, " ");
    qm__frame_where(&b, pc[qm__frame_first_own(pc, n)]);
  }
  qm_buf_str(&b, "\n");
  qm__out(&b);
}

/* The stack of the call that found the error, printed after the report's
 * first line, and the frame the SUMMARY line names: the caller's frames
 * outside qmalloc, taken here, on the way to abort, so that no fast path
 * pays for it. stack_frames=0 drops the stacks kept per chunk, not this
 * one (it then has the default's 16 frames). */
typedef struct offender {
  uintptr_t pc[QM_STACK_MAX];
  unsigned n;
} offender_t;

static unsigned call_frames(void) {
  unsigned f = (unsigned)qm__opt.stack_frames;
  return f ? f : 16;
}

void qm__report_call_stack(const char *heading, const uintptr_t *pc, unsigned n) {
  qm_buf_t b;
  b.n = 0;
  qm_buf_str(&b, "  ");
  qm_buf_str(&b, heading);
  qm_buf_str(&b, " by thread ");
  qm_buf_dec(&b, qm__thread_id());
  qm_buf_str(&b, " here:\n");
  qm__out(&b);
  qm__stack_print(pc, n < call_frames() ? n : call_frames());
}

void qm__report_kept(const qm_kept_t *k) {
  qm_buf_t l;
  l.n = 0;
  if (k->freed) {
    qm_buf_str(&l, "  freed by thread ");
    qm_buf_dec(&l, k->free_tid);
    qm_buf_str(&l, ", ");
    qm_buf_dec(&l, k->frees_ago);
    qm_buf_str(&l, " large frees and ");
    qm_buf_dec(&l, k->ms_ago);
    qm_buf_str(&l, " ms ago, here:\n");
    qm__out(&l);
    qm__stack_print(k->free_pc, k->nfree);
    qm_buf_str(&l, "  previously allocated by thread ");
  } else {
    qm_buf_str(&l, "  allocated by thread ");
  }
  qm_buf_dec(&l, k->alloc_tid);
  qm_buf_str(&l, " here:\n");
  qm__out(&l);
  qm__stack_print(k->alloc_pc, k->nalloc);
}

static __attribute__((noinline)) void offending_call(offender_t *o) {
  o->n = qm__stack_capture(o->pc, QM_STACK_MAX);
  qm__report_call_stack("detected in a call", o->pc, o->n);
}

static _Noreturn void die(void) { abort(); }

/* Every fatal report: its first line, the offending call's stack, the
 * chunk's kept stacks, the SUMMARY line; then abort. A second fatal error
 * while reporting aborts at once. */
static _Noreturn void fatal(const head_t *h) {
  if (atomic_exchange(&reporting, 1))
    die();
  emit_head(h);
  if (h->freed_at) { /* where the program last held the chunk, first */
    qm_buf_t l;
    l.n = 0;
    qm_buf_str(&l, "  freed by thread ");
    qm_buf_dec(&l, qm__thread_id());
    qm_buf_str(&l, " here (the caller of free), the damage found later:\n");
    qm__out(&l);
    qm__stack_print(&h->freed_at, 1);
  }
  offender_t o;
  offending_call(&o);
  if (h->kept)
    qm__report_kept(h->kept);
  emit_summary(h, o.pc, o.n);
  die();
}

/* ---- the catalogue ---- */

const char *qm__access_name(qm_access_t k) {
  switch (k) {
  case QM_ACC_UAF:
    return "use-after-free";
  case QM_ACC_OVERFLOW:
    return "heap overflow";
  case QM_ACC_UNDERFLOW:
    return "heap underflow";
  case QM_ACC_GUARD:
    return "heap overflow or underflow";
  case QM_ACC_WILD:
    return "wild access";
  case QM_ACC_LIVE:
    break;
  }
  return "access";
}

static const char *op_name(qm_op_t op) {
  switch (op) {
  case QM_OP_FREE:
    return "invalid free";
  case QM_OP_REALLOC:
    return "realloc";
  case QM_OP_USABLE_SIZE:
    break;
  }
  return "malloc_usable_size";
}

static const char *chunk_name(qm_chunk_kind_t k) {
  switch (k) {
  case QM_CK_SMALL:
    return "small";
  case QM_CK_SAMPLED:
    return "sampled small";
  case QM_CK_LARGE:
    return "large";
  case QM_CK_ZERO:
    return "zero-size";
  case QM_CK_BOOT:
    break;
  }
  return "start-up";
}

/* "<kind> chunk, N bytes" (no size for a zero-size chunk) */
static void put_chunk(qm_buf_t *d, qm_chunk_kind_t kind, size_t size) {
  qm_buf_str(d, chunk_name(kind));
  qm_buf_str(d, " chunk");
  if (kind != QM_CK_ZERO) {
    qm_buf_str(d, ", ");
    qm_buf_dec(d, size);
    qm_buf_str(d, " bytes");
  }
}

static _Noreturn void op_report(qm_op_t op, const void *p, const qm_buf_t *d,
                                const qm_kept_t *kept) {
  head_t h = {.kind = {op_name(op)}, .join = " of", .ptr = p, .details = d, .kept = kept};
  fatal(&h);
}

static _Noreturn void double_free(const void *p, const qm_buf_t *d, const qm_kept_t *kept) {
  head_t h = {.kind = {"double free"}, .join = " of", .ptr = p, .details = d, .kept = kept};
  fatal(&h);
}

/* A freed chunk's user pointer passed to op: "double free of" for free,
 * "<op> of ... already freed" otherwise. */
static _Noreturn void freed(qm_op_t op, const void *p, qm_chunk_kind_t kind, size_t size,
                            const qm_kept_t *kept) {
  qm_buf_t d;
  d.n = 0;
  put_chunk(&d, kind, size);
  if (op == QM_OP_FREE)
    double_free(p, &d, kept);
  qm_buf_str(&d, ", already freed");
  op_report(op, p, &d, kept);
}

_Noreturn void qm__report_pointer(qm_op_t op, const void *p, const qm_place_t *pl,
                                  const qm_kept_t *kept) {
  qm_buf_t d;
  d.n = 0;
  if (!pl) {
    qm_buf_str(&d, "not allocated by qmalloc");
    op_report(op, p, &d, NULL);
  }
  /* a freed chunk's user pointer: a chunk being unmapped has left the
   * large table already, and freeing its user pointer again is still a
   * double free */
  if (pl->chunk && pl->access == QM_ACC_UAF && pl->user == (uintptr_t)p)
    freed(op, p, pl->kind, pl->size, kept);
  /* no chunk there: not qmalloc's to free, unless a chunk was once (a
   * large one whose record is no longer kept) */
  if (!pl->chunk && pl->access != QM_ACC_UAF)
    qm_buf_str(&d, "not allocated by qmalloc: ");
  qm_buf_mem(&d, pl->words.s, pl->words.n);
  op_report(op, p, &d, kept);
}

_Noreturn void qm__report_refree(const void *p, size_t size, qm_refree_t how) {
  qm_buf_t d;
  d.n = 0;
  if (how == QM_REFREE_HANDLER) {
    qm_buf_str(&d, "freed again from a signal handler during its free");
  } else if (how == QM_REFREE_HANDLER_REALLOC) {
    qm_buf_str(&d, "freed from a signal handler during its realloc");
  } else {
    put_chunk(&d, QM_CK_SMALL, size);
    qm_buf_str(&d, ", freed twice on two threads");
  }
  double_free(p, &d, NULL);
}

_Noreturn void qm__report_small_overflow(const void *p, qm_chunk_kind_t kind, size_t size,
                                         size_t at, int side, uintptr_t by, uintptr_t freed_ret) {
  qm_buf_t d;
  d.n = 0;
  if (kind == QM_CK_SAMPLED) {
    put_chunk(&d, kind, size);
    qm_buf_str(&d, ", ");
  } else {
    qm_buf_dec(&d, size);
    qm_buf_str(&d, " bytes, ");
  }
  qm_buf_str(&d, "written past the end at offset ");
  qm_buf_dec(&d, at);
  if (side) {
    qm_buf_str(&d, ", found at the free of its ");
    qm_buf_str(&d, side < 0 ? "previous" : "next");
    qm_buf_str(&d, " neighbour ");
    qm_buf_hex(&d, by);
  }
  /* the call (the instruction before its return address) */
  head_t h = {.kind = {"heap overflow past small chunk"},
              .ptr = p,
              .details = &d,
              .freed_at = freed_ret ? freed_ret - 1 : 0};
  fatal(&h);
}

_Noreturn void qm__report_write_after_free(uintptr_t ch, size_t class_bytes, size_t at,
                                           unsigned byte) {
  qm_buf_t d;
  d.n = 0;
  qm_buf_str(&d, "class ");
  qm_buf_dec(&d, class_bytes);
  qm_buf_str(&d, " bytes, byte at offset ");
  qm_buf_dec(&d, at);
  qm_buf_str(&d, " is ");
  qm_buf_hex(&d, byte);
  qm_buf_str(&d, ", written while the chunk was free");
  head_t h = {.kind = {"write after free of small chunk"}, .ptr = (const void *)ch, .details = &d};
  fatal(&h);
}

_Noreturn void qm__report_size_mismatch(const char *call, const void *ptr, bool sized,
                                        size_t passed, bool aligned, size_t align,
                                        qm_chunk_kind_t kind, size_t held, size_t held_align,
                                        const qm_kept_t *kept) {
  qm_buf_t d;
  d.n = 0;
  qm_buf_str(&d, "passed ");
  if (sized) {
    qm_buf_dec(&d, passed);
    qm_buf_str(&d, aligned ? " bytes, " : " bytes");
  }
  if (aligned) {
    qm_buf_str(&d, "alignment ");
    qm_buf_dec(&d, align);
  }
  qm_buf_str(&d, ", ");
  qm_buf_str(&d, chunk_name(kind));
  qm_buf_str(&d, " chunk holds ");
  qm_buf_dec(&d, held);
  if (aligned) {
    qm_buf_str(&d, " aligned to ");
    qm_buf_dec(&d, held_align);
  }
  head_t h = {
      .kind = {"size mismatch in ", call}, .join = " of", .ptr = ptr, .details = &d, .kept = kept};
  fatal(&h);
}

_Noreturn void qm__report_bad_entry(size_t class_bytes, uintptr_t entry, const char *why) {
  qm_buf_t d;
  d.n = 0;
  qm_buf_str(&d, why);
  qm_buf_str(&d, ", class ");
  qm_buf_dec(&d, class_bytes);
  qm_buf_str(&d, " bytes");
  head_t h = {.kind = {"corrupted free list: entry"}, .ptr = (const void *)entry, .details = &d};
  fatal(&h);
}

_Noreturn void qm__report_send_failed(const void *p) {
  qm_buf_t d;
  d.n = 0;
  qm_buf_str(&d, "no memory for a free sent to the owning thread");
  head_t h = {.kind = {"free"}, .join = " of", .ptr = p, .details = &d};
  fatal(&h);
}

_Noreturn void qm__report_os_failure(const char *call, const void *addr, size_t len, int err) {
  qm_buf_t d;
  d.n = 0;
  qm_buf_str(&d, "length ");
  qm_buf_dec(&d, len);
  qm_buf_str(&d, ", errno ");
  qm_buf_dec(&d, (uint64_t)err);
  head_t h = {.kind = {"unexpected ", call, " failure"}, .join = " at", .ptr = addr, .details = &d};
  fatal(&h);
}

_Noreturn void qm__check_failed(const char *file, int line, const char *what, uint64_t a,
                                uint64_t b) {
  qm_buf_t d;
  d.n = 0;
  qm_buf_str(&d, what);
  qm_buf_str(&d, " at ");
  qm_buf_str(&d, file);
  qm_buf_str(&d, ":");
  qm_buf_dec(&d, (uint64_t)line);
  qm_buf_str(&d, ", operands ");
  qm_buf_dec(&d, a);
  qm_buf_str(&d, " and ");
  qm_buf_dec(&d, b);
  head_t h = {.kind = {"internal check failed"}, .join = ":", .details = &d};
  fatal(&h);
}

/* ---- the SIGSEGV explanation ---- */

void qm__report_fault_line(uintptr_t a, const qm_place_t *pl, const char *rw) {
  if (pl->access == QM_ACC_LIVE) {
    qm_buf_t b;
    b.n = 0;
    qm_buf_str(&b, "qmalloc: SIGSEGV");
    qm_buf_str(&b, rw);
    qm_buf_str(&b, " at ");
    qm_buf_hex(&b, a);
    qm_buf_str(&b, " (");
    qm_buf_mem(&b, pl->words.s, pl->words.n);
    qm_buf_str(&b, "): inside a live chunk, not at a guard of qmalloc's\n");
    qm__out(&b);
    return;
  }
  head_t h = {.kind = {qm__access_name(pl->access)},
              .mode = rw,
              .join = " at",
              .ptr = (const void *)a,
              .details = &pl->words};
  emit_head(&h);
}

void qm__report_fault_summary(const qm_place_t *pl, const uintptr_t *pc, unsigned n) {
  head_t h = {.kind = {qm__access_name(pl->access)}};
  emit_summary(&h, pc, n);
}
