/* optparse.c: the option table built from options.def, and the parser of
 * QMALLOC_OPTIONS ("name=value:name=value"). Reads environ itself (getenv is
 * not safe during preload) and falls back to /proc/self/environ when libc has
 * not set environ yet. Never allocates; a bad entry warns and changes nothing.
 * In secure execution (AT_SECURE: set-user-ID, set-group-ID, file
 * capabilities) the environment is not read: its user is not the program's.
 * Text from outside is printed escaped (qm_buf_escaped), never raw.
 */
#include "optparse.h"

#include <stddef.h>
#include <string.h>
#include <sys/auxv.h>
#include <unistd.h>

#include "fmt.h"
#include "os.h"
#include "out.h"

enum { KIND_BOOL, KIND_UINT, KIND_ENUM, KIND_STR };
#define KIND_OF_BOOL KIND_BOOL
#define KIND_OF_UINT KIND_UINT
#define KIND_OF_ENUM KIND_ENUM
#define KIND_OF_STR KIND_STR
#define STR_OFFSET_BOOL(name) 0
#define STR_OFFSET_UINT(name) 0
#define STR_OFFSET_ENUM(name) 0
#define STR_OFFSET_STR(name) offsetof(qm_option_strings_t, name)

typedef struct opt_desc {
  const char *name;
  int kind;
  uint64_t def, min, max;
  const char *choices;
  const char *doc;
  size_t offset, str_offset;
} opt_desc_t;

