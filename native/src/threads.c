/* threads.c - the persistent worker pool.
 *
 * Workers wait on a generation counter: they spin for a while (a token's matrix products come in
 * quick succession, with gaps of tens of microseconds between some: norms, attention's set-up,
 * the caller's own work between tokens), then sleep on a condition variable so an idle model
 * costs no CPU. A worker asleep must be woken by a system call and may join a task late or miss
 * it, leaving the caller to do the work alone: spinning 20,000 loads (about 10 us here), a decode
 * token slept and woke its worker 13 times. The caller takes the mutex and broadcasts only when a
 * worker sleeps.
 *
 * A task is open from the moment its generation is posted until the caller closes it. A worker
 * joins it (counted in n_active) only while it is open, and the caller closes it only when no
 * worker is inside, so a task's fields never change under a worker. rm_pool_run waits for every
 * worker to have run the task before closing; rm_pool_run_shared closes as soon as the caller's
 * own call returns, so a worker that is descheduled (another process on its core) or still
 * asleep simply misses the task instead of holding everyone up. */
#include "threads.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define RM_SPIN_NS 100000        /* a worker's spin before it sleeps */
#define RM_SPIN_CHECK 256         /* spins between looks at the clock */

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define RM_CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define RM_CPU_RELAX() __asm__ __volatile__("yield")
#else
#define RM_CPU_RELAX() ((void) 0)
#endif

struct rm_pool {
    int             n_threads;
    pthread_t *     threads;
    pthread_mutex_t mutex;
    pthread_cond_t  cond;
    atomic_uint     generation;   /* bumped once per task */
    atomic_int      n_pending;    /* rm_pool_run: workers still to run the current task */
    atomic_uint     open_gen;     /* the generation whose task workers may join; 0 when closed */
    atomic_int      n_active;     /* workers inside (or deciding whether to enter) a task */
    atomic_int      n_sleeping;   /* workers asleep on cond, or about to be (under mutex) */
    atomic_int      stop;
    int             all;          /* the open task is an rm_pool_run one: every worker runs it */
    rm_task_fn      fn;
    void *          ctx;
};

typedef struct worker_arg {
    rm_pool * pool;
    int       ith;
} worker_arg;

int rm_cpu_count(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int) n : 1;
}

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return 1e9 * (double) t.tv_sec + (double) t.tv_nsec;
}

static void * worker_main(void * p) {
    worker_arg arg = *(worker_arg *) p;
    free(p);
    rm_pool * pool = arg.pool;
    unsigned seen = 0;   /* the generation at creation: a task posted before this thread ran is still seen */
    for (;;) {
        unsigned gen;
        int spins = 0;
        double spin_from = -1;
        while ((gen = atomic_load_explicit(&pool->generation, memory_order_acquire)) == seen &&
               !atomic_load(&pool->stop)) {
            RM_CPU_RELAX();
            if (++spins < RM_SPIN_CHECK) {
                continue;
            }
            spins = 0;
            const double t = now_ns();
            if (spin_from < 0) {
                spin_from = t;
            }
            if (t - spin_from < RM_SPIN_NS) {
                continue;
            }
            /* counted before the look (both seq_cst): a caller that posts after our look sees us
             * counted and broadcasts under the mutex, which we hold until we wait */
            pthread_mutex_lock(&pool->mutex);
            atomic_fetch_add(&pool->n_sleeping, 1);
            while (atomic_load(&pool->generation) == seen && !atomic_load(&pool->stop)) {
                pthread_cond_wait(&pool->cond, &pool->mutex);
            }
            atomic_fetch_sub(&pool->n_sleeping, 1);
            pthread_mutex_unlock(&pool->mutex);
            spin_from = -1;
        }
        if (atomic_load(&pool->stop)) {
            return NULL;
        }
        seen = gen;
        /* join, then look: the caller closes, then looks (both seq_cst), so either it sees us
         * inside and waits, or we see the task closed and stay out */
        atomic_fetch_add(&pool->n_active, 1);
        if (atomic_load(&pool->open_gen) == gen) {
            pool->fn(pool->ctx, arg.ith, pool->n_threads);
            if (pool->all) {
                atomic_fetch_sub_explicit(&pool->n_pending, 1, memory_order_release);
            }
        }
        atomic_fetch_sub_explicit(&pool->n_active, 1, memory_order_release);
    }
}

rm_pool * rm_pool_new(int n_threads) {
    if (n_threads <= 0) {
        n_threads = rm_cpu_count();
    }
    rm_pool * pool = calloc(1, sizeof(*pool));
    if (!pool) {
        return NULL;
    }
    pool->n_threads = n_threads;
    pthread_mutex_init(&pool->mutex, NULL);
    pthread_cond_init(&pool->cond, NULL);
    pool->threads = calloc((size_t) n_threads, sizeof(pthread_t));
    if (!pool->threads) {
        free(pool);
        return NULL;
    }
    for (int i = 1; i < n_threads; i++) {
        worker_arg * arg = malloc(sizeof(*arg));
        if (arg) {
            arg->pool = pool;
            arg->ith = i;
        }
        if (!arg || pthread_create(&pool->threads[i], NULL, worker_main, arg) != 0) {
            free(arg);
            pool->n_threads = i;   /* run with the threads we got */
            break;
        }
    }
    return pool;
}

void rm_pool_free(rm_pool * pool) {
    if (!pool) {
        return;
    }
    pthread_mutex_lock(&pool->mutex);
    atomic_store(&pool->stop, 1);
    pthread_cond_broadcast(&pool->cond);
    pthread_mutex_unlock(&pool->mutex);
    for (int i = 1; i < pool->n_threads; i++) {
        pthread_join(pool->threads[i], NULL);
    }
    pthread_mutex_destroy(&pool->mutex);
    pthread_cond_destroy(&pool->cond);
    free(pool->threads);
    free(pool);
}

int rm_pool_size(const rm_pool * pool) { return pool->n_threads; }

static void run(rm_pool * pool, rm_task_fn fn, void * ctx, int all) {
    if (pool->n_threads == 1) {
        fn(ctx, 0, 1);
        return;
    }
    pool->fn = fn;
    pool->ctx = ctx;
    pool->all = all;
    atomic_store(&pool->n_pending, pool->n_threads - 1);
    unsigned gen = atomic_load(&pool->generation) + 1;
    gen += gen == 0;                       /* 0 means closed */
    atomic_store(&pool->open_gen, gen);
    atomic_store(&pool->generation, gen);
    if (atomic_load(&pool->n_sleeping) > 0) {
        pthread_mutex_lock(&pool->mutex);
        pthread_cond_broadcast(&pool->cond);
        pthread_mutex_unlock(&pool->mutex);
    }
    fn(ctx, 0, pool->n_threads);
    while (all && atomic_load_explicit(&pool->n_pending, memory_order_acquire) > 0) {
        /* the workers are on their share; nothing else to do */
    }
    atomic_store(&pool->open_gen, 0);
    while (atomic_load(&pool->n_active) > 0) {
        /* a worker that joined in time finishes its part */
    }
}

void rm_pool_run(rm_pool * pool, rm_task_fn fn, void * ctx) { run(pool, fn, ctx, 1); }

void rm_pool_run_shared(rm_pool * pool, rm_task_fn fn, void * ctx) { run(pool, fn, ctx, 0); }
