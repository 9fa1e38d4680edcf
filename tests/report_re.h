// report_re.h: regexes of qmalloc's reports for the C++ death tests, built
// from the one definition of the format, tests/report.re (its macros come
// in report_format.h, generated from it): the first line, the stack of the
// call or access that found the error, the stacks kept for a large chunk,
// and the closing SUMMARY line.
#ifndef QM_TEST_REPORT_RE_H
#define QM_TEST_REPORT_RE_H

#include "report_format.h"

#define HEX QM_HEX

// A stack: its frames, each "#N 0xPC (module+0xOFF)" and maybe a symbol.
#define QM_FRAMES "(" QM_FRAME "\n)+"
// The end of the output: under qemu-user (QMT_EMULATED_BUILD, a cross
// build run through the cross file's exe_wrapper: tests/meson.build) the
// emulator adds a line of its own after a death by SIGSEGV or SIGABRT
// ("qemu: uncaught target signal 11 (Segmentation fault) - core dumped":
// qemu 7.2 prints it whenever its core dump returns, RLIMIT_CORE 0 too)
#ifdef QMT_EMULATED_BUILD
#define QM_EOR "\n(qemu: uncaught target signal [^[:cntrl:]]+\n)?$"
#else
#define QM_EOR "\n$"
#endif
// the symbolizer's hint, then SUMMARY, the last line
#define QM_SUMMARY_END QM_HINT "\n" QM_SUMMARY QM_EOR
// SUMMARY naming a function of the program: "SUMMARY: qmalloc: <kind> (module+0xOFF) fn+0xN"
#define QM_SUMMARY_IN(kind, fn) QM_HINT "\n" QM_SUMMARY_AT(kind, fn) QM_EOR
#define QM_ACCESSED QM_ACCESS_HEAD "\n" QM_FRAMES
#define QM_CALL QM_CALL_HEAD "\n" QM_FRAMES
// a report with no stacks kept: the offending call's, then SUMMARY
#define QM_END QM_CALL QM_SUMMARY_END
// the offending call's or access's stack, any kept stacks, and SUMMARY naming fn
#define QM_CALL_THEN(kind, fn) QM_CALL ".*" QM_SUMMARY_IN(kind, fn)
#define QM_ACCESS_THEN(kind, fn) QM_ACCESSED ".*" QM_SUMMARY_IN(kind, fn)
// a SIGSEGV explanation with no stacks kept: the access's, then SUMMARY
#define QM_FAULT_END QM_ACCESSED QM_SUMMARY_END
#define QM_ALLOCATED QM_ALLOC_HEAD "\n" QM_FRAMES QM_SUMMARY_END
#define QM_FREED QM_FREED_HEAD "\n" QM_FRAMES QM_PREV_ALLOC_HEAD "\n" QM_FRAMES QM_SUMMARY_END

#ifdef __cplusplus
#include <string>
// A template's placeholder filled in at run time, for the details a test
// computes: qm_fill(QM_LINE_OF(QM_K_DOUBLE_FREE, "@D@"), "@D@", d). The
// placeholder must be there: a template that lost it gives a regex that
// matches nothing (text after the end), so the test fails, showing it.
inline std::string qm_fill(std::string re, const char *placeholder, const std::string &with) {
  size_t at = re.find(placeholder);
  if (at == std::string::npos)
    return re + "$no " + placeholder;
  return re.replace(at, std::string(placeholder).size(), with);
}
// Text as a regex that matches it literally (a failed check's condition).
inline std::string qm_re_quote(const std::string &text) {
  std::string re;
  for (char c : text) {
    if (std::string("\\^$.|?*+()[]{}").find(c) != std::string::npos)
      re += '\\';
    re += c;
  }
  return re;
}
#endif

#endif
