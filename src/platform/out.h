/* out.h: the one way out for what qmalloc prints (out.c): stderr and the
 * log file of option log_path, and the one-line warnings. Nothing
 * allocates; lines are formatted with fmt.h.
 */
#ifndef QM_OUT_H
#define QM_OUT_H

#include "fmt.h"
#include "qm.h"

/* Writes b to stderr and the log file, then empties it. */
void qm__out(qm_buf_t *b);
#ifdef QM_TEST_HOOKS
/* Test hook: forgets the log file and a failure to open it (the descriptor
 * stays open), so that the next line opens log_path afresh. */
void qm__out_log_forget(void);
#endif

/* "qmalloc: WARNING: <line>" on stderr and the log file; never fatal. */
void qm__warn_buf(qm_buf_t *line) QM_COLD;

#endif
