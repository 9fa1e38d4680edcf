/* options.h: the parsed runtime options, one field per line of options.def.
 * Written only during init (or by the tests' re-parse hook), read everywhere
 * after; parsing never allocates.
 */
#ifndef QM_OPTIONS_H
#define QM_OPTIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct qm_options {
#define QM_OPT(name, kind, def, min, max, choices, doc) uint64_t name;
#include "options.def"
#undef QM_OPT
} qm_options_t;

extern __attribute__((visibility("hidden"))) qm_options_t qm__opt;

/* The bytes of the STR options, NUL-terminated; read-only after init too. */
#define QM_STR_FIELD_BOOL(name)
#define QM_STR_FIELD_UINT(name)
#define QM_STR_FIELD_ENUM(name)
#define QM_STR_FIELD_STR(name) char name[256];
typedef struct qm_option_strings {
#define QM_OPT(name, kind, def, min, max, choices, doc) QM_STR_FIELD_##kind(name)
#include "options.def"
#undef QM_OPT
  char unused_; /* a struct may not be empty */
} qm_option_strings_t;

extern __attribute__((visibility("hidden"))) qm_option_strings_t qm__opt_str;

enum { QM_PROBE_AUTO, QM_PROBE_FAST, QM_PROBE_SLOW };
enum {
  QM_STRAT_AUTO,
  QM_STRAT_PROTECT,
  QM_STRAT_DISCARD,
  QM_STRAT_GUARD,
  QM_STRAT_UNMAP,
  QM_STRAT_NONE
};
enum { QM_WAY_AUTO, QM_WAY_PROTECT, QM_WAY_MOVE };
enum { QM_PURGE_DONTNEED, QM_PURGE_FREE };
enum { QM_HARDENING_DEFAULT, QM_HARDENING_MAX };

/* Sets the defaults, then applies qmalloc_default_options() (weak, a linked
 * program may define it) and the QMALLOC_OPTIONS environment variable. */
void qm__options_init(void);
/* Applies one "name=value:name=value" string over the current values;
 * source names it in warnings. Returns the number of warnings printed. */
int qm__options_apply(const char *source, const char *s);
/* The same over *o, reading at most n bytes of s (it stops at a NUL too);
 * a NULL source counts warnings but prints none. The fuzzer's entry point:
 * every field it writes is within its table range. */
int qm__options_parse(qm_options_t *o, const char *source, const char *s, size_t n);
/* Applies the hardening profile to *o: max turns every check on. */
void qm__options_profile(qm_options_t *o);
/* Turns values into the ones in force where the allocator rounds them
 * (guard_interval_kb, guard_align), so that what verbose and help print is
 * what runs. */
void qm__options_settle(qm_options_t *o);
void qm__options_reset(void);
/* Prints every option with its value and doc, one per line, to stderr. */
void qm__options_print(void);
/* Prints every option with its value in force, range, default and doc. */
void qm__options_help(void);

#endif
