/* A workload built WITHOUT frame pointers (gcc -O2 -fomit-frame-pointer), like distribution
 * binaries: its threads reach mmap, a page fault and munmap through a known chain of its own
 * functions and then libc. tests/unwind.rs compiles and traces it.
 *
 * Prints "ready pid=N", waits for SIGUSR1, runs ITERATIONS rounds (or argv[1]) in THREADS
 * threads, exits. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "gate.h"

#define THREADS 4
#define ITERATIONS 400
#define REGION (1 << 20)

/* Keeps each call a real call with a frame of its own (no inlining, no tail call). */
#define KEEP() __asm__ volatile("" ::: "memory")

__attribute__((noinline)) static char *chain_map_and_touch(void) {
    char *p = mmap(NULL, REGION, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        perror("mmap");
        exit(1);
    }
    for (size_t i = 0; i < REGION; i += 4096)
        p[i] = 1;
    KEEP();
    return p;
}

__attribute__((noinline)) static void chain_inner(void) {
    char *p = chain_map_and_touch();
    KEEP();
    munmap(p, REGION);
    KEEP();
}

__attribute__((noinline)) static void chain_middle(int n) {
    for (int i = 0; i < n; i++)
        chain_inner();
    KEEP();
}

static int iterations = ITERATIONS;

__attribute__((noinline)) static void *chain_outer(void *arg) {
    (void)arg;
    chain_middle(iterations);
    KEEP();
    return NULL;
}

int main(int argc, char **argv) {
    if (argc > 1)
        iterations = atoi(argv[1]);
    ready_then_wait_for_sigusr1();
    pthread_t threads[THREADS];
    for (int i = 0; i < THREADS; i++)
        pthread_create(&threads[i], NULL, chain_outer, NULL);
    for (int i = 0; i < THREADS; i++)
        pthread_join(threads[i], NULL);
    printf("done\n");
    return 0;
}
