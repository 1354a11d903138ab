/* threads.h - a persistent pool of worker threads.
 *
 * Created once per model; running a task costs no allocation and no thread creation, so the
 * per-token path can dispatch every matrix product to all threads. */
#ifndef RM_THREADS_H
#define RM_THREADS_H

#include <stdint.h>

typedef struct rm_pool rm_pool;

/* fn(ctx, ith, nth) runs once on each of nth threads (the caller is thread 0). */
typedef void (*rm_task_fn)(void * ctx, int ith, int nth);

rm_pool * rm_pool_new(int n_threads);       /* NULL on failure; n_threads <= 0: online CPUs */
void      rm_pool_free(rm_pool * pool);
int       rm_pool_size(const rm_pool * pool);
void      rm_pool_run(rm_pool * pool, rm_task_fn fn, void * ctx);
/* For tasks that hand out their work from a shared counter, so that any subset of the threads
 * completes them: returns once the caller's own fn(ctx, 0, nth) has, and workers that have not
 * started by then skip the task. A core busy with other work then delays nothing. */
void      rm_pool_run_shared(rm_pool * pool, rm_task_fn fn, void * ctx);

/* The half-open share [*lo, *hi) of n items that thread ith of nth takes. */
static inline void rm_split(int64_t n, int ith, int nth, int64_t * lo, int64_t * hi) {
    int64_t per = (n + nth - 1) / nth;
    *lo = per * ith < n ? per * ith : n;
    *hi = *lo + per < n ? *lo + per : n;
}

int rm_cpu_count(void);

#endif
