/* A JIT as the tracer sees one: code copied into anonymous executable memory, named only in
 * /tmp/perf-PID.map (as a JVM, node or .NET names theirs for perf). The copied stub keeps a
 * frame pointer and calls back into C, which maps and unmaps; so the lock operations' user
 * stacks pass through code that no mapped file holds.
 *
 * Usage: jit ROUNDS. Leaves its map behind, as runtimes do (the test removes it). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "gate.h"

#define REGION (1 << 20)

static void work(void) {
    char *p = mmap(NULL, REGION, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        exit(1);
    p[0] = 1;
    munmap(p, REGION);
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 1000;
    /* push rbp; mov rbp, rsp; call rdi; pop rbp; ret */
    static const unsigned char code[] = {0x55, 0x48, 0x89, 0xe5, 0xff, 0xd7, 0x5d, 0xc3};
    unsigned char *stub = mmap(NULL, 4096, PROT_READ | PROT_WRITE,
                               MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (stub == MAP_FAILED)
        return 1;
    memcpy(stub, code, sizeof code);
    if (mprotect(stub, 4096, PROT_READ | PROT_EXEC) != 0)
        return 1;
    char path[64];
    snprintf(path, sizeof path, "/tmp/perf-%d.map", getpid());
    FILE *map = fopen(path, "w");
    if (!map)
        return 1;
    fprintf(map, "%lx %zx jit_stub_for_test\n", (unsigned long)stub, sizeof code);
    fclose(map);
    ready_then_wait_for_sigusr1();
    void (*jitted)(void (*)(void)) = (void (*)(void (*)(void)))stub;
    for (int i = 0; i < rounds; i++)
        jitted(work);
    printf("rounds=%d\n", rounds);
    return 0;
}
