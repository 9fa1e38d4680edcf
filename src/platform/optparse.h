/* optparse.h: the parser of the runtime options (optparse.c) into qm__opt
 * and qm__opt_str (options.h): defaults, qmalloc_default_options() and
 * QMALLOC_OPTIONS, the profiles, and the printing of them. Never allocates.
 */
#ifndef QM_OPTPARSE_H
#define QM_OPTPARSE_H

#include <stddef.h>

#include "options.h"

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
