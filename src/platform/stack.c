/* stack.c: stack capture with libgcc's _Unwind_Backtrace, and frames named
 * by module, offset and dynamic symbol. Capture reads only the unwind
 * tables (.eh_frame, found through _dl_find_object: no lock, no malloc);
 * printing, which is cold, may also walk the loader's list of objects.
 */
#include "stack.h"

#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>
#include <sys/auxv.h>
#include <time.h>
#include <unistd.h>
#include <unwind.h>

#include "out.h"

/* Why libgcc's unwinder and not a frame-pointer walk (bench/unwind_cost.c
 * measures both): Debian's libc and most programs are built without frame
 * pointers, so the walk loses every frame past the first function that uses
 * %rbp as a register, and it must read through a chain it cannot validate
 * without the thread's stack bounds (pthread_getattr_np allocates). The
 * unwinder follows the CFI every object carries on x86-64 and arm64, and
 * libgcc 12 on glibc 2.35+ finds it with _dl_find_object, which is lock-free
 * and async-signal-safe; its one lock (objects registered at run time, JITs)
 * is skipped while none is registered. It is linked, not dlopen()ed as
 * glibc's backtrace() does on first use (which allocates). */

/* The executable segment of the shared object qmalloc is built into: its
 * frames are left out of stacks. When qmalloc is linked into the program
 * itself, its code's share of .text and of .text.unlikely, between the
 * markers its link order puts first and last (text_lo.c); a range that
 * does not look like it (inverted, or larger than the library could be: a
 * linker that reordered input) is left empty, and the frames then show. */
extern const ElfW(Ehdr) __ehdr_start __attribute__((visibility("hidden")));
static uintptr_t self_lo, self_hi, cold_lo, cold_hi;

static bool marked(void (*lo)(void), void (*hi)(void), uintptr_t *a, uintptr_t *b) {
  uintptr_t l = (uintptr_t)lo, h = (uintptr_t)hi;
  if (l >= h || h - l > ((uintptr_t)4 << 20))
    return false;
  *a = l;
  *b = h + 1; /* the marker's own first byte: it is qmalloc's too */
  return true;
}

static void self_range(void) {
  const ElfW(Ehdr) *eh = &__ehdr_start;
  const ElfW(Phdr) *ph = (const ElfW(Phdr) *)((const char *)eh + eh->e_phoff);
  if ((uintptr_t)ph == getauxval(AT_PHDR)) { /* the main program */
    if (marked(qm__text_lo, qm__text_hi, &self_lo, &self_hi))
      marked(qm__text_lo_cold, qm__text_hi_cold, &cold_lo, &cold_hi);
    return;
  }
  uintptr_t bias = 0, lo = UINTPTR_MAX, hi = 0;
  for (unsigned i = 0; i < eh->e_phnum; i++)
    if (ph[i].p_type == PT_LOAD && ph[i].p_offset == 0)
      bias = (uintptr_t)eh - ph[i].p_vaddr;
  for (unsigned i = 0; i < eh->e_phnum; i++) {
    if (ph[i].p_type != PT_LOAD || !(ph[i].p_flags & PF_X))
      continue;
    uintptr_t a = bias + ph[i].p_vaddr;
    lo = a < lo ? a : lo;
    hi = a + ph[i].p_memsz > hi ? a + ph[i].p_memsz : hi;
  }
  if (lo < hi) {
    self_lo = lo;
    self_hi = hi;
  }
}

typedef struct walk {
  uintptr_t *pcs;
  unsigned n, max;
  bool first, inside;
} walk_t;

static _Unwind_Reason_Code step(struct _Unwind_Context *c, void *arg) {
  walk_t *w = arg;
  int before = 0;
  uintptr_t pc = _Unwind_GetIPInfo(c, &before);
  if (!pc)
    return _URC_END_OF_STACK;
  if (w->first) { /* qm__stack_capture itself */
    w->first = false;
    return _URC_NO_REASON;
  }
  /* a return address: the call is the instruction before it (a signal
   * frame's pc is the interrupted instruction itself) */
  if (!before)
    pc--;
  if (w->inside && ((pc >= self_lo && pc < self_hi) || (pc >= cold_lo && pc < cold_hi)))
    return _URC_NO_REASON;
  w->inside = false;
  w->pcs[w->n++] = pc;
  return w->n >= w->max ? _URC_END_OF_STACK : _URC_NO_REASON;
}

