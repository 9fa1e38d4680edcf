/* program_time.c: times one run of a real program (the allocator comes with
 * the LD_PRELOAD its children inherit) and prints one result line: wall
 * time, minor faults and peak RSS of the program and everything it ran.
 * The program's stdout goes to /dev/null; a run that fails (exit status not
 * 0, or a signal) prints an error result, so a crash is never a time.
 *
 * usage: program_time --name NAME -- CMD [ARGS...]
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"

int main(int argc, char **argv) {
  const char *name = bench_arg_str(argc, argv, "--name", "program");
  int cmd = 1;
  while (cmd < argc && strcmp(argv[cmd], "--"))
    cmd++;
  if (++cmd >= argc) {
    fprintf(stderr, "program_time: usage: program_time --name NAME -- CMD [ARGS...]\n");
    return 2;
  }
  uint64_t t0 = bench_now_ns();
  pid_t pid = fork();
  if (pid < 0) {
    perror("program_time: fork");
    return 1;
  }
  if (pid == 0) {
    int null = open("/dev/null", O_WRONLY);
    if (null >= 0)
      dup2(null, 1);
    execvp(argv[cmd], argv + cmd);
    fprintf(stderr, "program_time: %s: %s\n", argv[cmd], strerror(errno));
    _exit(127);
  }
  int status;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) {
      perror("program_time: waitpid");
      return 1;
    }
  uint64_t ns = bench_now_ns() - t0;
  if (!WIFEXITED(status) || WEXITSTATUS(status)) {
    char why[64];
    if (WIFSIGNALED(status))
      snprintf(why, sizeof why, "killed_by_signal_%d", WTERMSIG(status));
    else
      snprintf(why, sizeof why, "exit_status_%d", WEXITSTATUS(status));
    printf("result bench=programs program=%s error=%s\n", name, why);
    return 1;
  }
  struct rusage ru;
  getrusage(RUSAGE_CHILDREN, &ru);
  /* ru_maxrss of RUSAGE_CHILDREN: the largest of the waited-for
   * descendants, in KiB */
  printf("result bench=programs program=%s ns=%llu ms=%.1f minflt=%ld peak_rss_kb=%ld\n", name,
         (unsigned long long)ns, ns / 1e6, ru.ru_minflt, ru.ru_maxrss);
  return 0;
}
