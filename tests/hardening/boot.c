/* boot.c: frees aimed at qmalloc's start-up arena, the chunks it serves
 * while it reads a qmalloc_default_options() that allocates. Two of them
 * are made here; each subcommand then frees what an attacker or a bug
 * would. Built plain (run under LD_PRELOAD, exported with -rdynamic so the
 * preloaded library finds the hook) and linked.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *first, *second; /* start-up chunks of 24 and 40 bytes */

const char *qmalloc_default_options(void);
const char *qmalloc_default_options(void) {
  if (!first) {
    first = malloc(24);
    second = malloc(40);
    if (first)
      strcpy(first, "start-up");
  }
  return "";
}

static void *volatile sink;

int main(int argc, char **argv) {
  const char *m = argc > 1 ? argv[1] : "";
  if (!first || !second) {
    fprintf(stderr, "boot: qmalloc_default_options() was not called with qmalloc starting\n");
    return 3;
  }
  if (!strcmp(m, "free-ok")) { /* live start-up chunks: freed once each, quietly */
    char *r = realloc(second, 4000);
    if (!r || strcmp(first, "start-up"))
      return 1;
    free(first);
    free(r);
    return 0;
  }
  if (!strcmp(m, "double-free")) {
    free(first);
    free(first);
    return 0;
  }
  if (!strcmp(m, "interior-free")) {
    free(first + 8);
    return 0;
  }
  if (!strcmp(m, "forged-free")) { /* in the arena, past its last chunk */
    free(second + 4096);
    return 0;
  }
  if (!strcmp(m, "realloc-freed")) {
    free(second);
    sink = realloc(second, 100);
    return 0;
  }
  if (!strcmp(m, "underflow")) { /* the arena's first chunk, then its guard page */
    volatile char *p = first;
    p[-1] = 1;
    return 0;
  }
  fprintf(stderr, "boot: unknown subcommand %s\n", m);
  return 2;
}
