/* test_threads.c - the worker pool under stress: tasks that every thread must run (rm_pool_run)
 * interleaved with tasks that any subset may finish (rm_pool_run_shared), with workers that yield
 * the CPU at random points as they do on a busy machine. Every item of work must be done exactly
 * once, and every thread must run every rm_pool_run task. The pool is internal, so this test
 * compiles its own copy of threads.c. */
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/threads.c"
#include "expect.h"

#define N_ITEMS 97
#define MAX_THREADS 8



typedef struct task {
    atomic_int next;                  /* shared tasks: the next item to hand out */
    atomic_int done[N_ITEMS];         /* how many times each item was done */
    atomic_int ran[MAX_THREADS];      /* how many times each thread ran the task */
    unsigned   seed;
} task;

static void maybe_yield(unsigned * s) {
    *s = *s * 1103515245u + 12345u;
    if ((*s >> 16) % 8 == 0) {
        sched_yield();
    }
}

static void shared_fn(void * p, int ith, int nth) {
    task * t = p;
    unsigned s = t->seed + (unsigned) ith;
    atomic_fetch_add(&t->ran[ith], 1);
    for (;;) {
        const int k = atomic_fetch_add(&t->next, 1);
        if (k >= N_ITEMS) {
            break;
        }
        maybe_yield(&s);
        atomic_fetch_add(&t->done[k], 1);
    }
    (void) nth;
}

static void all_fn(void * p, int ith, int nth) {
    task * t = p;
    unsigned s = t->seed + (unsigned) ith;
    atomic_fetch_add(&t->ran[ith], 1);
    int64_t lo, hi;
    rm_split(N_ITEMS, ith, nth, &lo, &hi);
    for (int64_t k = lo; k < hi; k++) {
        maybe_yield(&s);
        atomic_fetch_add(&t->done[k], 1);
    }
}

static void stress(int n_threads, int rounds) {
    rm_pool * pool = rm_pool_new(n_threads);
    EXPECT(pool != NULL, "rm_pool_new(%d)", n_threads);
    if (!pool) {
        return;
    }
    const int nth = rm_pool_size(pool);
    int bad_items = 0, bad_runs = 0, shared_helped = 0;
    for (int r = 0; r < rounds; r++) {
        task t;
        memset(&t, 0, sizeof(t));
        t.seed = (unsigned) r * 2654435761u;
        const int all = r % 3 == 0;
        if (all) {
            rm_pool_run(pool, all_fn, &t);
        } else {
            rm_pool_run_shared(pool, shared_fn, &t);
        }
        for (int k = 0; k < N_ITEMS; k++) {
            bad_items += atomic_load(&t.done[k]) != 1;
        }
        for (int i = 0; i < nth; i++) {
            const int ran = atomic_load(&t.ran[i]);
            bad_runs += all ? ran != 1 : (i == 0 ? ran != 1 : ran > 1);
            shared_helped += !all && i > 0 && ran == 1;
        }
        if (r % 64 == 63) {
            usleep(200);  /* let the workers go to sleep now and then */
        }
    }
    EXPECT(bad_items == 0, "%d threads: %d items not done exactly once", nth, bad_items);
    EXPECT(bad_runs == 0, "%d threads: %d wrong run counts", nth, bad_runs);
    printf("%d threads, %d rounds: workers joined %d shared tasks\n", nth, rounds, shared_helped);
    rm_pool_free(pool);
}

int main(void) {
    stress(1, 200);
    stress(2, 3000);
    stress(3, 2000);
    stress(MAX_THREADS, 1000);
    printf("test_threads: %d passed, %d failed\n", n_passed, n_failed);
    return n_failed ? 1 : 0;
}
