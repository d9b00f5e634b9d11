/* A process whose main thread leaves first: it starts one worker and calls pthread_exit, so its
 * leader is a zombie ('Z' in /proc/PID/stat) for as long as the worker runs. The worker sleeps
 * for a while (several of the tracer's looks at its target), then maps and unmaps WORKER_CALLS
 * regions and ends the process. A tracer that took the zombie leader for the process's end
 * stops before the worker's calls.
 *
 * tests/endings.rs compiles and traces it.
 *
 * Prints "ready pid=N", waits for SIGUSR1, prints "started", runs, prints "worker_calls=N". */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "gate.h"

#define WORKER_CALLS 500
#define REGION (64 << 10)

static void *worker_main(void *arg) {
    (void)arg;
    const struct timespec before = {3, 0};
    nanosleep(&before, NULL);
    for (int i = 0; i < WORKER_CALLS; i++) {
        char *p = mmap(NULL, REGION, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
            perror("mmap");
            exit(1);
        }
        p[0] = 1;
        munmap(p, REGION);
    }
    printf("worker_calls=%d\n", WORKER_CALLS);
    fflush(stdout);
    return NULL;
}

int main(void) {
    ready_then_wait_for_sigusr1();
    printf("started\n");
    fflush(stdout);
    pthread_t worker;
    if (pthread_create(&worker, NULL, worker_main, NULL) != 0) {
        perror("pthread_create");
        return 1;
    }
    pthread_exit(NULL);
}
