/* cpu/repack.c - weights in the CPU kernels' stored layout (repack.h). */
#include "repack.h"
#include "gguf.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "status.h"
#include "dispatch.h"

/* One tensor's rows, converted by the pool's threads in chunks of REPACK_ROWS. */
typedef struct repack_job {
    const rm_weight * w;
    uint8_t *         out;
    int64_t           rows;
} repack_job;

#define REPACK_ROWS 64   /* a multiple of RM_TILE_ROWS: chunks of whole tiles */

static void repack_fn(void * p, int ith, int nth) {
    const repack_job * job = p;
    const rm_packed_kernels * pk = rm_cpu_stored(job->w->type, job->w->ne[0], job->w->ne[1]);
    const int64_t n_chunks = (job->rows + REPACK_ROWS - 1) / REPACK_ROWS;
    for (int64_t k = ith; k < n_chunks; k += nth) {   /* chunks of whole tiles: the matrices' rows are */
        const int64_t r1 = (k + 1) * REPACK_ROWS < job->rows ? (k + 1) * REPACK_ROWS : job->rows;
        rm_cpu_repack_rows(pk, job->w->ne[0], job->w->data, job->w->row_bytes, k * REPACK_ROWS, r1, job->out);
    }
}

static int wanted(const rm_weight * w) {
    if (!w->data || w->ne[1] <= 1) {
        return 0;
    }
    return rm_cpu_stored(w->type, w->ne[0], w->ne[1]) != NULL;   /* rows of one matrix (an expert's) */
}

/* Lists w (its whole data: all experts of a 3-D tensor) when it is wanted and not listed yet
 * (tied tensors share their data). */
static void consider(rm_dev_weights * r, const rm_weight ** src, const rm_weight * w) {
    for (int64_t j = 0; j < r->n_ranges; j++) {
        if (r->ranges[j].host == w->data) return;
    }
    if (!wanted(w)) return;
    const uint64_t bytes = (uint64_t) (w->ne[1] * (w->ne[2] > 0 ? w->ne[2] : 1)) * w->row_bytes;
    src[r->n_ranges] = w;
    r->ranges[r->n_ranges++] = (rm_dev_range) {w->data, bytes, NULL, r->bytes};
    r->bytes += (bytes + 63) / 64 * 64;
}

rm_dev_weights * rm_repack_model(const rm_model * m, rm_pool * pool, int * failed) {
    *failed = 0;
    const char * env = getenv("RAPIDMOE_REPACK");
    if (env && strcmp(env, "0") == 0) {
        return NULL;
    }
    /* every matrix the CPU multiplies by, once */
    const int64_t cap = (int64_t) m->hp.n_layer * 13 + 1;
    const rm_weight ** src = calloc((size_t) cap, sizeof(*src));   /* the tensor of each range */
    rm_dev_weights * r = calloc(1, sizeof(*r));
    if (!src || !r || !(r->ranges = calloc((size_t) cap, sizeof(rm_dev_range)))) {
        free(src);
        rm_repack_free(r);
        *failed = 1;
        rm_fail(RM_E_OOM, "rm_model_load: out of memory listing the weights to repack");
        return NULL;
    }
    consider(r, src, &m->output);
    for (int il = 0; il < m->hp.n_layer; il++) {
        const rm_layer * L = &m->layers[il];
        const rm_weight * ws[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->gate_shexp, &L->up_shexp, &L->down_shexp,
                                  &L->gate_exps, &L->up_exps, &L->down_exps, &L->gate_res, &L->up_res, &L->down_res};
        const size_t n_ws = m->xcache ? 7 : sizeof(ws) / sizeof(ws[0]);   /* streamed experts are read as stored */
        for (size_t k = 0; k < n_ws; k++) {
            consider(r, src, ws[k]);
        }
    }
    const int64_t n = r->n_ranges;
    uint8_t * arena = NULL;
    if (n == 0 || posix_memalign((void **) &arena, 2u << 20, (size_t) r->bytes) != 0) {
        *failed = n > 0;
        if (*failed) {
            rm_fail(RM_E_OOM, "rm_model_load: out of memory for %llu bytes of repacked weights",
                    (unsigned long long) r->bytes);
        }
        free(src);
        rm_repack_free(r);
        return NULL;
    }
#ifdef MADV_HUGEPAGE
    madvise(arena, (size_t) r->bytes, MADV_HUGEPAGE);
#endif
    rm_dev_weights_place(r, arena);
    for (int64_t j = 0; j < n; j++) {   /* tensor by tensor, so the file's copy of each leaves at once */
        repack_job job = {src[j], r->ranges[j].dev, (int64_t) (r->ranges[j].bytes / src[j]->row_bytes)};
        rm_pool_run(pool, repack_fn, &job);
        if (!rm_gguf_give_back(m->base, r->ranges[j].host, r->ranges[j].bytes) && m->residual) {
            rm_gguf_give_back(m->residual, r->ranges[j].host, r->ranges[j].bytes);   /* the file that holds them */
        }
    }
    free(src);
    rm_dev_weights_sort(r);
    return r;
}

void rm_repack_free(rm_dev_weights * r) {
    if (!r) {
        return;
    }
    free(r->arena);
    free(r->ranges);
    free(r);
}
