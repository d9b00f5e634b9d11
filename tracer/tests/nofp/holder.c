/* A workload built WITHOUT frame pointers (gcc -O2 -fomit-frame-pointer), whose threads reach
 * munmap through chains of their own functions that frame pointers cannot see, so that every
 * thread's munmap has the same frame-pointer stack (libc's wrapper, nothing above it):
 *
 * - one "holder" thread first maps and unmaps HOLDER_CALLS regions through holder_* functions,
 *   slowly, so that the tracer can copy the user stack of every one of its calls;
 * - then WORKERS threads map and unmap WORKER_CALLS regions each through worker_* functions, as
 *   fast as they can, so that the tracer's copy budget is spent and most of their calls keep
 *   only the shared frame-pointer stack.
 *
 * tests/invariants.rs compiles and traces it: the holder's unwound stack must never be given
 * more munmap calls than the holder made.
 *
 * Prints "ready pid=N", waits for SIGUSR1, runs, prints "holder_calls=N", exits. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "gate.h"

#define HOLDER_CALLS 40
#define WORKERS 4
#define WORKER_CALLS 4000
#define REGION (64 << 10)

/* Keeps each call a real call with a frame of its own (no inlining, no tail call). */
#define KEEP() __asm__ volatile("" ::: "memory")

/* Static and out of holder_main, so that it keeps no pointer in rbp for frame pointers to
 * misread as a frame. */
static const struct timespec gap = {0, 5 * 1000 * 1000};

static char *map_region(void) {
    char *p = mmap(NULL, REGION, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        perror("mmap");
        exit(1);
    }
    p[0] = 1;
    return p;
}

__attribute__((noinline)) static void holder_unmap(char *p) {
    munmap(p, REGION);
    KEEP();
}

__attribute__((noinline)) static void pause_briefly(void) {
    nanosleep(&gap, NULL);
    KEEP();
}

__attribute__((noinline)) static void *holder_main(void *arg) {
    (void)arg;
    for (int i = 0; i < HOLDER_CALLS; i++) {
        holder_unmap(map_region());
        pause_briefly();
    }
    KEEP();
    return NULL;
}

__attribute__((noinline)) static void worker_unmap(char *p) {
    munmap(p, REGION);
    KEEP();
}

__attribute__((noinline)) static void *worker_main(void *arg) {
    (void)arg;
    for (int i = 0; i < WORKER_CALLS; i++)
        worker_unmap(map_region());
    KEEP();
    return NULL;
}

int main(void) {
    ready_then_wait_for_sigusr1();
    pthread_t holder, workers[WORKERS];
    pthread_create(&holder, NULL, holder_main, NULL);
    pthread_join(holder, NULL);
    for (int i = 0; i < WORKERS; i++)
        pthread_create(&workers[i], NULL, worker_main, NULL);
    for (int i = 0; i < WORKERS; i++)
        pthread_join(workers[i], NULL);
    printf("holder_calls=%d\n", HOLDER_CALLS);
    return 0;
}
