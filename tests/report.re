# report.re: the format of qmalloc's reports (src/platform/report.c), defined once for
# every test that reads them. gen-report-re.py makes the C++ death tests'
# header of it (report_format.h, included by report_re.h); the hardening and
# preload suites' meson.build read it (fs.read) and build their regexes
# from it; expect.sh sources it to check a report's stack and SUMMARY line.
# A change of a report's format is made here and in report.c, nowhere else.
#
# Each line NAME='ERE' is a POSIX extended regex matching within one line,
# unanchored. [^[:cntrl:]] stands for "any character of the line" (gtest's
# "." also matches a newline). @X@ is a placeholder the test fills in: a
# C++ macro argument, a meson or shell replace. No single quote inside.
QM_HEX='0x[0-9a-f]+'
QM_ERR='qmalloc: ERROR: '
QM_WARN='qmalloc: WARNING: '

# The words of each kind of report (the SUMMARY line names them too).
QM_K_DOUBLE_FREE='double free'
QM_K_INVALID_FREE='invalid free'
QM_K_REALLOC='realloc'
QM_K_USABLE_SIZE='malloc_usable_size'
QM_K_SIZE_MISMATCH='size mismatch in @CALL@'
QM_K_SMALL_OVERFLOW='heap overflow past small chunk'
QM_K_WRITE_AFTER_FREE='write after free of small chunk'
QM_K_BAD_ENTRY='corrupted free list: entry'
QM_K_UAF='use-after-free'
QM_K_OVERFLOW='heap overflow'
QM_K_UNDERFLOW='heap underflow'
QM_K_GUARD='heap overflow or underflow'
QM_K_WILD='wild access'
QM_K_CHECK='internal check failed'

# A report's first line: a pointer passed to an operation (double free,
# invalid free, realloc, malloc_usable_size, size mismatch); a chunk found
# damaged (heap overflow past small chunk, write after free, corrupted free
# list); an access that faulted, RW being read or write.
QM_LINE_OF='qmalloc: ERROR: @KIND@ of 0x[0-9a-f]+ \(@D@\)'
QM_LINE='qmalloc: ERROR: @KIND@ 0x[0-9a-f]+ \(@D@\)'
QM_LINE_AT='qmalloc: ERROR: @KIND@ \(@RW@\) at 0x[0-9a-f]+ \(@D@\)'
# A failed internal check (QM_CHECK, QM_CHECK_OP in src/platform/qm.h: qmalloc's own
# state found broken): the condition as the source writes it (its regex
# characters escaped, qm_re_quote in report_re.h), the file, and the
# operands compared (0 and 0 for a plain QM_CHECK). The line number is left
# open: an edit above the check does not break its test.
QM_LINE_CHECK='qmalloc: ERROR: internal check failed: \(@COND@ at [^[:cntrl:]]*src/@FILE@:[0-9]+, operands @A@ and @B@\)'
# a fault inside a live chunk: no error of qmalloc's, no stacks follow
QM_LINE_LIVE='qmalloc: SIGSEGV \(@RW@\) at 0x[0-9a-f]+ \(@D@\): inside a live chunk, not at a guard of qmalloc.s'

# What follows the first line: the stack of the call (or access) that
# found the error, a large chunk's kept stacks, each a heading and frames,
# and the SUMMARY line naming the kind and the offending frame.
QM_CALL_HEAD='  detected in a call by thread [0-9]+ here:'
QM_ACCESS_HEAD='  accessed by thread [0-9]+ here:'
QM_FREED_HEAD='  freed by thread [0-9]+, [0-9]+ large frees and [0-9]+ ms ago, here:'
QM_PREV_ALLOC_HEAD='  previously allocated by thread [0-9]+ here:'
# a small chunk's overflow found after its free: that free's caller first
QM_SMALL_FREED_HEAD='  freed by thread [0-9]+ here \(the caller of free\), the damage found later:'
# the line before SUMMARY: how to name the frames
QM_HINT='  \(qmalloc-symbolize: [^[:cntrl:]]+\)'
QM_ALLOC_HEAD='  allocated by thread [0-9]+ here:'
QM_FRAME='    #[0-9]+ 0x[0-9a-f]+ \([^[:cntrl:]]+\+0x[0-9a-f]+\)[^[:cntrl:]]*'
QM_NO_STACK='    \(no stack recorded\)'
QM_SUMMARY='SUMMARY: qmalloc: [^[:cntrl:]]+'
QM_SUMMARY_OF='SUMMARY: qmalloc: @KIND@ \([^[:cntrl:]]+\)[^[:cntrl:]]*'
QM_SUMMARY_AT='SUMMARY: qmalloc: @KIND@ \([^[:cntrl:]]+\) @FN@\+0x[0-9a-f]+'
