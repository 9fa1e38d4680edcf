// report_re.h: regexes of qmalloc's reports for death tests: the first line,
// the stack of the call or access that found the error, the stacks kept for a
// large chunk, and the closing SUMMARY line (the format of src/report.h).
#ifndef QM_TEST_REPORT_RE_H
#define QM_TEST_REPORT_RE_H

// The start of every report line, for death-test regexes.
#define QM_ERR "qmalloc: ERROR: "
#define HEX "0x[0-9a-f]+"

// What follows a report about a large chunk: the stacks, each frame as
// "#N 0xPC (module+0xOFF)" and maybe a symbol. The SIGSEGV explanation
// starts with the faulting access's stack; a freed chunk has two more.
#define QM_FRAMES "(    #[0-9]+ " HEX " \\([^\n]+\\+" HEX "\\)[^\n]*\n)+"
#define QM_SUMMARY "SUMMARY: qmalloc: [^\n]+\n$"
// SUMMARY naming a function of the program: "SUMMARY: qmalloc: <kind> (module+0xOFF) fn+0xN"
#define QM_SUMMARY_IN(kind, fn) "SUMMARY: qmalloc: " kind " \\([^\n]+\\) " fn "\\+" HEX "\n$"
#define QM_ACCESSED "  accessed by thread [0-9]+ here:\n" QM_FRAMES
#define QM_CALL "  detected in a call by thread [0-9]+ here:\n" QM_FRAMES
// a report with no stacks kept: the offending call's, then SUMMARY
#define QM_END QM_CALL QM_SUMMARY
// the offending call's or access's stack, any kept stacks, and SUMMARY naming fn
#define QM_CALL_THEN(kind, fn) QM_CALL ".*" QM_SUMMARY_IN(kind, fn)
#define QM_ACCESS_THEN(kind, fn) QM_ACCESSED ".*" QM_SUMMARY_IN(kind, fn)
// a SIGSEGV explanation with no stacks kept: the access's, then SUMMARY
#define QM_FAULT_END QM_ACCESSED QM_SUMMARY
#define QM_ALLOCATED "  allocated by thread [0-9]+ here:\n" QM_FRAMES QM_SUMMARY
#define QM_FREED                                                                                   \
  "  freed by thread [0-9]+, [0-9]+ large frees and [0-9]+ ms ago, here:\n" QM_FRAMES              \
  "  previously allocated by thread [0-9]+ here:\n" QM_FRAMES QM_SUMMARY

#endif
