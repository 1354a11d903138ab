/* gpu.cu - a model's device: probing it, the memory budget, and the weights copied once at load.
 *
 * What goes to the device: every matrix and vector the forward pass reads per token except the
 * token embeddings (rows are looked up on the host and only the rows travel), and the expert
 * bases the placement marks. Residuals stay in host memory. All of it goes into one arena
 * allocation, so the budget check is one comparison and the device holds no fragments. A matrix
 * of a type the kernels do not handle stays on the host (its products run there, only
 * activations cross). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <new>

#include "backend.cuh"
#include "matmul.cuh"

static void gib(char * buf, size_t cap, uint64_t b) { snprintf(buf, cap, "%.2f GiB", (double) b / (1u << 30)); }

void * rm_gpu_malloc(rm_gpu * g, uint64_t bytes, const char * what) {
    if (bytes == 0) {
        bytes = 1;
    }
    const uint64_t now = g->used.fetch_add(bytes);
    if (g->budget && now + bytes > g->budget) {
        g->used.fetch_sub(bytes);
        char want[32], used[32], cap[32];
        gib(want, sizeof(want), bytes);
        gib(used, sizeof(used), now);
        gib(cap, sizeof(cap), g->budget);
        rm_fail(RM_E_OOM, "%s: %s more device memory would exceed the budget (%s held of %s); lower n_ctx or "
                "n_batch, or keep more experts on the CPU (rapidmoe plan)", what, want, used, cap);
        return NULL;
    }
    void * p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
        g->used.fetch_sub(bytes);
        cudaGetLastError();
        char want[32];
        gib(want, sizeof(want), bytes);
        rm_fail(e == cudaErrorMemoryAllocation ? RM_E_OOM : RM_E_CUDA, "%s: cudaMalloc of %s on device %d (%s) failed: %s",
                what, want, g->device, g->name, cudaGetErrorString(e));
        return NULL;
    }
    return p;
}

void rm_gpu_free(rm_gpu * g, void * p, uint64_t bytes) {
    if (p) {
        cudaFree(p);
        g->used.fetch_sub(bytes ? bytes : 1);
    }
}

const uint8_t * rm_gpu_weight(const rm_gpu * g, const uint8_t * host) {
    int64_t lo = 0, hi = g->n_ranges;   /* the last range starting at or before host */
    while (lo < hi) {
        const int64_t mid = (lo + hi) / 2;
        if (g->ranges[mid].host <= host) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    if (lo == 0) {
        return NULL;
    }
    const rm_gpu_range * r = &g->ranges[lo - 1];
    return host < r->host + r->bytes ? r->dev + (host - r->host) : NULL;
}

/* ---- what to copy ------------------------------------------------------------------------- */

typedef struct upload_list {
    rm_gpu_range * r;
    int64_t        n, cap;
    uint64_t       bytes;
    int32_t        n_skipped;             /* matrices of types the kernels lack */
} upload_list;

static int push(upload_list * u, const uint8_t * host, uint64_t bytes) {
    if (!host || bytes == 0) {
        return 1;
    }
    if (u->n == u->cap) {
        const int64_t cap = u->cap ? 2 * u->cap : 256;
        rm_gpu_range * r = (rm_gpu_range *) realloc(u->r, sizeof(*r) * (size_t) cap);
        if (!r) {
            return 0;
        }
        u->r = r;
        u->cap = cap;
    }
    u->r[u->n++] = rm_gpu_range{host, bytes, NULL};
    return 1;
}

static uint64_t matrix_bytes(const rm_weight * w) { return w->row_bytes * (uint64_t) w->ne[1]; }

/* A dense tensor: vectors are always copied (the small ops need them), matrices if supported. */
static int push_dense(upload_list * u, const rm_weight * w) {
    if (!w->data) {
        return 1;
    }
    const int is_vector = w->ne[1] == 1 && w->type == RM_TYPE_F32;
    if (!is_vector && !rm_cu_matmul_supports(w->type, w->ne[0])) {
        u->n_skipped++;
        return 1;
    }
    return push(u, w->data, matrix_bytes(w) * (uint64_t) w->ne[2]);
}

