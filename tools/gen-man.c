/* gen-man.c: writes the manual page qmalloc(3) to stdout, its OPTIONS
 * section built from src/platform/options.def through the same X-macro the library
 * uses, so the page lists exactly the options the parser knows, with their
 * ranges and defaults. Run by meson at build time (tools/meson.build); the
 * version comes in as QM_VERSION.
 */
#include <stdio.h>
#include <string.h>

enum { BOOL, UINT, ENUM, STR };
#define NULL_CHOICES ((const char *)0)

typedef struct opt {
  const char *name;
  int kind;
  unsigned long long def, min, max;
  const char *choices, *doc;
} opt_t;

static const opt_t opts[] = {
#define QM_OPT(name, kind, def, min, max, choices, doc) {#name, kind, def, min, max, choices, doc},
#include "options.def"
#undef QM_OPT
};

/* Text as roff: backslashes escaped, hyphens as \-, never a line that a
 * leading '.' or '\'' would make a request. */
static void text(const char *s) {
  if (*s == '.' || *s == '\'')
    fputs("\\&", stdout);
  for (; *s; s++) {
    if (*s == '\\')
      fputs("\\e", stdout);
    else if (*s == '-')
      fputs("\\-", stdout);
    else
      putchar(*s);
  }
}

/* Choice number idx of "a|b|c". */
static void choice(const char *choices, unsigned long long idx) {
  const char *s = choices;
  for (; idx && s; idx--) {
    s = strchr(s, '|');
    s = s ? s + 1 : NULL;
  }
  if (!s)
    return;
  const char *e = strchr(s, '|');
  printf("%.*s", (int)(e ? (size_t)(e - s) : strlen(s)), s);
}

int main(void) {
  printf(".\\\" Generated from src/platform/options.def by tools/gen-man.c: edit those, not this.\n");
  printf(".TH QMALLOC 3 \"\" \"qmalloc %s\" \"Library Functions Manual\"\n", QM_VERSION);
  puts(".SH NAME\nqmalloc \\- hardened malloc for Linux with a PROT_NONE quarantine for large "
       "chunks");
  puts(".SH SYNOPSIS\n.nf\n"
       "\\fBLD_PRELOAD=\\fP\\fIlibdir\\fP\\fB/libqmalloc.so\\fP \\fIprogram\\fP [\\fIargs\\fP]\n"
       "\\fBqmalloc\\-run\\fP \\fIprogram\\fP [\\fIargs\\fP]\n"
       "\\fBcc\\fP \\fIprog.c\\fP \\fB\\-lqmalloc\\fP\n"
       "\\fBQMALLOC_OPTIONS=\\fP\\fIname\\fP\\fB=\\fP\\fIvalue\\fP[\\fB:\\fP\\fIname\\fP\\fB=\\fP"
       "\\fIvalue\\fP...]\n"
       "\n\\fB#include <qmalloc.h>\\fP\n"
       "\\fBconst char *qmalloc_default_options(void);\\fP\n.fi");
  puts(".SH DESCRIPTION\n"
       "qmalloc replaces malloc, free and the rest of the C and C++ allocation functions, "
       "preloaded or linked. A freed large chunk is kept inaccessible in a quarantine, so a "
       "read or write through a dangling pointer faults at once; small chunks are checked at "
       "free (double and invalid frees, overflows past the requested size, corrupted state) "
       "and some are sampled into guarded slots. A detected error prints one line on standard "
       "error, starting with \\fBqmalloc: ERROR:\\fP, and the stacks where they are known, then "
       "aborts; the \\fBqmalloc\\-symbolize\\fP tool, installed beside \\fBqmalloc\\-run\\fP, "
       "turns the frames of a saved report into functions and source lines.");
  puts(".SH OPTIONS\n"
       "Options come from the program's own \\fBqmalloc_default_options\\fP(), if it defines "
       "one, then from the environment variable \\fBQMALLOC_OPTIONS\\fP, which wins. An unknown "
       "name or a value out of range warns and is ignored. \\fBhelp=1\\fP lists them with the "
       "values in force.");
  for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++) {
    const opt_t *o = &opts[i];
    printf(".TP\n\\fB%s\\fP=", o->name);
    if (o->kind == BOOL)
      printf("\\fB0\\fP|\\fB1\\fP (default %llu)\n", o->def);
    else if (o->kind == ENUM) {
      const char *c = o->choices;
      for (unsigned long long k = 0; c; k++) {
        printf(k ? "|\\fB" : "\\fB");
        choice(o->choices, k);
        printf("\\fP");
        c = strchr(c, '|');
        c = c ? c + 1 : NULL;
      }
      printf(" (default ");
      choice(o->choices, o->def);
      printf(")\n");
    } else if (o->kind == STR)
      printf("\\fIPATH\\fP (up to %llu bytes; default empty)\n", o->max);
    else
      printf("\\fIN\\fP (%llu to %llu, default %llu)\n", o->min, o->max, o->def);
    text(o->doc);
    putchar('\n');
  }
  puts(".SH ENVIRONMENT\n.TP\n.B QMALLOC_OPTIONS\n"
       "The options, as above. Ignored in secure execution (a set\\-user\\-ID or "
       "set\\-group\\-ID program, or one with file capabilities: the kernel's \\fBAT_SECURE\\fP), "
       "as glibc ignores its \\fBMALLOC_\\fP variables; the program's own "
       "\\fBqmalloc_default_options\\fP() still applies.");
  puts(".SH FILES\n.TP\n.IR PATH . pid\n"
       "With \\fBlog_path=\\fP\\fIPATH\\fP, everything qmalloc prints also goes there: created "
       "mode 0600, never through a symbolic link, and only a regular file with one link owned "
       "by the user writing it is kept.");
  puts(".SH EXIT STATUS\nA detected error ends the process with \\fBSIGABRT\\fP (or, for an "
       "access to a quarantined chunk or guard page, \\fBSIGSEGV\\fP). \\fBhelp=1\\fP ends it "
       "with status 0 before \\fBmain\\fP runs.");
  puts(".SH SEE ALSO\n\\fBmalloc\\fP(3), \\fBmprotect\\fP(2), \\fBld.so\\fP(8)");
  return 0;
}
