/* The workloads' start protocol (as mmapsem-workload's): print "ready pid=N", then wait for
 * SIGUSR1, so that the test can attach the tracer before any work begins. SIGUSR1 is blocked
 * before any thread exists (threads inherit the mask), so it is never delivered, only taken
 * here, and one sent right after "ready" stays pending rather than lost. */
#ifndef MMAPSEM_TEST_GATE_H
#define MMAPSEM_TEST_GATE_H

#include <signal.h>
#include <stdio.h>
#include <unistd.h>

static void ready_then_wait_for_sigusr1(void) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    printf("ready pid=%d\n", getpid());
    fflush(stdout);
    int sig;
    sigwait(&set, &sig);
}

#endif