static int collect(const rm_model * m, const uint8_t * on_gpu, upload_list * u) {
    const rm_hparams * hp = &m->hp;
    int ok = push_dense(u, &m->output_norm) && push_dense(u, &m->output);
    for (int il = 0; ok && il < hp->n_layer; il++) {
        const rm_layer * L = &m->layers[il];
        const rm_weight * dense[] = {&L->attn_norm, &L->wq, &L->wk, &L->wv, &L->bq, &L->bk, &L->bv, &L->q_norm,
                                     &L->k_norm, &L->wo, &L->ffn_norm, &L->router, &L->gate_shexp, &L->up_shexp,
                                     &L->down_shexp, &L->gate_inp_shexp};
        for (size_t k = 0; ok && k < sizeof(dense) / sizeof(dense[0]); k++) {
            ok = push_dense(u, dense[k]);
        }
        const rm_weight * exps[3] = {&L->gate_exps, &L->up_exps, &L->down_exps};
        const int types_ok = rm_cu_matmul_supports(exps[0]->type, exps[0]->ne[0]) &&
                             rm_cu_matmul_supports(exps[1]->type, exps[1]->ne[0]) &&
                             rm_cu_matmul_supports(exps[2]->type, exps[2]->ne[0]);
        for (int e = 0; ok && e < hp->n_expert; e++) {
            if (on_gpu && !on_gpu[(int64_t) il * hp->n_expert + e]) {
                continue;
            }
            if (!types_ok) {
                u->n_skipped++;
                continue;
            }
            for (int k = 0; ok && k < 3; k++) {
                ok = push(u, rm_weight_matrix(exps[k], e), matrix_bytes(exps[k]));
            }
        }
    }
    return ok;
}

static int by_host(const void * a, const void * b) {
    const uint8_t * x = ((const rm_gpu_range *) a)->host, * y = ((const rm_gpu_range *) b)->host;
    return x < y ? -1 : x > y;
}

/* ---- open / close ------------------------------------------------------------------------- */

static rm_status fail_cuda(rm_gpu * g, cudaError_t e, const char * what) {
    cudaGetLastError();
    return rm_fail(RM_E_CUDA, "rm_model_load: CUDA device %d (%s): %s: %s", g->device, g->name, what,
                   cudaGetErrorString(e));
}

static rm_status upload_weights(rm_gpu * g, const rm_model * m, const uint8_t * on_gpu) {
    upload_list u = {0};
    if (!collect(m, on_gpu, &u)) {
        free(u.r);
        return rm_fail(RM_E_OOM, "rm_model_load: out of host memory listing the weights for the GPU");
    }
    qsort(u.r, (size_t) u.n, sizeof(*u.r), by_host);
    int64_t n = 0;   /* one copy of a tensor listed twice (tied weights) */
    for (int64_t i = 0; i < u.n; i++) {
        if (n == 0 || u.r[i].host != u.r[n - 1].host) {
            u.r[n++] = u.r[i];
        }
    }
    for (int64_t i = 0; i < n; i++) {
        u.bytes += (u.r[i].bytes + 255) / 256 * 256;
    }
    g->ranges = u.r;
    g->n_ranges = n;
    g->n_skipped = u.n_skipped;
    g->arena = (uint8_t *) rm_gpu_malloc(g, u.bytes, "rm_model_load: the weights placed on the GPU");
    if (!g->arena) {
        return RM_E_OOM;
    }
    g->arena_bytes = u.bytes;
    uint64_t off = 0;
    for (int64_t i = 0; i < n; i++) {
        g->ranges[i].dev = g->arena + off;
        cudaError_t e = cudaMemcpy(g->ranges[i].dev, g->ranges[i].host, g->ranges[i].bytes, cudaMemcpyHostToDevice);
        if (e != cudaSuccess) {
            return fail_cuda(g, e, "copying the weights");
        }
        off += (g->ranges[i].bytes + 255) / 256 * 256;
    }
    /* the expert tables: which expert matrices the device holds */
    const int64_t n_tab = (int64_t) g->n_layer * 3 * g->n_expert;
    g->exp_tab_host = (const uint8_t **) calloc((size_t) n_tab, sizeof(uint8_t *));
    if (!g->exp_tab_host) {
        return rm_fail(RM_E_OOM, "rm_model_load: out of host memory");
    }
    for (int il = 0; il < g->n_layer; il++) {
        const rm_layer * L = &m->layers[il];
        const rm_weight * exps[3] = {&L->gate_exps, &L->up_exps, &L->down_exps};
        for (int e = 0; e < g->n_expert; e++) {
            int all = 1;
            for (int k = 0; k < 3; k++) {
                const uint8_t * d = rm_gpu_weight(g, rm_weight_matrix(exps[k], e));
                g->exp_tab_host[rm_gpu_tab_index(g, il, k, e)] = d;
                all &= d != NULL;
            }
            g->n_experts_on_gpu += all;
        }
    }
    g->exp_tab_dev = (const uint8_t **) rm_gpu_malloc(g, sizeof(uint8_t *) * (uint64_t) n_tab,
                                                      "rm_model_load: the expert tables");
    if (!g->exp_tab_dev) {
        return RM_E_OOM;
    }
    cudaError_t e = cudaMemcpy(g->exp_tab_dev, g->exp_tab_host, sizeof(uint8_t *) * (size_t) n_tab,
                               cudaMemcpyHostToDevice);
    return e == cudaSuccess ? RM_OK : fail_cuda(g, e, "copying the expert tables");
}

