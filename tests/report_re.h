// report_re.h: regexes of qmalloc's reports for death tests: the first line,
// and the stacks that follow it in a report about a large chunk.
#ifndef QM_TEST_REPORT_RE_H
#define QM_TEST_REPORT_RE_H

// The start of every report line, for death-test regexes.
#define QM_ERR "qmalloc: ERROR: "
#define HEX "0x[0-9a-f]+"

// What follows a report about a large chunk: the stacks, each frame as
// "#N 0xPC (module+0xOFF)" and maybe a symbol. The SIGSEGV explanation
// starts with the faulting access's stack; a freed chunk has two more.
#define QM_FRAMES "(    #[0-9]+ " HEX " \\([^\n]+\\+" HEX "\\)[^\n]*\n)+"
#define QM_ACCESSED "  accessed by thread [0-9]+ here:\n" QM_FRAMES
#define QM_ALLOCATED "  allocated by thread [0-9]+ here:\n" QM_FRAMES "$"
#define QM_FREED                                                                                   \
  "  freed by thread [0-9]+, [0-9]+ large frees and [0-9]+ ms ago, here:\n" QM_FRAMES              \
  "  previously allocated by thread [0-9]+ here:\n" QM_FRAMES "$"

#endif