static const opt_desc_t table[] = {
#define QM_OPT(name, kind, def, min, max, choices, doc)                                            \
  {#name,                                                                                          \
   KIND_OF_##kind,                                                                                 \
   def,                                                                                            \
   min,                                                                                            \
   max,                                                                                            \
   choices,                                                                                        \
   doc,                                                                                            \
   offsetof(qm_options_t, name),                                                                   \
   STR_OFFSET_##kind(name)},
#include "options.def"
#undef QM_OPT
};
#define NOPTS (sizeof(table) / sizeof(table[0]))

static uint64_t *slot(qm_options_t *o, const opt_desc_t *d) {
  return (uint64_t *)((char *)o + d->offset);
}
/* The bytes of a STR option; only the live options have them (a parse into
 * another qm_options_t, the fuzzer's, keeps just the length in the slot). */
static char *str_slot(const qm_options_t *o, const opt_desc_t *d) {
  return o == &qm__opt ? (char *)&qm__opt_str + d->str_offset : NULL;
}

void qm__options_reset(void) {
  for (size_t i = 0; i < NOPTS; i++) {
    *slot(&qm__opt, &table[i]) = table[i].def;
    if (table[i].kind == KIND_STR)
      str_slot(&qm__opt, &table[i])[0] = 0;
  }
}

/* Appends choice number idx of "a|b|c" to b. */
static void put_choice(qm_buf_t *b, const char *choices, uint64_t idx) {
  for (const char *s = choices; *s; idx--) {
    const char *e = strchr(s, '|');
    size_t len = e ? (size_t)(e - s) : strlen(s);
    if (!idx) {
      qm_buf_mem(b, s, len);
      return;
    }
    if (!e)
      return;
    s = e + 1;
  }
}

static void put_n(qm_buf_t *b, const char *s, size_t n) {
  qm_buf_escaped(b, s, n < 80 ? n : 80);
  if (n > 80)
    qm_buf_str(b, "...");
}

static void put_value(qm_buf_t *b, const qm_options_t *o, const opt_desc_t *d, uint64_t v) {
  if (d->kind == KIND_ENUM)
    put_choice(b, d->choices, v);
  else if (d->kind == KIND_STR && str_slot(o, d))
    qm_buf_escaped(b, str_slot(o, d), strlen(str_slot(o, d)));
  else
    qm_buf_dec(b, v);
}

static bool eq(const char *s, size_t n, const char *lit) {
  return strlen(lit) == n && !memcmp(s, lit, n);
}

/* Parses one value; false if it is not of the option's kind and range. */
static bool parse_value(const opt_desc_t *d, const char *s, size_t n, uint64_t *out) {
  if (d->kind == KIND_BOOL) {
    if (eq(s, n, "1") || eq(s, n, "true") || eq(s, n, "yes"))
      return *out = 1, true;
    if (eq(s, n, "0") || eq(s, n, "false") || eq(s, n, "no"))
      return *out = 0, true;
    return false;
  }
  if (d->kind == KIND_ENUM) {
    uint64_t idx = 0;
    for (const char *c = d->choices; *c; idx++) {
      const char *e = strchr(c, '|');
      size_t len = e ? (size_t)(e - c) : strlen(c);
      if (len == n && !memcmp(c, s, n))
        return *out = idx, true;
      if (!e)
        break;
      c = e + 1;
    }
    return false;
  }
  if (d->kind == KIND_STR)
    return n <= d->max ? (*out = n, true) : false;
  if (!n || n > 19)
    return false;
  uint64_t v = 0;
  for (size_t i = 0; i < n; i++) {
    if (s[i] < '0' || s[i] > '9')
      return false;
    v = v * 10 + (uint64_t)(s[i] - '0');
  }
  if (v < d->min || v > d->max)
    return false;
  return *out = v, true;
}

static void warn_prefix(qm_buf_t *b, const char *source) {
  b->n = 0;
  qm_buf_str(b, source ? source : "-");
  qm_buf_str(b, ": ");
}

/* A NULL source formats the warning and prints nothing (the fuzzer). */
static void warn(const char *source, qm_buf_t *b) {
  if (source)
    qm__warn_buf(b);
}

/* Edit distance (insertions, deletions, substitutions, swaps of two
 * neighbours) between s[0..n) and name, or 3 once it is past 2: only a
 * near miss is worth a suggestion. On the stack, no allocation. */
#define NEAR_MAX 48
static unsigned edits(const char *s, size_t n, const char *name) {
  size_t m = strlen(name);
  if (n >= NEAR_MAX || m >= NEAR_MAX || (n > m ? n - m : m - n) > 2)
    return 3;
  unsigned d[3][NEAR_MAX + 1]; /* rows i-2, i-1, i of the table, rolled */
  for (size_t j = 0; j <= m; j++)
    d[0][j] = (unsigned)j;
  for (size_t i = 1; i <= n; i++) {
    unsigned *cur = d[i % 3], *prev = d[(i + 2) % 3], *pp = d[(i + 1) % 3];
    cur[0] = (unsigned)i;
    for (size_t j = 1; j <= m; j++) {
      unsigned c = prev[j - 1] + (s[i - 1] != name[j - 1]);
      if (prev[j] + 1 < c)
        c = prev[j] + 1;
      if (cur[j - 1] + 1 < c)
        c = cur[j - 1] + 1;
      if (i > 1 && j > 1 && s[i - 1] == name[j - 2] && s[i - 2] == name[j - 1] && pp[j - 2] + 1 < c)
        c = pp[j - 2] + 1;
      cur[j] = c;
    }
  }
  unsigned r = d[n % 3][m];
  return r > 2 ? 3 : r;
}

/* The known option nearest to an unknown name, if one is one or two edits
 * away (the first of the nearest, in the table's order), else NULL. */
static const char *near_name(const char *s, size_t n);

static int apply_one(qm_options_t *o, const char *source, const char *s, size_t n) {
  qm_buf_t b;
  const char *eqs = memchr(s, '=', n);
  if (!eqs) {
    warn_prefix(&b, source);
    qm_buf_str(&b, "'");
    put_n(&b, s, n);
    qm_buf_str(&b, "' is not name=value; ignored");
    warn(source, &b);
    return 1;
  }
  size_t nlen = (size_t)(eqs - s);
  const char *val = eqs + 1;
  size_t vlen = n - nlen - 1;
  for (size_t i = 0; i < NOPTS; i++) {
    const opt_desc_t *d = &table[i];
    if (!eq(s, nlen, d->name))
      continue;
    uint64_t v;
    if (parse_value(d, val, vlen, &v)) {
      *slot(o, d) = v;
      if (d->kind == KIND_STR && str_slot(o, d)) {
        memcpy(str_slot(o, d), val, vlen);
        str_slot(o, d)[vlen] = 0;
      }
      return 0;
    }
    warn_prefix(&b, source);
    qm_buf_str(&b, "option '");
    qm_buf_str(&b, d->name);
    if (d->kind == KIND_BOOL) {
      qm_buf_str(&b, "' takes 0 or 1");
    } else if (d->kind == KIND_ENUM) {
      qm_buf_str(&b, "' takes one of ");
      qm_buf_str(&b, d->choices);
    } else if (d->kind == KIND_STR) {
      qm_buf_str(&b, "' takes at most ");
      qm_buf_dec(&b, d->max);
      qm_buf_str(&b, " bytes");
    } else {
      qm_buf_str(&b, "' takes an integer in [");
      qm_buf_dec(&b, d->min);
      qm_buf_str(&b, ", ");
      qm_buf_dec(&b, d->max);
      qm_buf_str(&b, "]");
    }
    qm_buf_str(&b, ", not '");
    put_n(&b, val, vlen);
    qm_buf_str(&b, "'; keeping ");
    put_value(&b, o, d, *slot(o, d));
    warn(source, &b);
    return 1;
  }
  warn_prefix(&b, source);
  qm_buf_str(&b, "unknown option '");
  put_n(&b, s, nlen);
  qm_buf_str(&b, "' ignored");
  const char *near = near_name(s, nlen);
  if (near) {
    qm_buf_str(&b, "; did you mean '");
    qm_buf_str(&b, near);
    qm_buf_str(&b, "'?");
  }
  warn(source, &b);
  return 1;
}

static const char *near_name(const char *s, size_t n) {
  const char *best = NULL;
  unsigned bd = 3;
  for (size_t i = 0; i < NOPTS; i++) {
    unsigned e = edits(s, n, table[i].name);
    if (e < bd)
      bd = e, best = table[i].name;
  }
  return best;
}

int qm__options_parse(qm_options_t *o, const char *source, const char *s, size_t n) {
  int warnings = 0;
  size_t i = 0;
  while (i < n && s[i]) {
    size_t e = i;
    while (e < n && s[e] && s[e] != ':')
      e++;
    if (e != i)
      warnings += apply_one(o, source, s + i, e - i);
    i = e < n && s[e] == ':' ? e + 1 : e;
  }
  return warnings;
}

int qm__options_apply(const char *source, const char *s) {
  return s ? qm__options_parse(&qm__opt, source, s, strlen(s)) : 0;
}

#define ENV_NAME "QMALLOC_OPTIONS="
#define ENV_LEN (sizeof(ENV_NAME) - 1)

/* Before libc's own start-up has run, environ can still be NULL: read the
 * variable from /proc/self/environ instead, in one pass with no allocation. */
static const char *env_from_proc(char *out, size_t cap) {
  char buf[8192];
  long n = qm_os_read_file("/proc/self/environ", buf, sizeof buf);
  for (long i = 0; i < n;) {
    long end = i;
    while (end < n && buf[end])
      end++;
    if ((size_t)(end - i) >= ENV_LEN && !memcmp(buf + i, ENV_NAME, ENV_LEN)) {
      size_t len = (size_t)(end - i) - ENV_LEN;
      if (len >= cap)
        len = cap - 1;
      memcpy(out, buf + i + ENV_LEN, len);
      out[len] = 0;
      return out;
    }
    i = end + 1;
  }
  return NULL;
}

extern char **environ;

__attribute__((weak)) const char *qmalloc_default_options(void);

void qm__options_init(void) {
  static char procbuf[4096]; /* bytes of the file, not a page */
  qm__options_reset();
  if (qmalloc_default_options)
    qm__options_apply("qmalloc_default_options()", qmalloc_default_options());
  const char *env = NULL;
  if (environ) {
    for (char **e = environ; *e; e++)
      if (!strncmp(*e, ENV_NAME, ENV_LEN)) {
        env = *e + ENV_LEN;
        break;
      }
  } else {
    env = env_from_proc(procbuf, sizeof procbuf);
  }
  /* As glibc does with its MALLOC_ variables: in a set-user-ID program the
   * variable is its caller's, who could turn every check off or point
   * log_path at a file only the program's owner may write. The kernel's
   * AT_SECURE is in the auxiliary vector from the first instruction on. */
  if (env && *env && getauxval(AT_SECURE)) {
    qm_buf_t b;
    b.n = 0;
    qm_buf_str(&b, "QMALLOC_OPTIONS ignored: secure execution (set-user-ID, set-group-ID or "
                   "file capabilities)");
    qm__warn_buf(&b);
    env = NULL;
  }
  qm__options_apply("QMALLOC_OPTIONS", env);
  qm__options_profile(&qm__opt);
  qm__options_settle(&qm__opt);
}

void qm__options_settle(qm_options_t *o) {
  /* a power of two, at least 256 KiB: the largest class's chunk then fits
   * between two guards (primary.c) */
  if (o->guard_interval_kb) {
    uint64_t p2 = 256;
    while (p2 < o->guard_interval_kb)
      p2 <<= 1;
    o->guard_interval_kb = p2;
  }
  /* a power of two: its highest bit (guarded.c) */
  if (o->guard_align)
    o->guard_align = (uint64_t)1 << (63 - __builtin_clzll(o->guard_align));
}

void qm__options_profile(qm_options_t *o) {
  if (o->hardening == QM_HARDENING_MAX) {
    o->zero_on_free = 1;
    if (o->free_delay < 256)
      o->free_delay = 256;
    if (!o->guard_interval_kb || o->guard_interval_kb > 256)
      o->guard_interval_kb = 256;
  }
}

/* "0 or 1", "auto|fast|slow", "4..128", "up to 200 bytes" */
static void put_range(qm_buf_t *b, const opt_desc_t *d) {
  if (d->kind == KIND_BOOL) {
    qm_buf_str(b, "0 or 1");
  } else if (d->kind == KIND_ENUM) {
    qm_buf_str(b, d->choices);
  } else if (d->kind == KIND_STR) {
    qm_buf_str(b, "up to ");
    qm_buf_dec(b, d->max);
    qm_buf_str(b, " bytes");
  } else {
    qm_buf_dec(b, d->min);
    qm_buf_str(b, "..");
    qm_buf_dec(b, d->max);
  }
}

void qm__options_help(void) {
  qm_buf_t b;
  b.n = 0;
  qm_buf_str(&b, "qmalloc: QMALLOC_OPTIONS=\"name=value:name=value\"; every option, with "
                 "the value in force, its range and default:\n");
  qm_buf_flush(&b, STDERR_FILENO); /* not into log_path */
  for (size_t i = 0; i < NOPTS; i++) {
    const opt_desc_t *d = &table[i];
    b.n = 0;
    qm_buf_str(&b, "  ");
    qm_buf_str(&b, d->name);
    qm_buf_str(&b, "=");
    put_value(&b, &qm__opt, d, *slot(&qm__opt, d));
    qm_buf_str(&b, "\n      ");
    put_range(&b, d);
    qm_buf_str(&b, ", default ");
    if (d->kind == KIND_STR)
      qm_buf_str(&b, "empty");
    else
      put_value(&b, &qm__opt, d, d->def);
    qm_buf_str(&b, ": ");
    qm_buf_str(&b, d->doc);
    qm_buf_str(&b, "\n");
    qm_buf_flush(&b, STDERR_FILENO); /* not into log_path */
  }
}

void qm__options_print(void) {
  qm_buf_t b;
  for (size_t i = 0; i < NOPTS; i++) {
    const opt_desc_t *d = &table[i];
    b.n = 0;
    qm_buf_str(&b, "qmalloc: option ");
    size_t mark = b.n;
    qm_buf_str(&b, d->name);
    qm_buf_str(&b, "=");
    put_value(&b, &qm__opt, d, *slot(&qm__opt, d));
    while (b.n - mark < 34)
      qm_buf_str(&b, " ");
    qm_buf_str(&b, " ");
    qm_buf_str(&b, d->doc);
    qm_buf_str(&b, "\n");
    qm__out(&b);
  }
}