rm_status rm_gpu_open(const rm_model * m, const rm_model_params * p, rm_gpu ** out, char * note, size_t note_cap) {
    *out = NULL;
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        snprintf(note, note_cap, "a GPU was requested, but no CUDA device can be used (%s); running on the CPU",
                 e != cudaSuccess ? cudaGetErrorString(e) : "no device found");
        cudaGetLastError();
        return RM_OK;
    }
    if (p->gpu_device >= count) {
        return rm_fail(RM_E_CUDA, "rm_model_load: gpu_device %d does not exist (%d CUDA device%s)", p->gpu_device,
                       count, count == 1 ? "" : "s");
    }
    rm_gpu * g = new (std::nothrow) rm_gpu();
    if (!g) {
        return rm_fail(RM_E_OOM, "rm_model_load: out of memory");
    }
    g->device = p->gpu_device;
    g->budget = p->gpu_memory_bytes;
    g->used = 0;
    g->n_layer = m->hp.n_layer;
    g->n_expert = m->hp.n_expert;
    g->upload_min_tokens = p->residual_upload_min_tokens;
    cudaDeviceProp prop;
    if ((e = cudaSetDevice(g->device)) != cudaSuccess || (e = cudaGetDeviceProperties(&prop, g->device)) != cudaSuccess) {
        rm_status st = fail_cuda(g, e, "selecting the device");
        rm_gpu_close(g);
        return st;
    }
    snprintf(g->name, sizeof(g->name), "%s", prop.name);
    if (m->arch && m->hp.n_expert > 512) {
        rm_gpu_close(g);
        return rm_fail(RM_E_UNSUPPORTED_ARCH, "rm_model_load: the CUDA router handles at most 512 experts, the model has %d",
                       m->hp.n_expert);
    }
    rm_status st = upload_weights(g, m, p->expert_on_gpu);
    if (st != RM_OK) {
        rm_gpu_close(g);
        return st;
    }
    if (g->n_skipped) {
        snprintf(note, note_cap, "%d matrices (or experts) have ggml types the CUDA kernels lack; their products run "
                 "on the CPU", g->n_skipped);
    }
    *out = g;
    return RM_OK;
}

void rm_gpu_close(rm_gpu * g) {
    if (!g) {
        return;
    }
    if (g->arena) {
        rm_gpu_free(g, g->arena, g->arena_bytes);
    }
    if (g->exp_tab_dev) {
        rm_gpu_free(g, (void *) g->exp_tab_dev, sizeof(uint8_t *) * (uint64_t) g->n_layer * 3 * (uint64_t) g->n_expert);
    }
    free(g->exp_tab_host);
    free(g->ranges);
    delete g;
}

void rm_gpu_describe(const rm_gpu * g, rm_gpu_info * info) {
    info->device = g->device;
    snprintf(info->device_name, sizeof(info->device_name), "%s", g->name);
    info->weight_bytes = g->arena_bytes;
    info->used_bytes = g->used.load();
    info->n_experts_on_gpu = g->n_experts_on_gpu;
}
