/* large_record.h: the large chunks' metadata mappings, for the tests
 * that check no chunk overlaps them (large_record.c).
 */
#ifndef QM_LARGE_RECORD_H
#define QM_LARGE_RECORD_H

#include <stddef.h>
#include <stdint.h>

#ifdef QM_TEST_HOOKS
/* Test hook: the record table's, the hash table's and the stack table's
 * mappings, as [lo, hi) pairs. */
size_t qm__large_metadata(uintptr_t (*out)[2], size_t cap);
#endif

#endif