/* Whether the unwinder may run: set once qmalloc is initialised and, in a
 * statically linked program, once its constructor runs. Static glibc calls
 * malloc from its own start-up (_dl_non_dynamic_init), before the unwind
 * tables are registered (its _dl_find_object knows no .eh_frame), and libgcc
 * aborts when it cannot find its own frame: a stack taken there would kill
 * the process. A dynamic program has its loader's tables from the start. */
static int unwind_ok, ctors_ran, init_ran;

/* No PT_INTERP in the program's headers: nothing loaded it, its libc is
 * linked in (static or static-pie). */
static bool program_is_static(void) {
  const ElfW(Phdr) *ph = (const ElfW(Phdr) *)getauxval(AT_PHDR);
  unsigned long n = getauxval(AT_PHNUM);
  if (!ph)
    return false;
  for (unsigned long i = 0; i < n; i++)
    if (ph[i].p_type == PT_INTERP)
      return false;
  return true;
}

__attribute__((noinline)) unsigned qm__stack_capture(uintptr_t *pcs, unsigned max) {
  if (!max || !__atomic_load_n(&unwind_ok, __ATOMIC_ACQUIRE))
    return 0;
  walk_t w = {
      .pcs = pcs, .max = max > QM_STACK_MAX ? QM_STACK_MAX : max, .first = true, .inside = true};
  _Unwind_Backtrace(step, &w);
  return w.n;
}

/* The fork gate (see stack.h): unwinders counts the threads inside, forking
 * closes the way in. A thread that finds it closed steps out and yields
 * until the fork is done: it holds no lock the forking thread needs. */
static _Atomic unsigned unwinders;
static _Atomic bool forking;

unsigned qm__stack_capture_unlocked(uintptr_t *pcs, unsigned max) {
  if (!max || !__atomic_load_n(&unwind_ok, __ATOMIC_ACQUIRE))
    return 0;
  for (;;) {
    atomic_fetch_add_explicit(&unwinders, 1, memory_order_seq_cst);
    if (!atomic_load_explicit(&forking, memory_order_seq_cst))
      break;
    atomic_fetch_sub_explicit(&unwinders, 1, memory_order_release);
    while (atomic_load_explicit(&forking, memory_order_acquire))
      sched_yield();
  }
  unsigned n = qm__stack_capture(pcs, max);
  atomic_fetch_sub_explicit(&unwinders, 1, memory_order_release);
  return n;
}

void qm__unwind_fork_prepare(void) {
  atomic_store_explicit(&forking, true, memory_order_seq_cst);
  while (atomic_load_explicit(&unwinders, memory_order_seq_cst))
    sched_yield();
}
void qm__unwind_fork_parent(void) { atomic_store_explicit(&forking, false, memory_order_release); }

static void unwind_enable(void) {
  __atomic_store_n(&unwind_ok, 1, __ATOMIC_RELEASE);
  uintptr_t pcs[4];
  qm__stack_capture(pcs, 4);
}

void qm__unwind_init(void) {
  self_range();
  __atomic_store_n(&init_ran, 1, __ATOMIC_RELEASE);
  if (__atomic_load_n(&ctors_ran, __ATOMIC_ACQUIRE) || !program_is_static())
    unwind_enable();
}

/* In a static program the unwinder finds the program's tables once
 * crtbeginT.o's frame_dummy has registered them: a constructor without a
 * priority runs after it (crtbegin is linked first; constructors with a
 * priority run before it, and so would abort). Allocations made earlier
 * keep no stack ("no stack recorded"). */
__attribute__((constructor)) static void unwind_constructor(void) {
  /* Opaque to the compiler: clang 19 evaluated this constructor at compile
   * time (LLVM's global optimizer assumes constructors run before any other
   * code) and folded it away as ctors_ran = 1 from the start, so a static
   * program's first malloc, in libc's start-up, ran the unwinder and
   * libgcc aborted. The evaluator gives up at inline assembly. */
  __asm__ volatile("" ::: "memory");
  __atomic_store_n(&ctors_ran, 1, __ATOMIC_RELEASE);
  if (__atomic_load_n(&init_ran, __ATOMIC_ACQUIRE) &&
      !__atomic_load_n(&unwind_ok, __ATOMIC_ACQUIRE))
    unwind_enable();
}

/* ---- thread ids and the clock ---- */

