/* options.h: the parsed runtime options, one field per line of options.def:
 * the values only, which every part reads (the parser is optparse.c).
 * Written only during init (or by the tests' re-parse hook), read everywhere
 * after.
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

#endif
