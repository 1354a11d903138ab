/* repack.c - weights in the CPU kernels' stored layout (repack.h). */
#include "repack.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cpu/dispatch.h"
#include "status.h"

typedef struct repack_job {
    const rm_weight * w;
    uint8_t *         out;
    int64_t           rows;
} repack_job;

typedef struct repack_task {
    repack_job * jobs;
    int64_t      n_jobs;
} repack_task;

#define REPACK_ROWS 64

static void repack_fn(void * p, int ith, int nth) {
    repack_task * t = p;
    for (int64_t j = 0; j < t->n_jobs; j++) {
        const repack_job * job = &t->jobs[j];
        const rm_packed_kernels * pk = rm_cpu_packed(job->w->type);
        const int64_t n_chunks = (job->rows + REPACK_ROWS - 1) / REPACK_ROWS;
        for (int64_t k = ith; k < n_chunks; k += nth) {
            const int64_t r1 = (k + 1) * REPACK_ROWS < job->rows ? (k + 1) * REPACK_ROWS : job->rows;
            for (int64_t r = k * REPACK_ROWS; r < r1; r++) {
                pk->repack_row(job->w->ne[0], job->w->data + (uint64_t) r * job->w->row_bytes,
                               job->out + (uint64_t) r * job->w->row_bytes);
            }
        }
    }
}

static int wanted(const rm_weight * w) {
    if (!w->data || w->ne[1] <= 1) {
        return 0;
    }
    const rm_packed_kernels * pk = rm_cpu_packed(w->type);
    return pk && pk->repack_row && w->ne[0] % (8 * RM_QK) == 0;
}

/* The file's pages of [p, p + bytes) are not needed any more: let the kernel drop them. */
static void release_pages(const uint8_t * p, uint64_t bytes) {
    const uintptr_t page = (uintptr_t) sysconf(_SC_PAGESIZE);
    const uintptr_t lo = ((uintptr_t) p + page - 1) / page * page, hi = ((uintptr_t) p + bytes) / page * page;
    if (hi > lo) {
        madvise((void *) lo, hi - lo, MADV_DONTNEED);
    }
}

rm_dev_weights * rm_repack_model(const rm_model * m, rm_pool * pool, int * failed) {
    *failed = 0;
    const char * env = getenv("RAPIDMOE_REPACK");
    if (env && strcmp(env, "0") == 0) {
        return NULL;
    }
    /* every matrix the CPU multiplies by, once (tied tensors share their data) */
    const int per_layer = 16;
    const int64_t cap = (int64_t) m->hp.n_layer * per_layer + 1;
    repack_job * jobs = calloc((size_t) cap, sizeof(*jobs));
    rm_dev_weights * r = calloc(1, sizeof(*r));
    if (!jobs || !r || !(r->ranges = calloc((size_t) cap, sizeof(rm_dev_range)))) {
        free(jobs);
        if (r) free(r->ranges);
        free(r);
        *failed = 1;
        rm_fail(RM_E_OOM, "rm_model_load: out of memory listing the weights to repack");
        return NULL;
    }
    int64_t n = 0;
    const rm_weight * cand[1 + 16];
    for (int il = -1; il < m->hp.n_layer; il++) {
        int nc = 0;
        if (il < 0) {
            cand[nc++] = &m->output;
        } else {
            const rm_layer * L = &m->layers[il];
            const rm_weight * ws[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->gate_shexp, &L->up_shexp, &L->down_shexp,
                                      &L->gate_exps, &L->up_exps, &L->down_exps, &L->gate_res, &L->up_res, &L->down_res};
            for (size_t k = 0; k < sizeof(ws) / sizeof(ws[0]); k++) cand[nc++] = ws[k];
        }
        for (int k = 0; k < nc; k++) {
            const rm_weight * w = cand[k];
            int seen = 0;
            for (int64_t j = 0; j < n && !seen; j++) seen = r->ranges[j].host == w->data;
            if (!wanted(w) || seen) continue;
            const int64_t rows = w->ne[1] * (w->ne[2] > 0 ? w->ne[2] : 1);
            jobs[n] = (repack_job) {w, NULL, rows};
            r->ranges[n] = (rm_dev_range) {w->data, (uint64_t) rows * w->row_bytes, NULL, r->bytes};
            r->bytes += ((uint64_t) rows * w->row_bytes + 63) / 64 * 64;
            n++;
        }
    }
    if (n == 0) {
        free(jobs);
        rm_repack_free(r);
        return NULL;
    }
    uint8_t * arena = NULL;
    if (posix_memalign((void **) &arena, 64, (size_t) r->bytes) != 0) {
        rm_fail(RM_E_OOM, "rm_model_load: out of memory for %llu bytes of repacked weights",
                (unsigned long long) r->bytes);
        free(jobs);
        rm_repack_free(r);
        *failed = 1;
        return NULL;
    }
    r->n_ranges = n;
    for (int64_t j = 0; j < n; j++) {
        r->ranges[j].dev = arena + r->ranges[j].offset;
        jobs[j].out = r->ranges[j].dev;
    }
    for (int64_t j = 0; j < n; j++) {   /* tensor by tensor, so the file's copy of each leaves at once */
        repack_task t = {jobs + j, 1};
        rm_pool_run(pool, repack_fn, &t);
        release_pages(r->ranges[j].host, r->ranges[j].bytes);
    }
    free(jobs);
    /* sorted by file address, for rm_dev_weights_find; the arena starts at the lowest offset */
    for (int64_t a = 1; a < n; a++) {
        for (int64_t b = a; b > 0 && r->ranges[b - 1].host > r->ranges[b].host; b--) {
            const rm_dev_range tmp = r->ranges[b];
            r->ranges[b] = r->ranges[b - 1];
            r->ranges[b - 1] = tmp;
        }
    }
    return r;
}

void rm_repack_free(rm_dev_weights * r) {
    if (!r) {
        return;
    }
    uint8_t * arena = NULL;
    for (int64_t j = 0; j < r->n_ranges; j++) {
        if (r->ranges[j].offset == 0) arena = r->ranges[j].dev;
    }
    free(arena);
    free(r->ranges);
    free(r);
}
