/* sealed.c: the definitions of every global fixed after init, in the
 * section qm_ro (seal.h), each declared in its owner's header: one file,
 * which knows every owner's types, linked between seal.c and
 * sealed_end.c's padding in the section's own library. The order within
 * this file does not matter (clang, which has no -fno-toplevel-reorder,
 * may emit them in any order), only the link order of the three files.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "qmalloc.h"

#include "alloc.h"
#include "boot.h"
#include "cache.h"
#include "describe.h"
#include "guarded.h"
#include "init.h"
#include "large_report.h"
#include "life.h"
#include "options.h"
#include "primary.h"
#include "qm.h"
#include "random.h"
#include "seal.h"
#include "smallstate.h"
#include "smallstate_int.h"
#include "up.h"

QM_SEALED qm_options_t qm__opt;
QM_SEALED qm_option_strings_t qm__opt_str;
QM_SEALED qm_class_info_t qm__class[QM_NCLASS + 1];
QM_SEALED uint8_t qm__class_tab[QM_CLASS_TAB_MAX / 8 + 1];
QM_SEALED uintptr_t qm__pbase;
QM_SEALED size_t qm__pspan;
QM_SEALED unsigned qm__rshift;
QM_SEALED uintptr_t qm__rmask;
QM_SEALED uintptr_t qm__gmask;
QM_SEALED size_t qm__small_limit;
QM_SEALED uint64_t qm__secret;
QM_SEALED uintptr_t qm__boot_base;
QM_SEALED size_t qm__page;
QM_SEALED unsigned qm__page_shift;
QM_SEALED bool qm__cache_checked;
QM_SEALED uint8_t qm__vec;
QM_SEALED struct qm_state_meta *qm__smeta;
/* What the parts below ask of the rest without calling up, wired here
 * once: the describers of addresses, in the order qm__describe asks them
 * (the large side and the guarded slots, whose guard pages may lie
 * anywhere, first; the start-up arena's guards before the heap; its chunks
 * last), with the finder of a large chunk's kept stacks; and the small
 * side's slow-path calls into the malloc family and the thread life cycle.
 * Static, so in force from the first call (nothing owns memory before init:
 * each describer finds nothing), and sealed with the rest. */
QM_SEALED qm_describers_t qm__describers = {
    .fn = {qm__large_describe, qm__guarded_describe, qm__boot_describe_guard,
           qm__small_describe_heap, qm__boot_describe},
    .n = 5,
    .kept = qm__large_kept,
};
QM_SEALED qm_small_up_t qm__small_up = {
    .malloc_slow = qm__malloc_slow,
    .free_other = qm__free_outside,
    .free_general = qm__small_free_general,
    .cache_create = qm__life_cache_create,
};
/* The primary's steering state (committed bytes and central lists, see
 * primary.c): until init maps it, a zeroed array that nothing writes (no
 * small chunk exists, every small pointer is outside what is committed). */
static _Atomic size_t committed_none[QM_NCLASS + 1];
QM_SEALED _Atomic size_t *qm__committed = committed_none;
QM_SEALED struct central *qm__central;
