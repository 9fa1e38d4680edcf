/* ro.h: the allocator's global state that is fixed once init is done
 * (options, class table and keys, region bases, the secret, the page size):
 * defined together in ro.c on pages of their own, made read-only when init
 * ends, so a write primitive in the program cannot redirect the allocator.
 */
#ifndef QM_RO_H
#define QM_RO_H

/* Makes the pages read-only (end of init). */
void qm__ro_seal(void);
#ifdef QM_TEST_HOOKS
/* Test hooks: writable again (the tests' option hooks, which re-parse
 * options after init); [lo, hi) of the pages, for the tests' maps check. */
void qm__ro_unseal(void);
void qm__ro_range(void **lo, void **hi);
#endif
/* The page of padding that ends the section (ro_end.c). */
extern char qm__ro_end[4096];

#endif
