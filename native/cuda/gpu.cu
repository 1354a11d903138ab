/* gpu.cu - a model's device: probing it, the memory budget, and the weights copied once at load.
 *
 * What goes to the device is listed by devweights.c (the dense weights and the placed expert
 * bases, in one arena). A matrix of a type the kernels do not handle stays on the host (its
 * products run there, only activations cross). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <new>

#include "backend.cuh"
#include "matmul.cuh"


void * rm_gpu_malloc(rm_gpu * g, uint64_t bytes, const char * what) {
    if (bytes == 0) {
        bytes = 1;
    }
    const uint64_t now = g->used.fetch_add(bytes);
    if (g->budget && now + bytes > g->budget) {
        g->used.fetch_sub(bytes);
        rm_dev_budget_error(what, bytes, now, g->budget);
        return NULL;
    }
    void * p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
        g->used.fetch_sub(bytes);
        cudaGetLastError();
        char want[32];
        rm_dev_format_bytes(want, sizeof(want), bytes);
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

const uint8_t * rm_gpu_weight(const rm_gpu * g, const uint8_t * host) { return rm_dev_weights_find(&g->weights, host); }

/* ---- open / close ------------------------------------------------------------------------- */

static rm_status fail_cuda(rm_gpu * g, cudaError_t e, const char * what) {
    cudaGetLastError();
    return rm_fail(RM_E_CUDA, "rm_model_load: CUDA device %d (%s): %s: %s", g->device, g->name, what,
                   cudaGetErrorString(e));
}

static int kernels_support(int32_t type, int64_t n_in) { return rm_cu_matmul_supports(type, n_in); }

static rm_status upload_weights(rm_gpu * g, const rm_model * m, const uint8_t * on_gpu) {
    rm_dev_weights * w = &g->weights;
    if (!rm_dev_weights_list(m, on_gpu, kernels_support, w)) {
        return rm_fail(RM_E_OOM, "rm_model_load: out of host memory listing the weights for the GPU");
    }
    g->arena = (uint8_t *) rm_gpu_malloc(g, w->bytes, "rm_model_load: the weights placed on the GPU");
    if (!g->arena) {
        return RM_E_OOM;
    }
    g->arena_bytes = w->bytes;
    rm_dev_weights_place(w, g->arena);
    for (int64_t i = 0; i < w->n_ranges; i++) {
        cudaError_t e = cudaMemcpy(w->ranges[i].dev, w->ranges[i].host, w->ranges[i].bytes, cudaMemcpyHostToDevice);
        if (e != cudaSuccess) {
            return fail_cuda(g, e, "copying the weights");
        }
    }
    /* the expert tables: which expert matrices the device holds */
    const int64_t n_tab = (int64_t) g->n_layer * 3 * g->n_expert;
    g->exp_tab_host = (const uint8_t **) calloc((size_t) n_tab, sizeof(uint8_t *));
    if (!g->exp_tab_host) {
        return rm_fail(RM_E_OOM, "rm_model_load: out of host memory");
    }
    g->n_experts_on_gpu = rm_dev_expert_table(w, m, g->exp_tab_host);
    g->exp_tab_dev = (const uint8_t **) rm_gpu_malloc(g, rm_device_expert_table_bytes(g->n_layer, g->n_expert),
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
    if (g->weights.n_skipped) {
        snprintf(note, note_cap, "%d matrices (or experts) have ggml types the CUDA kernels lack; their products run "
                 "on the CPU", g->weights.n_skipped);
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
        rm_gpu_free(g, (void *) g->exp_tab_dev, rm_device_expert_table_bytes(g->n_layer, g->n_expert));
    }
    free(g->exp_tab_host);
    rm_dev_weights_free(&g->weights);
    delete g;
}

void rm_gpu_describe(const rm_gpu * g, rm_gpu_info * info) {
    info->device = g->device;
    snprintf(info->device_name, sizeof(info->device_name), "%s", g->name);
    info->weight_bytes = g->arena_bytes;
    info->used_bytes = g->used.load();
    info->n_experts_on_gpu = g->n_experts_on_gpu;
}