static unsigned fork_gen;
static __thread struct {
  unsigned gen;
  uint32_t tid;
} me __attribute__((tls_model("initial-exec")));

uint32_t qm__thread_id(void) {
  unsigned g = __atomic_load_n(&fork_gen, __ATOMIC_RELAXED);
  if (!me.tid || me.gen != g) {
    me.tid = (uint32_t)gettid();
    me.gen = g;
  }
  return me.tid;
}

bool qm__unwind_busy(void) { return atomic_load_explicit(&unwinders, memory_order_relaxed) != 0; }
/* a child whose fork interrupted this thread's own call: the gate was left
 * as it stood (that call leaves it); only the cached thread id is stale */
void qm__unwind_fork_child_nested(void) { __atomic_fetch_add(&fork_gen, 1, __ATOMIC_RELAXED); }

/* the forking thread's cached id is its parent's; other threads are gone,
 * and none of them was inside the unwinder (qm__unwind_fork_prepare) */
void qm__unwind_fork_child(void) {
  qm__unwind_fork_child_nested();
  atomic_store_explicit(&unwinders, 0, memory_order_relaxed);
  atomic_store_explicit(&forking, false, memory_order_release);
}

uint64_t qm__clock_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* ---- naming frames ---- */

typedef struct module {
  const char *name;
  uintptr_t base; /* load bias: pc - base is the address in the ELF file */
  const ElfW(Dyn) * dyn;
} module_t;

#if defined(DLFO_STRUCT_HAS_EH_DBASE)
/* weak: on a glibc older than 2.35 the loader's list is walked instead */
#pragma weak _dl_find_object
#define HAVE_DL_FIND_OBJECT 1
#endif

typedef struct search {
  uintptr_t pc;
  module_t *m;
  bool found;
} search_t;

static int on_object(struct dl_phdr_info *info, size_t size, void *arg) {
  (void)size;
  search_t *s = arg;
  for (unsigned i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    uintptr_t a = info->dlpi_addr + ph->p_vaddr;
    if (ph->p_type != PT_LOAD || s->pc < a || s->pc - a >= ph->p_memsz)
      continue;
    s->m->name = info->dlpi_name;
    s->m->base = info->dlpi_addr;
    s->m->dyn = NULL;
    for (unsigned j = 0; j < info->dlpi_phnum; j++)
      if (info->dlpi_phdr[j].p_type == PT_DYNAMIC)
        s->m->dyn = (const ElfW(Dyn) *)(info->dlpi_addr + info->dlpi_phdr[j].p_vaddr);
    s->found = true;
    return 1;
  }
  return 0;
}

static bool find_module(uintptr_t pc, module_t *m) {
#ifdef HAVE_DL_FIND_OBJECT
  if (_dl_find_object) {
    struct dl_find_object fo;
    if (_dl_find_object((void *)pc, &fo) == 0 && fo.dlfo_link_map) {
      m->name = fo.dlfo_link_map->l_name;
      m->base = fo.dlfo_link_map->l_addr;
      m->dyn = fo.dlfo_link_map->l_ld;
      return true;
    }
  }
#endif
  search_t s = {.pc = pc, .m = m, .found = false};
  dl_iterate_phdr(on_object, &s);
  return s.found;
}

/* The loader relocates d_ptr in place on most targets, not on all. */
static uintptr_t dyn_ptr(const module_t *m, uintptr_t p) { return p < m->base ? p + m->base : p; }

/* Symbols in DT_GNU_HASH: one past the highest index its chains reach. */
static size_t gnu_hash_count(const uint32_t *h) {
  uint32_t nbuckets = h[0], symoffset = h[1], bloom = h[2];
  const uint32_t *buckets = h + 4 + bloom * (sizeof(ElfW(Addr)) / 4);
  const uint32_t *chain = buckets + nbuckets;
  uint32_t last = 0;
  for (uint32_t b = 0; b < nbuckets; b++)
    last = buckets[b] > last ? buckets[b] : last;
  if (last < symoffset)
    return symoffset;
  while (!(chain[last - symoffset] & 1))
    last++;
  return (size_t)last + 1;
}

/* The exported function holding pc (what dladdr would say, without its
 * lock): NULL when the module exports none there. */
