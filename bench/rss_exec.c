/* rss_exec OUTFILE CMD [ARG...]: run CMD, write its peak RSS in KiB (wait4 ru_maxrss of CMD and the
 * descendants it waited for) to OUTFILE, exit with CMD's status. A small C parent keeps the figure
 * honest: a child forked from Python starts with the interpreter's resident pages in its high-water
 * mark, which exec does not reset. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: rss_exec OUTFILE CMD [ARG...]\n"); return 2; }
    pid_t pid = fork();
    if (pid < 0) { perror("fork"); return 2; }
    if (pid == 0) { execvp(argv[2], argv + 2); perror(argv[2]); _exit(127); }
    int status = 0;
    struct rusage usage;
    if (wait4(pid, &status, 0, &usage) < 0) { perror("wait4"); return 2; }
    FILE *out = fopen(argv[1], "w");
    if (!out) { perror(argv[1]); return 2; }
    fprintf(out, "%ld\n", usage.ru_maxrss);
    fclose(out);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}
