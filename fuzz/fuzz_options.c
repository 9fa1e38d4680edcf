/* fuzz_options.c: libFuzzer harness of the QMALLOC_OPTIONS parser
 * (qm__options_parse over the raw input, no NUL after it, so ASan sees any
 * read past the end). Every option must stay within its options.def range,
 * the parser must write only the struct it is given, and the result must
 * match a plain reference parser written here from the README's rules,
 * hardening profile included. The options come from options.def, so a new
 * option is fuzzed (and in the dictionary) as soon as it is added. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "optparse.h"
#include "seal.h"

enum { K_BOOL, K_UINT, K_ENUM, K_STR };

typedef struct ref_opt {
  const char *name;
  int kind;
  uint64_t min, max;
  const char *choices;
  size_t off;
} ref_opt_t;

static const ref_opt_t ref[] = {
#define QM_OPT(name, kind, def, min, max, choices, doc)                                            \
  {#name, K_##kind, min, max, choices, offsetof(qm_options_t, name)},
#include "options.def"
#undef QM_OPT
};
#define NREF (sizeof(ref) / sizeof(ref[0]))

static uint64_t *field(qm_options_t *o, size_t i) { return (uint64_t *)((char *)o + ref[i].off); }

static int same(const char *s, size_t n, const char *lit) {
  return strlen(lit) == n && memcmp(s, lit, n) == 0;
}

/* The value of one entry by the README's rules; 0 if it is rejected. */
static int ref_value(const ref_opt_t *d, const char *v, size_t n, uint64_t *out) {
  if (d->kind == K_BOOL) {
    if (same(v, n, "1") || same(v, n, "true") || same(v, n, "yes"))
      return *out = 1, 1;
    if (same(v, n, "0") || same(v, n, "false") || same(v, n, "no"))
      return *out = 0, 1;
    return 0;
  }
  if (d->kind == K_ENUM) {
    /* choices are "a|b|c"; the value is the index of the one named */
    uint64_t idx = 0;
    size_t start = 0, len = strlen(d->choices);
    for (size_t i = 0; i <= len; i++) {
      if (i < len && d->choices[i] != '|')
        continue;
      if (i - start == n && memcmp(d->choices + start, v, n) == 0)
        return *out = idx, 1;
      idx++;
      start = i + 1;
    }
    return 0;
  }
  /* a string (log_path) of at most max bytes; a parse into any struct but
   * the live options keeps only its length */
  if (d->kind == K_STR)
    return n <= d->max ? (*out = n, 1) : 0;
  /* decimal digits only, at most 19 (no overflow of 64 bits), in range */
  if (n == 0 || n > 19)
    return 0;
  uint64_t x = 0;
  for (size_t i = 0; i < n; i++) {
    if (v[i] < '0' || v[i] > '9')
      return 0;
    x = x * 10 + (uint64_t)(v[i] - '0');
  }
  if (x < d->min || x > d->max)
    return 0;
  return *out = x, 1;
}

/* Entries are split at ':' and the input ends at n or at a NUL; an empty
 * entry is skipped; anything rejected warns once and changes nothing. */
static int ref_parse(qm_options_t *o, const uint8_t *data, size_t n) {
  const char *s = (const char *)data;
  size_t len = 0;
  while (len < n && s[len])
    len++;
  int warnings = 0;
  size_t start = 0;
  for (size_t i = 0; i <= len; i++) {
    if (i < len && s[i] != ':')
      continue;
    const char *e = s + start;
    size_t elen = i - start;
    start = i + 1;
    if (!elen)
      continue;
    const char *eq = memchr(e, '=', elen);
    size_t nlen = eq ? (size_t)(eq - e) : 0;
    size_t k = NREF;
    for (size_t j = 0; eq && j < NREF; j++)
      if (same(e, nlen, ref[j].name))
        k = j;
    uint64_t v;
    if (k < NREF && ref_value(&ref[k], eq + 1, elen - nlen - 1, &v))
      *field(o, k) = v;
    else
      warnings++;
  }
  return warnings;
}

/* The README's profiles: hardening=max turns on every check the default
 * leaves off. */
/* hardening=max as the README and options.def say: zero_on_free,
 * free_delay of at least 256, guard_interval_kb of at most 256 (none, 0,
 * becomes 256 too) */
static void ref_profile(qm_options_t *o) {
  if (o->hardening != QM_HARDENING_MAX)
    return;
  o->zero_on_free = 1;
  if (o->free_delay < 256)
    o->free_delay = 256;
  if (o->guard_interval_kb == 0 || o->guard_interval_kb > 256)
    o->guard_interval_kb = 256;
}

static void fail(const char *what, size_t i, uint64_t got, uint64_t want) {
  fprintf(stderr, "fuzz-options: %s: option %s = %llu, expected %llu\n", what,
          i < NREF ? ref[i].name : "-", (unsigned long long)got, (unsigned long long)want);
  abort();
}

static void check_ranges(qm_options_t *o, const char *when) {
  for (size_t i = 0; i < NREF; i++) {
    uint64_t v = *field(o, i);
    if (v < ref[i].min || v > ref[i].max) {
      fprintf(stderr, "fuzz-options: %s: option %s = %llu outside [%llu, %llu]\n", when,
              ref[i].name, (unsigned long long)v, (unsigned long long)ref[i].min,
              (unsigned long long)ref[i].max);
      abort();
    }
  }
}

static qm_options_t defaults;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  /* init (a constructor) has sealed the options read-only already */
  qm__ro_unseal();
  qm__options_reset();
  qm__ro_seal();
  defaults = qm__opt;
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  qm_options_t global = qm__opt;
  qm_option_strings_t global_str = qm__opt_str;
  /* twice: from the defaults, then over the result (a value kept after a
   * warning is printed from what the first pass left) */
  qm_options_t o = defaults, r = defaults;
  for (int pass = 0; pass < 2; pass++) {
    int w = qm__options_parse(&o, NULL, (const char *)data, size);
    int rw = ref_parse(&r, data, size);
    qm__options_profile(&o);
    ref_profile(&r);
    check_ranges(&o, pass ? "second pass" : "first pass");
    if (w != rw)
      fail("warning count", NREF, (uint64_t)w, (uint64_t)rw);
    for (size_t i = 0; i < NREF; i++)
      if (*field(&o, i) != *field(&r, i))
        fail("differs from the reference", i, *field(&o, i), *field(&r, i));
  }
  if (memcmp(&global, &qm__opt, sizeof global))
    fail("the parser wrote qm__opt, not the struct it was given", NREF, 0, 0);
  if (memcmp(&global_str, &qm__opt_str, sizeof global_str))
    fail("the parser wrote qm__opt_str, not the struct it was given", NREF, 0, 0);
  return 0;
}
