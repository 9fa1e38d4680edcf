/* fork_static.c: a fully static program (cc -static, libqmalloc.a) forks
 * while two threads allocate and free chunks, every 50th a large one whose
 * stack qmalloc takes with libgcc's unwinder; each child allocates 2000
 * chunks, 20 of them large (stacks too), and exits. In a static program the
 * unwinder takes its object_mutex on every unwind (crtbeginT.o registers
 * the tables): a fork while a thread held it left the child waiting for it
 * forever (one CPU: a child of round 1 and of round 7 in two runs), until
 * qmalloc's fork handler waited for its unwinders (100 rounds pass). Exit
 * 0, or 1 naming the round. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static atomic_bool stop;

/* small chunks, and a large one (a stack taken) every 50th; 64 kept */
static void *churn(void *arg) {
  unsigned t = (unsigned)(size_t)arg, i = 0, k = 0;
  void *v[64] = {0};
  while (!atomic_load(&stop)) {
    size_t n = i % 50 == 0 ? 256u << 10 : 16 + (i * 37 + t) % 2000;
    free(v[k]);
    if (!(v[k] = malloc(n)))
      return (void *)1;
    k = (k + 1) % 64;
    i++;
  }
  for (k = 0; k < 64; k++)
    free(v[k]);
  return NULL;
}

int main(void) {
  pthread_t t[2];
  for (int i = 0; i < 2; i++)
    pthread_create(&t[i], NULL, churn, (void *)(size_t)i);
  int bad = -1;
  for (int round = 0; round < 100 && bad < 0; round++) {
    pid_t pid = fork();
    if (pid < 0) {
      perror("fork");
      bad = round;
      break;
    }
    if (pid == 0) {
      alarm(60); /* a deadlock: killed */
      static void *v[2000];
      for (int i = 0; i < 2000; i++)
        v[i] = malloc(i % 100 == 0 ? 300u << 10 : 8 + (size_t)i % 3000);
      for (int i = 0; i < 2000; i++)
        free(v[i]);
      _exit(0);
    }
    int st = 0;
    if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st)) {
      fprintf(stderr, "fork_static: child of round %d: status %d\n", round, st);
      bad = round;
    }
  }
  atomic_store(&stop, true);
  for (int i = 0; i < 2; i++)
    pthread_join(t[i], NULL);
  if (bad >= 0)
    return 1;
  printf("fork_static: 100 children took a large chunk\n");
  return 0;
}