static const char *dyn_symbol(const module_t *m, uintptr_t pc, uintptr_t *start) {
  if (!m->dyn)
    return NULL;
  const ElfW(Sym) *tab = NULL;
  const char *str = NULL;
  size_t strsz = 0, count = 0;
  for (const ElfW(Dyn) *d = m->dyn; d->d_tag != DT_NULL; d++) {
    if (d->d_tag == DT_SYMTAB)
      tab = (const ElfW(Sym) *)dyn_ptr(m, d->d_un.d_ptr);
    else if (d->d_tag == DT_STRTAB)
      str = (const char *)dyn_ptr(m, d->d_un.d_ptr);
    else if (d->d_tag == DT_STRSZ)
      strsz = d->d_un.d_val;
    else if (d->d_tag == DT_HASH)
      count = ((const uint32_t *)dyn_ptr(m, d->d_un.d_ptr))[1];
    else if (d->d_tag == DT_GNU_HASH && !count)
      count = gnu_hash_count((const uint32_t *)dyn_ptr(m, d->d_un.d_ptr));
  }
  if (!tab || !str)
    return NULL;
  const ElfW(Sym) *best = NULL;
  for (size_t i = 1; i < count; i++) {
    const ElfW(Sym) *s = &tab[i];
    unsigned type = ELF64_ST_TYPE(s->st_info);
    if ((type != STT_FUNC && type != STT_GNU_IFUNC) || s->st_shndx == SHN_UNDEF || !s->st_value ||
        s->st_name >= strsz)
      continue;
    uintptr_t a = m->base + s->st_value;
    if (pc >= a && pc - a < (s->st_size ? s->st_size : 1)) {
      best = s;
      break;
    }
  }
  if (!best)
    return NULL;
  *start = m->base + best->st_value;
  return str + best->st_name;
}

static char exe[512];

void qm__frame_where(qm_buf_t *b, uintptr_t pc) {
  module_t m;
  if (!find_module(pc, &m))
    return;
  const char *name = m.name;
  if (!name || !*name) { /* the main program */
    if (!exe[0]) {
      ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
      exe[k > 0 ? k : 0] = 0;
    }
    name = exe[0] ? exe : "<main>";
  }
  qm_buf_str(b, "(");
  qm_buf_str(b, name);
  qm_buf_str(b, "+");
  qm_buf_hex(b, pc - m.base);
  qm_buf_str(b, ")");
  uintptr_t start = 0;
  const char *sym = dyn_symbol(&m, pc, &start);
  if (sym) {
    qm_buf_str(b, " ");
    qm_buf_str(b, sym);
    qm_buf_str(b, "+");
    qm_buf_hex(b, pc - start);
  }
}

/* libc's and the loader's file names (glibc: libc.so.6, libpthread.so.0,
 * libdl.so.2, ld-linux-x86-64.so.2, ld-linux-aarch64.so.1) */
static bool is_libc(const char *path) {
  const char *base = path;
  for (const char *s = path; *s; s++)
    if (*s == '/')
      base = s + 1;
  static const char *const names[] = {"libc.so",  "libpthread.so", "libdl.so",
                                      "ld-linux", "ld.so",         "ld64.so"};
  for (unsigned i = 0; i < sizeof names / sizeof *names; i++)
    if (!strncmp(base, names[i], strlen(names[i])))
      return true;
  return false;
}

unsigned qm__frame_first_own(const uintptr_t *pc, unsigned n) {
  for (unsigned k = 0; k < n; k++) {
    module_t m;
    if (find_module(pc[k], &m) && m.name && *m.name && is_libc(m.name))
      continue;
    return k;
  }
  return 0;
}

void qm__frame_format(qm_buf_t *b, unsigned n, uintptr_t pc) {
  qm_buf_str(b, "#");
  qm_buf_dec(b, n);
  qm_buf_str(b, " ");
  qm_buf_hex(b, pc);
  size_t mark = b->n;
  qm_buf_str(b, " ");
  size_t at = b->n;
  qm__frame_where(b, pc);
  if (b->n == at)
    b->n = mark;
}

void qm__stack_print(const uintptr_t *pc, unsigned n) {
  qm_buf_t b;
  if (!n) {
    b.n = 0;
    qm_buf_str(&b, "    (no stack recorded)\n");
    qm__out(&b);
  }
  for (unsigned k = 0; k < n; k++) {
    b.n = 0;
    qm_buf_str(&b, "    ");
    qm__frame_format(&b, k, pc[k]);
    qm_buf_str(&b, "\n");
    qm__out(&b);
  }
}
